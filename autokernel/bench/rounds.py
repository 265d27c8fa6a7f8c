"""A/B rounds of fresh processes: how the benchmark times files that must never share a process.

Design (issue "The sandbox and the trusted parent", benchmark rigging): every timing of a file is its own sandboxed
job (autokernel.bench.job) that loads that one file and nothing else. A ROUND runs one job per file, never two at
the same moment (they would share the device being measured): on CUDA one after another, on CPU all started
together and given turns of a quarter second by the parent, every other job of the round stopped meanwhile
(autokernel.bench.lockstep: contention from other work on the machine then falls on every file alike). The order
alternates A B / B A (ABBA over rounds; rotated when there are several candidates); each job times every shape
`reps` times on inputs drawn from the round's seed, the same for every file of the round. The incumbent's figures
therefore always come
from a process no candidate was ever loaded in: a candidate can neither wrap, patch nor slow the incumbent's kernel,
nor damage its outputs (the bench would then blame the incumbent and end an agent session).

Why rounds of short jobs rather than two long-lived processes stepped alternately: a process carries its own
systematic offset (address-space layout, allocator state, which core it landed on, the interpreter's caches), and
with one process per side that offset is a bias no number of repetitions inside it can reveal: an identical copy can
come out "3% faster" with a tight interval. Taking the ROUND as the unit of replication puts the between-process
variation into the interval. Per round and shape, each file's figure is the median of its repetitions; the paired
statistic is the round's log-ratio (incumbent / candidate) and stats.py's bootstrap and order-statistic intervals
run over rounds. policies.yaml `bench.rounds` (>= 6, the least for which a 95% order-statistic interval of a
median exists) rounds always run; more run, in pairs, while the standard error of every candidate's weighted
log-speedup is above `bench.rse_target` and another pair is expected to end within `bench.max_time_s`. Stopping
on precision, never on the verdict: stopping once the interval happens to clear the bar would inflate false wins.
The cost is one process start per file per round (~2-6 s on 2 loaded CPU cores, most of it `import torch`).

Which clock (the parent decides, from the device it knows; job.py explains the clocks): on CPU the process's CPU
time of each call (`cpu_ms`, labelled "Triton-interpreter CPU time"), so that other work on the machine mostly
drops out; on CUDA, CUDA events (`event_ms`). The wall clock is recorded beside it for the wait check
(autokernel.bench.measure). CPU jobs run with OMP_NUM_THREADS=1: extra threads could not lower a CPU time anyway,
and idle OpenMP workers spin, which would add noise to whichever call they follow.

Repetitions per job: round 0 times every shape FIRST_REPS times and so measures what a repetition (every shape
once) costs each file; later rounds time enough repetitions that the fastest file's timed calls add up to
`bench.job_time_s` on the verdict clock, as far as the slowest file's job stays within JOB_TIME_CAP times that.
A round's per-shape figure is a median over those repetitions: a tight figure per job, so that the interval over
rounds is not dominated by the jitter within a job.

Judged here, never in a job: every output the job returns (a random sample of its timed calls, chosen after each
call) is compared with the reference the PARENT computes from inputs it re-creates from its own seed, by the gate's
own comparison (autokernel.ops.tolerance.compare_outputs: a timed output the gate would reject is `bench.mismatch`);
counts, case indices and repetitions are checked against what was asked; a job's own failure can only reject its
file. While a job runs, autokernel.bench.watch records every other process in it (`bench.tampered`) and its CPU and
wall time.
"""
from __future__ import annotations

import math
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from autokernel import device as device_mod
from autokernel import harness, sandbox
from autokernel.bench import job, lockstep, roofline, toolchain
from autokernel.bench.results import CPU_LABEL, IncumbentFailed, Measurement, decide
from autokernel.bench.stats import rse_of_median, se_of_weighted_log_ratio
from autokernel.ops import get
from autokernel.ops.tolerance import References, compare_outputs, references
from autokernel.policy import Policy
from autokernel.untrusted import line

ENTRY = job.time_file
FIRST_REPS = 3  # repetitions per shape in round 0, which also measures what a repetition costs
MIN_REPS = 3
MAX_REPS = {"cuda": 2000, "cpu": 300}
JOB_TIME_CAP = 3.0  # the slowest file's timed calls per job: at most this many times bench.job_time_s
MAX_ROUNDS = 40
CLOCK = {"cuda": "event_ms", "cpu": "cpu_ms"}  # the verdict's clock per device; "wall_ms" is always recorded too
CLOCK_LABEL = {"cuda": "CUDA events", "cpu": "Triton-interpreter CPU time (process CPU time, all threads)"}
JOB_ENV = {"cuda": {}, "cpu": {"OMP_NUM_THREADS": "1"}}
CHILD_REASONS = ("bench.error", "bench.tampered")  # what a job may say about its own file


@dataclass
class Timed:
    """One file across rounds: per shape, one figure per round (the median of that round's repetitions)."""
    path: Path
    role: str  # "incumbent" | "candidate"
    source: bytes
    status: str = "ok"
    detail: str = ""
    times: list[list[float]] = field(default_factory=list)  # [shape][round] ms, the verdict's clock
    wall: list[list[float]] = field(default_factory=list)  # [shape][round] ms, the wall clock around the same calls
    jobs: list[dict] = field(default_factory=list)


class Round:
    """What the parent knows about one round: its seed, repetitions and the references it computed (shared by files)."""

    def __init__(self, spec, cases: list[dict], seed: int, reps: int, clock: str = CLOCK["cpu"]):
        self.spec, self.cases, self.seed, self.reps, self.clock = spec, cases, seed, reps, clock
        self._pools: dict[int, list[dict]] = {}
        self._refs: dict[tuple[int, int], References] = {}

    def spec_of(self, ci: int):
        """Case ci's OpSpec: a target op with several launchers has one per launcher (spec.extra["launchers"], by
        name; autokernel/target/bench.py), each case's shape naming its launcher; else the op's."""
        by = self.spec.extra.get("launchers")
        return by[self.cases[ci]["shape"]["launcher"]] if by else self.spec

    def pool(self, ci: int) -> list[dict]:
        if ci not in self._pools:
            self._pools[ci] = job.pool(self.spec_of(ci), self.cases[ci], self.seed, ci)
        return self._pools[ci]

    def reference(self, ci: int, rep: int) -> References:
        if (ci, rep) not in self._refs:
            self._refs[(ci, rep)] = references(self.spec_of(ci), job.values(self.pool(ci), self.seed, ci, rep))
        return self._refs[(ci, rep)]

    def target_inputs(self) -> dict[str, list[dict]]:
        """A target's jobs get the round's input sets as files (job.POOL_FILE): its generator lives in the parent."""
        return {job.POOL_FILE.format(ci): self.pool(ci) for ci in range(len(self.cases))}

    def prepare(self, datas: list) -> None:
        """A target's reference runs in a sandboxed job of its own (autokernel/target/contract.py, ReferenceTable):
        one job per round, on the value sets of every output the round's jobs kept, before any is judged (with
        several launchers, one per launcher, each on its own cases' sets). What a job sent is read only for (case,
        repetition) pairs in range, at most job.KEEP per case; check() judges the rest."""
        if self.spec.extra.get("prepare") is None:
            return
        want: set[tuple[int, int]] = set()
        for data in datas:
            cases = data.get("cases") if isinstance(data, dict) and data.get("failure") is None else None
            for ci, case in enumerate(cases[:len(self.cases)] if isinstance(cases, list) else []):
                kept = case.get("kept") if isinstance(case, dict) else None
                for item in kept[:job.KEEP] if isinstance(kept, list) else []:
                    rep = item.get("rep") if isinstance(item, dict) else None
                    if type(rep) is int and 0 <= rep < self.reps:
                        want.add((ci, rep))
        by: dict[int, tuple] = {}  # id(spec) -> (its prepare, its value sets)
        for ci, rep in sorted(want):
            spec = self.spec_of(ci)
            sets = by.setdefault(id(spec), (spec.extra["prepare"], []))[1]
            sets.append(job.values(self.pool(ci), self.seed, ci, rep))
        for prepare, sets in by.values():
            prepare(sets)


def _series(case, key: str, n: int) -> list[float] | None:
    """The job's `n` readings of clock `key` for one shape, or None unless they are n finite non-negative floats."""
    x = case.get(key) if isinstance(case, dict) else None
    ok = isinstance(x, list) and len(x) == n and all(type(t) is float and math.isfinite(t) and t >= 0 for t in x)
    return x if ok else None


def check(rnd: Round, data) -> tuple[str, str, list[float], list[float]]:
    """(status, detail, per-shape median ms on the round's clock, per-shape median wall ms) of one job's raw data,
    judged here."""
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list) or len(data["cases"]) != len(rnd.cases):
        return "bench.error", "the job returned malformed data", [], []
    failure = data.get("failure")
    if failure is not None:  # harness.FailureRecord; the job's word can only reject its own file
        if not isinstance(failure, dict):
            return "bench.error", "the job returned a malformed failure", [], []
        reason: str = failure["reason"] if failure.get("reason") in CHILD_REASONS else "bench.error"
        return reason, line(failure.get("detail", ""), 300), [], []
    meds, wall = [], []
    for ci, case in enumerate(data["cases"]):
        where = f"shape {rnd.cases[ci]['shape']}"
        times, walls = _series(case, rnd.clock, rnd.reps), _series(case, "wall_ms", rnd.reps)
        if times is None or walls is None:
            return "bench.error", f"{where}: the job returned no valid time for each of {rnd.reps} calls", [], []
        why = _check_outputs(rnd, ci, case.get("kept"))
        if why:
            return "bench.mismatch", f"{where}: {why}", [], []
        meds.append(float(np.median(times)))
        wall.append(float(np.median(walls)))
    return "ok", "", meds, wall


def _check_outputs(rnd: Round, ci: int, kept) -> str:
    """Why the kept outputs of shape `ci` are not those of a correct kernel ('' if they are)."""
    want = min(rnd.reps, job.KEEP)
    if not isinstance(kept, list) or len(kept) != want:
        return f"returned {len(kept) if isinstance(kept, list) else 'no'} outputs of timed calls, expected {want}"
    reps = set()
    for item in kept:
        if not isinstance(item, dict):
            return "the job returned malformed outputs"
        rep, outs = item.get("rep"), item.get("outputs")
        if item.get("case") != ci or type(rep) is not int or not 0 <= rep < rnd.reps or rep in reps \
                or not isinstance(outs, list):
            return "the job returned malformed outputs"
        reps.add(rep)
        refs = rnd.reference(ci, rep)
        # the gate's comparison: no output passes here that the gate rejects
        j = compare_outputs(outs, refs.ref64, refs.eager, None, refs.floors, refs.any_layout, refs.declared,
                            refs.elementwise)
        if j.reason == "numeric.bad_output":
            return f"repetition {rep}: {j.detail}"
        if not j.ok:
            return f"output of timed call {rep} differs from the reference: {j.detail}"
    return ""


def _job(op: str, f: Timed, rnd: Round, r: int, k: int, policy: Policy,
         root: Path) -> lockstep.Job[sandbox.SandboxResult]:
    """The sandboxed job of file f in round r, k-th in the round's order; not started yet."""
    payload: harness.BenchPayload = {"op": op, "cases": [{"shape": c["shape"], "dtype": c["dtype"]} for c in rnd.cases],
                                     "seed": rnd.seed, "reps": rnd.reps}
    if rnd.spec.extra.get("launchers"):  # a target op with several launchers: each case is called through its own
        for ci, c in enumerate(payload["cases"]):
            mine = rnd.spec_of(ci).extra["target"]
            c.update(launcher=mine["launcher"], outputs=mine["outputs"], inplace=mine.get("inplace") or [])
    name = f"round{r:02d}-{k}-{f.role}{'' if f.role == 'incumbent' else f.path.stem}-{secrets.token_hex(2)}"
    job_dir = root / name
    env = {**toolchain.cuda_env(), **JOB_ENV["cuda"]} if rnd.clock == CLOCK["cuda"] else JOB_ENV["cpu"]
    inputs: dict = {f"{op}.py": f.source}
    more: dict = {}
    target = rnd.spec.extra.get("target")
    if target is not None:  # a target checkout's file: under its module's name, the checkout on the job's path
        payload["target"] = {"module": target["module"], "launcher": target["launcher"], "outputs": target["outputs"],
                             "written": target["written"],
                             "inplace": target.get("inplace") or [], "preload": target["preload"]}
        inputs = {Path(target["file"]).name: f.source, **rnd.target_inputs()}
        more = {"pythonpath": [Path(target["root"])]}
    return lockstep.Job(lambda: sandbox.run(ENTRY, payload, job_dir, policy.sandbox, inputs=inputs, env=env, **more),
                        job_dir)


def _record(f: Timed, rnd: Round, r: int, job: lockstep.Job[sandbox.SandboxResult]) -> None:
    """Records the figures of a finished job on f, or its failure (IncumbentFailed: the incumbent's own job)."""
    if job.error is not None:
        raise job.error
    res, s = job.result, job.stats
    assert res is not None  # the job ended without raising: sandbox.run returned its result
    share = job.running_share
    f.jobs.append({"round": r, "job_dir": str(job.job_dir), "reps": rnd.reps, "wall_s": round(s.wall_s, 3),
                   "cpu_s": round(s.cpu_s, 3), "running_share": round(share, 3), "processes_seen": s.max_processes,
                   "extra_processes": s.extra, "isolation": res.isolation})
    extra = toolchain.untrusted(s.procs, toolchain.may_fork(res.isolation, cuda=rnd.clock == CLOCK["cuda"]))
    if not res.ok:
        status, detail = res.reason or "sandbox.error", line(res.detail, 300)
    elif extra:
        status, detail = "bench.tampered", f"other processes ran in the job while it was timed: {', '.join(extra[:4])}"
    else:
        status, detail, meds, wall = check(rnd, res.data)
        if status == "ok":
            for ci, (m, h) in enumerate(zip(meds, wall)):
                f.times[ci].append(m)
                f.wall[ci].append(h * share)  # the wall time it was not stopped for another job's turn, pro rata
            return
    if f.role == "incumbent":
        raise IncumbentFailed(f"{f.path} could not be timed (round {r}): {status}: {detail}")
    f.status, f.detail = status, f"{detail} (round {r})"


def _run_round(op: str, files: list[Timed], rnd: Round, r: int, policy: Policy, root: Path, device: str) -> None:
    """One job per live file: on CPU all at once in lockstep turns (autokernel.bench.lockstep), in ABBA order of
    turns; on CUDA one after another in ABBA order (jobs never share a device)."""
    live = [f for f in _order(files, r) if f.status == "ok"]
    jobs = [_job(op, f, rnd, r, k, policy, root) for k, f in enumerate(live)]
    if device == "cpu":
        lockstep.run_lockstep(jobs)
    else:
        for j in jobs:
            lockstep.run_alone(j)
    rnd.prepare([j.result.data for j in jobs if j.error is None and j.result is not None and j.result.ok])
    for f, j in sorted(zip(live, jobs), key=lambda x: x[0].role != "incumbent"):  # the incumbent's failure first
        _record(f, rnd, r, j)


def _order(files: list[Timed], r: int) -> list[Timed]:
    """ABBA: rotate by r // 2, reverse odd rounds; over an even number of rounds each file goes first equally often."""
    k = (r // 2) % len(files)
    order = files[k:] + files[:k]
    return order if r % 2 == 0 else order[::-1]


def _reps(files: list[Timed], policy: Policy, device: str) -> int:
    """Repetitions per job for the next round: enough that the fastest live file's timed calls add up to
    bench.job_time_s, within JOB_TIME_CAP x that for the slowest, at each file's latest cost per repetition."""
    costs = [sum(t[-1] for t in f.times) / 1e3 for f in files if f.status == "ok" and f.times and f.times[0]]
    if not costs or min(costs) <= 0:
        return MAX_REPS[device]
    want = math.ceil(policy.bench.job_time_s / min(costs))
    cap = math.floor(JOB_TIME_CAP * policy.bench.job_time_s / max(costs))
    return max(MIN_REPS, min(MAX_REPS[device], want, cap))


def _precise(files: list[Timed], cases: list[dict], target: float) -> bool:
    """Every live candidate's weighted log-speedup (the incumbent's medians, when it is alone) has a standard error
    under `target`."""
    inc, live = files[0], [f for f in files[1:] if f.status == "ok"]
    if not live:
        return all(rse_of_median(t) < target for t in inc.times)
    weights = [c["calls"] * float(np.median(t)) for c, t in zip(cases, inc.times)]
    return all(se_of_weighted_log_ratio([(a, b) for a, b in zip(inc.times, f.times)], weights) < target
               for f in live)


def run_rounds(op: str, files: list[Timed], cases: list[dict], policy: Policy, root: Path, device: str,
               spec=None) -> int:
    """Time `files` (the incumbent first) in rounds of fresh jobs; returns the number of rounds. Raises
    IncumbentFailed when the incumbent's own job fails. `spec`: the op's OpSpec (default autokernel.ops.get(op); a
    target's from autokernel/target/contract.py)."""
    spec = get(op) if spec is None else spec
    for f in files:
        f.times, f.wall = [[] for _ in cases], [[] for _ in cases]
    t0 = time.monotonic()
    reps, r, ends = FIRST_REPS, 0, []
    while True:
        rnd = Round(spec, cases, secrets.randbits(62), reps, CLOCK[device])
        _run_round(op, files, rnd, r, policy, root, device)
        r += 1
        ends.append(time.monotonic() - t0)
        if not any(f.status == "ok" for f in files[1:]) and len(files) > 1:
            return r  # every candidate failed: nothing left to compare
        reps = _reps(files, policy, device)
        if r < policy.bench.rounds or r % 2:
            continue
        pair_s = 2 * (ends[-1] - ends[-2])  # the last round ran at the current repetitions
        if r >= MAX_ROUNDS or ends[-1] + pair_s > policy.bench.max_time_s \
                or _precise(files, cases, policy.bench.rse_target):
            return r


def measure_rounds(op: str, candidates: list[Path], cases: list[dict], policy: Policy, job_root: Path,
                   incumbent: Path, spec=None) -> Measurement:
    """autokernel.bench.measure.measure(): the files are read once (the bytes every job of a file gets), timed in
    rounds, and decided by results.decide from the per-round figures. `spec`: as for run_rounds."""
    fp = device_mod.fingerprint()
    peak = roofline.peak_for(fp)
    device = "cuda" if fp["kind"] == "cuda" else "cpu"
    label = CPU_LABEL if device == "cpu" else f"CUDA {fp.get('gpu', '')}".strip()
    root = Path(job_root) / (time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3))
    files = [Timed(Path(incumbent), "incumbent", Path(incumbent).read_bytes())]
    files += [Timed(Path(c), "candidate", Path(c).read_bytes()) for c in candidates]
    n = run_rounds(op, files, cases, policy, root, device, spec)
    raw = {"device": device,
           "files": [{"path": str(f.path), "status": f.status, "detail": f.detail} for f in files],
           "cases": [{"shape": c["shape"], "dtype": c["dtype"], "reps": len(files[0].times[ci]),
                      "times_ms": [f.times[ci] if f.status == "ok" else [] for f in files],
                      "wall_ms": [f.wall[ci] if f.status == "ok" else [] for f in files]}
                     for ci, c in enumerate(cases)]}
    decided = decide(op, raw, [c["calls"] for c in cases], policy.bench, peak, [f.role for f in files], spec)
    jobs = [{"file": str(f.path), "role": f.role, **j} for f in files for j in f.jobs]
    isolation = next((j["isolation"] for j in jobs if j["isolation"]), "")
    return Measurement(op, label, fp, asdict(peak) if peak else None, policy.bench.model_dump(), decided,
                       sorted({j["job_dir"] for j in jobs}), isolation, rounds=n, jobs=jobs, clock=CLOCK_LABEL[device])
