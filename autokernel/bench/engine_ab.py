"""The engine's tokens/s with and without a kernel: an interleaved A/B of whole engines, for the PR body (issue 23).

The kernel bench (autokernel/bench/rounds.py) says how much faster the op is; this says what the engine does with
it. Same design, at the engine's scale: each ARM (the incumbent kernels/<op>.py, or the candidate in its place) runs
in a fresh sandboxed process of its own (autokernel/bench/engine_ab_job.py, the engine loaded as the end-to-end
stage's job loads it: one file swapped into the op's slot, nothing of the candidate ever in this process), one job
per arm per ROUND, the arms' order alternating A B / B A over rounds (A,B,B,A,A,B,...). On CPU a round's two jobs
run over the same seconds in lockstep turns (autokernel/bench/lockstep.py: contention falls on both alike); on CUDA
one after the other. Each job runs a fixed short workload (a prefill of PROMPT_TOKENS tokens of the policy's first
e2e prompt, then DECODE_STEPS greedy steps) and returns per-forward times on clocks bound before the kernel file
was imported; the figures are checked and every statistic is computed here: per arm, decode tokens/s (median over
rounds, bootstrap interval), and the candidate's speedup paired by round (autokernel/bench/stats.py, as the kernel
bench's intervals).

What the figures are: on CPU, Triton-interpreter CPU time of an engine whose every other op runs its torch reference
(as in the end-to-end stage: autokernel/gate/e2e.py backend), so the speedup is the interpreter's, never a GPU
speedup; on CUDA the engine with the checkout's kernels, synchronized wall time.

It runs only where it fits: before the first job, `cost_s` (the jobs' start and load, measured, plus the forwards at
the op's profiled interpreter time) against the Deadline; after round 0, that round's real time times the rounds.
Either falling short, or a job failing, gives NotMeasured with the reason, which the PR body prints as is.

What a candidate could do to these figures from inside its own arm (introspect the job's harness, past the static
gate's ban list) only flatters its own arm, never slows the incumbent's: the arms never share a process, and a
job's other processes are refused (autokernel/bench/watch.py). The figures inform a reviewer; no verdict rests on
them (the kernel bench decided the win).
"""
from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from autokernel import device as device_mod
from autokernel import sandbox
from autokernel.bench import engine_ab_job, lockstep, toolchain
from autokernel.bench.results import CPU_LABEL
from autokernel.bench.stats import Interval, median_ci, paired_speedup
from autokernel.deadline import Deadline
from autokernel.policy import Policy
from autokernel.untrusted import line

PROMPT_TOKENS = 16  # the prefill; short: under the interpreter a forward costs ~0.1-0.3 s plus the op's calls
DECODE_STEPS = 8  # timed greedy steps: the tokens of "tokens/s"
ARMS = ("incumbent", "candidate")
# One engine job's cost outside the op's calls: its start (python, torch and triton imported, the GGUF loaded, the
# sandbox set up) and a reference forward around the op. Measured here (2 loaded cores, 2026-12-05, rmsnorm and
# add_rmsnorm arms, 2 rounds each): 3.5-4 s a job with its 11 forwards, 0.06 s a B=1 reference forward; the e2e
# baselines' batched steps took 0.06-0.56 s. Taken at about twice that: the prediction only decides whether to start.
JOB_START_S = {"cpu": 6.0, "cuda": 20.0}  # CUDA: not measured (no GPU here); round 0's real time then decides
REFERENCE_FORWARD_S = {"cpu": 0.15, "cuda": 0.0}
# Checked against the first real CPU nightlies (6 rounds): attention_decode predicted 224 s, took ~120 s; rmsnorm
# predicted 92 s, took 35 s.


@dataclass
class EngineAB:
    """A finished A/B: figures per arm (incumbent first) and the candidate's paired speedup."""
    op: str
    label: str  # CPU_LABEL or "CUDA <gpu>": printed beside every figure
    rounds: int
    prompt_tokens: int
    decode_steps: int
    tokens_per_s: list[Interval]  # decode tokens/s per arm, median over rounds
    speedup: Interval  # candidate decode tokens/s / incumbent's, paired by round
    prefill_speedup: Interval  # the same for the prefill's time
    same_tokens: bool  # both arms generated the same greedy tokens in every round
    confidence: float
    op_calls: dict = field(default_factory=dict)  # the op's calls in a prefill and in one decode step
    jobs: list[dict] = field(default_factory=list)  # in the order they ran: round, arm, turn, process, ...
    elapsed_s: float = 0.0


@dataclass
class NotMeasured:
    why: str  # one line: what the PR body says instead of figures


def per_forward_s(trace: dict | None, op: str) -> float:
    """The op's interpreter seconds per engine forward in the profile: its calls per forward (lm_head's calls count
    the forwards, as autokernel/run.py fits does) times its typical call (the call-weighted median of its shapes'
    mean times: the decode steps' calls, which outnumber the prefill's). 0 without a profile: round 0 decides.
    Measured against the profile of 2026-12-05 (/tmp/q1): add_rmsnorm 0.41 s predicted, 0.20 s a B=1 decode step."""
    ops = (trace or {}).get("ops") or {}
    forwards = max(1, int((ops.get("lm_head") or {}).get("calls", 1)))
    shapes = sorted(((float(s.get("mean_ms", 0.0)), int(s.get("calls", 0))) for s in (ops.get(op) or {}).get(
        "shapes") or []), key=lambda x: x[0])
    total = sum(n for _, n in shapes)
    if not total:
        return 0.0
    seen, typical = 0, shapes[-1][0]
    for ms, n in shapes:
        seen += n
        if 2 * seen >= total:
            typical = ms
            break
    return total / forwards * typical / 1e3


def cost_s(rounds: int, op_forward_s: float, decode_steps: int = DECODE_STEPS, kind: str = "cpu") -> float:
    """Predicted seconds of the whole A/B: 2 jobs a round, each its start plus 3 + decode_steps forwards (a warm-up
    prefill and step, the timed prefill and steps)."""
    forwards = 3 + decode_steps
    return rounds * 2 * (JOB_START_S[kind] + forwards * (REFERENCE_FORWARD_S[kind] + op_forward_s))


def measure(op: str, incumbent: Path, candidate: bytes, policy: Policy, job_root: Path, *, kernels_dir: Path,
            deadline: Deadline = Deadline.none(), trace: dict | None = None, rounds: int | None = None,
            weights: str | None = None, prompt_tokens: int = PROMPT_TOKENS,
            decode_steps: int = DECODE_STEPS) -> EngineAB | NotMeasured:
    """The A/B of the engine with `incumbent` (the checkout's kernels/<op>.py) and with `candidate` (bytes) in the
    op's slot, within `deadline`; NotMeasured with the reason where it does not fit, a job fails or the engine never
    calls the op. `rounds`: default bench.rounds. `trace`: the run's profile (sizes the prediction). `weights`: as
    the gate's end-to-end stage ran the engine (default target.weights; "dequant" where the quantized model never
    calls the op: matmul, embedding)."""
    from autokernel.gate import e2e
    kind = "cuda" if device_mod.is_cuda() else "cpu"
    rounds = rounds or policy.bench.rounds
    need, left = cost_s(rounds, per_forward_s(trace, op), decode_steps, kind), deadline.left()
    if need > left:
        return NotMeasured(f"not enough budget left: needs ~{need:.0f} s ({rounds} rounds of 2 fresh engine "
                           f"processes), {left:.0f} s left of agent.max_wall_s {policy.agent.max_wall_s:g}")
    sources = {"incumbent": Path(incumbent).read_bytes(), "candidate": bytes(candidate)}
    others = e2e._others(kernels_dir, skip=op)
    weights = weights or policy.target.weights
    payload = {"op": op, "model": policy.target.model, "backend": e2e.backend(), "weights": weights,
               "prompt_text": policy.e2e.prompts[0], "prompt_tokens": prompt_tokens, "decode_steps": decode_steps,
               **({"others": others} if others else {})}
    ro_paths = ([Path(kernels_dir).resolve()] if others else []) + (
        [Path(policy.target.model).resolve()] if policy.target.model else [])
    root = Path(job_root) / (time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3))
    figures: dict[str, list[dict]] = {a: [] for a in ARMS}
    jobs: list[dict] = []
    t0 = time.monotonic()
    for r in range(rounds):
        order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))  # A B, B A, A B, ...
        limits = policy.sandbox.model_copy(update={"timeout_s": max(0.001, min(policy.sandbox.timeout_s,
                                                                                 deadline.left()))})
        dirs = [root / f"round{r:02d}-{k}-{arm}" for k, arm in enumerate(order)]
        running = [_job(op, payload, sources[arm], limits, ro_paths, d) for arm, d in zip(order, dirs)]
        if kind == "cpu":
            lockstep.run_lockstep(running)
        else:
            for j in running:
                lockstep.run_alone(j)
        for k, (arm, j) in enumerate(zip(order, running)):
            got, why = _checked(j, payload, kind)
            if why:
                return NotMeasured(f"the {arm}'s engine job failed in round {r}: {why}")
            if not any(got["op_calls"].values()):
                return NotMeasured(f"the engine ({weights} weights) never called {op}: there is nothing to compare")
            figures[arm].append(got)
            jobs.append({"round": r, "arm": arm, "turn": k, "process": got["process"], "job_dir": str(dirs[k]),
                         "wall_s": round(j.stats.wall_s, 2), "cpu_s": round(j.stats.cpu_s, 2),
                         "isolation": got["isolation"]})
        spent = time.monotonic() - t0
        if r == 0 and spent * (rounds - 1) > deadline.left():
            return NotMeasured(f"not enough budget left: round 0 took {spent:.0f} s, so {rounds} rounds need "
                               f"~{spent * rounds:.0f} s; {deadline.left():.0f} s were left")
    processes = [j["process"] for j in jobs]
    if len(set(processes)) != len(processes):  # a fresh process per job is the design; a reused one is no A/B
        return NotMeasured("two engine jobs reported the same process: the arms did not each run in a fresh one")
    return _decide(op, figures, jobs, rounds, prompt_tokens, decode_steps, policy.bench.confidence, kind,
                   time.monotonic() - t0)


def _job(op: str, payload: dict, source: bytes, limits, ro_paths: list[Path], job_dir: Path) -> lockstep.Job:
    """One arm's sandboxed job (not started): the file under the op's own name, whichever arm it is."""
    env = {} if device_mod.is_cuda() else {"OMP_NUM_THREADS": "1"}  # as the kernel bench's CPU jobs (rounds.JOB_ENV)
    return lockstep.Job(lambda: sandbox.run(engine_ab_job.run, payload, job_dir, limits, ro_paths=ro_paths,
                                            inputs={f"{op}.py": source}, env=env))


def _series(x, n: int) -> list[float] | None:
    """x if it is n finite non-negative floats, else None."""
    ok = isinstance(x, list) and len(x) == n and all(type(t) is float and math.isfinite(t) and t >= 0 for t in x)
    return x if ok else None


def _checked(job, payload: dict, kind: str) -> tuple[dict, str]:
    """The job's figures on the verdict's clock ({"process", "isolation", "prompt", "op_calls", "tokens", "prefill_s",
    "decode_s"}), or why it has none. Everything the job returned is untrusted: types and counts checked here."""
    if job.error is not None:
        return {}, f"{type(job.error).__name__}: {line(job.error, 200)}"
    res = job.result
    if not res.ok:
        return {}, f"{res.reason}: {line(res.detail, 200)}"
    extra = toolchain.untrusted(job.stats.procs, toolchain.may_fork(res.isolation, cuda=kind == "cuda"))
    if extra:
        return {}, f"other processes ran in the job: {', '.join(extra[:4])}"
    d, n = res.data, int(payload["decode_steps"])
    clock = "wall_ms" if kind == "cuda" else "cpu_ms"
    steps = d.get("steps") if isinstance(d, dict) else None
    if not isinstance(d, dict) or d.get("device") != kind or not isinstance(d.get("process"), str):
        return {}, "the job returned malformed data"
    pre = _series([d["prefill"].get(clock)] if isinstance(d.get("prefill"), dict) else None, 1)
    dec = _series([s.get(clock) if isinstance(s, dict) else None for s in steps] if isinstance(steps, list) else None,
                  n)
    tokens, prompt = d.get("tokens"), d.get("prompt")
    if pre is None or dec is None or not isinstance(tokens, list) or len(tokens) != n \
            or not all(type(t) is int for t in tokens) or not isinstance(prompt, list) \
            or len(prompt) != payload["prompt_tokens"] or not all(type(t) is int for t in prompt):
        return {}, f"the job returned no valid {clock} for its prefill and each of {n} decode steps"
    calls = d.get("op_calls")
    if not isinstance(calls, dict) or set(calls) != {"prefill", "decode"} or \
            not all(type(k) is int and k >= 0 for k in calls.values()):
        return {}, "the job returned no count of the op's calls per phase"
    return {"process": d["process"], "isolation": res.isolation, "prompt": prompt, "op_calls": calls,
            "tokens": tokens, "prefill_s": pre[0] / 1e3,
            "decode_s": max(sum(dec) / 1e3, 1e-9)}, ""


def _decide(op: str, figures: dict[str, list[dict]], jobs: list[dict], rounds: int, prompt_tokens: int,
            decode_steps: int, confidence: float, kind: str, elapsed_s: float) -> EngineAB | NotMeasured:
    inc, cand = figures["incumbent"], figures["candidate"]
    if any(f["prompt"] != inc[0]["prompt"] for f in inc + cand):
        return NotMeasured("the arms' engines did not run the same prompt tokens")
    tps = [median_ci([decode_steps / f["decode_s"] for f in figures[a]], confidence) for a in ARMS]
    speedup = paired_speedup([f["decode_s"] for f in inc], [f["decode_s"] for f in cand], confidence)
    prefill = paired_speedup([f["prefill_s"] for f in inc], [f["prefill_s"] for f in cand], confidence)
    fp = device_mod.fingerprint()
    label = CPU_LABEL if kind == "cpu" else f"CUDA {fp.get('gpu', '')}".strip()
    same = all(a["tokens"] == b["tokens"] for a, b in zip(inc, cand))
    return EngineAB(op, label, rounds, prompt_tokens, decode_steps, tps, speedup, prefill, same, confidence,
                    dict(inc[0]["op_calls"]), jobs, round(elapsed_s, 1))


def interleaved(jobs: list[dict]) -> bool:
    """Whether `jobs` (EngineAB.jobs) ran as A B, B A, ... with every job its own process."""
    want = [arm for r in range(len(jobs) // 2) for arm in (ARMS if r % 2 == 0 else ARMS[::-1])]
    return [j["arm"] for j in jobs] == want and len({j["process"] for j in jobs}) == len(jobs)

