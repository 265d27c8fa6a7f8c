"""A/B timing of an op's kernels, with statistics and the roofline.

- job.py      the timing harness, a sandbox entry: loads ONE kernel file in a fresh process and returns raw
              per-call times and a random sample of its timed outputs
- rounds.py   rounds of such jobs (every file in its own process, A/B order alternating), each job's data judged
              in the parent: outputs against references it computes itself, processes seen, counts
- watch.py    what the parent sees of a running job from outside: its processes, CPU time and wall time
- stats.py    medians, paired speedups and bootstrap intervals (trusted side)
- roofline.py device peaks and the physics floor (shared with the ranker)
- results.py  the result types and the decision (`decide`): accepted iff the weighted speedup's lower bound
              clears the policy and nothing is implausible
- measure.py  `measure`: the rounds, decided by results.decide (and the result types, re-exported); `check_inputs`
              and `refusals` (the gate's static stage first: a refused file is never timed)
- show.py     the table and the refusals as `autokernel bench` (autokernel/cli/bench.py) prints them
"""
