"""Interleaved A/B timing of an op's kernels, with statistics and the roofline.

- child.py    the timing harness, a sandbox entry (runs with candidate code; returns raw per-repetition times)
- stats.py    medians, paired speedups and bootstrap intervals (trusted side)
- roofline.py device peaks and the physics floor (shared with the ranker)
- measure.py  one sandboxed job per candidate, judged: accepted iff the weighted speedup's lower bound clears the
              policy and nothing is implausible
- command.py  `autokernel bench`
"""
