"""A/B rounds of fresh processes: how the benchmark times files that must never share a process.

Design (issue "The sandbox and the trusted parent", benchmark rigging): every timing of a file is its own sandboxed
job (autokernel.bench.job) that loads that one file and nothing else. A ROUND runs one job per file, one after
another, never in parallel (they would share the device being measured), in an order that alternates A B / B A
(ABBA over rounds; rotated when there are several candidates), each job timing every shape `reps` times on inputs
drawn from the round's seed, the same for every file of the round. The incumbent's figures therefore always come
from a process no candidate was ever loaded in: a candidate can neither wrap, patch nor slow the incumbent's kernel,
nor damage its outputs (the bench would then blame the incumbent and end an agent session).

Why rounds of short jobs rather than two long-lived processes stepped alternately: a process carries its own
systematic offset (address-space layout, allocator state, which core it landed on, the interpreter's caches), and
with one process per side that offset is a bias no number of repetitions inside it can reveal: an identical copy can
come out "3% faster" with a tight interval. Taking the ROUND as the unit of replication puts the between-process
variation into the interval. Per round and shape, each file's figure is the median of its repetitions; the paired
statistic is the round's log-ratio (incumbent / candidate) and stats.py's bootstrap and order-statistic intervals
run over rounds. policies.yaml `bench.rounds` (>= 6, the least for which a 95% order-statistic interval of a
median exists) rounds always run; more run, in pairs, until `bench.max_time_s` or `bench.rse_target`.
The cost is one process start per file per round (~2-3 s on 2 CPU cores, most of it `import torch`).

Judged here, never in a job: every output the job returns (a random sample of its timed calls, chosen after each
call) is compared with the reference the PARENT computes from inputs it re-creates from its own seed; counts, case
indices and repetitions are checked against what was asked; a job's own status can only reject its file. While a
job runs, autokernel.bench.watch records every other process in it (`bench.tampered`) and its CPU and wall time.
"""
from __future__ import annotations

import math
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from autokernel import sandbox
from autokernel import device as device_mod
from autokernel.bench import job, roofline
from autokernel.bench.measure import CPU_LABEL, IncumbentFailed, Measurement, judge
from autokernel.bench.stats import rse_of_median
from autokernel.bench.watch import Watch
from autokernel.ops import get
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import compare
from autokernel.policy import Policy
from autokernel.untrusted import line

ENTRY = "autokernel.bench.job:time_file"
FIRST_REPS = 3  # repetitions per shape in round 0, which also measures what a repetition costs
MIN_REPS = 3
MAX_REPS = {"cuda": 2000, "cpu": 200}
MAX_ROUNDS = 40
COMPILERS = ("ptxas",)  # processes a CUDA job may start (Triton compiles with ptxas) where process creation is allowed
CHILD_REASONS = ("bench.error", "bench.tampered")  # what a job may say about its own file


@dataclass
class Timed:
    """One file across rounds: per shape, one figure per round (the median of that round's repetitions)."""
    path: Path
    role: str  # "incumbent" | "candidate"
    source: bytes
    status: str = "ok"
    detail: str = ""
    times: list[list[float]] = field(default_factory=list)  # [shape][round] ms
    host: list[list[float]] = field(default_factory=list)
    jobs: list[dict] = field(default_factory=list)


def _reference(spec, vals: dict) -> list:
    """(float64 truth, eager in the call's dtype) per output, each on private copies of the inputs."""
    def outs(r):
        return list(r) if isinstance(r, (tuple, list)) else [r]
    ref64 = outs(spec.reference(**upcast(vals)))
    eager = outs(spec.reference(**{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in vals.items()}))
    return list(zip(ref64, eager))


class Round:
    """What the parent knows about one round: its seed, repetitions and the references it computed (shared by files)."""

    def __init__(self, spec, cases: list[dict], seed: int, reps: int):
        self.spec, self.cases, self.seed, self.reps = spec, cases, seed, reps
        self._pools: dict[int, list[dict]] = {}
        self._refs: dict[tuple[int, int], list] = {}

    def reference(self, ci: int, rep: int) -> list:
        if (ci, rep) not in self._refs:
            if ci not in self._pools:
                self._pools[ci] = job.pool(self.spec, self.cases[ci], self.seed, ci)
            self._refs[(ci, rep)] = _reference(self.spec, job.values(self._pools[ci], self.seed, ci, rep))
        return self._refs[(ci, rep)]


def check(rnd: Round, data) -> tuple[str, str, list[float], list[float]]:
    """(status, detail, per-shape median ms, per-shape median host ms) of one job's raw data, judged here."""
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list) or len(data["cases"]) != len(rnd.cases):
        return "bench.error", "the job returned malformed data", [], []
    status = data.get("status")
    if status != "ok":
        reason = status if status in CHILD_REASONS else "bench.error"
        return reason, line(data.get("detail", ""), 300), [], []
    meds, host = [], []
    for ci, case in enumerate(data["cases"]):
        where = f"shape {rnd.cases[ci]['shape']}"
        times = case.get("times_ms") if isinstance(case, dict) else None
        if (not isinstance(times, list) or len(times) != rnd.reps
                or not all(type(t) is float and math.isfinite(t) and t >= 0 for t in times)):
            return "bench.error", f"{where}: the job returned no valid time for each of {rnd.reps} calls", [], []
        why = _check_outputs(rnd, ci, case.get("kept"))
        if why:
            return "bench.mismatch", f"{where}: {why}", [], []
        meds.append(float(np.median(times)))
        h = case.get("host_ms")  # CUDA only: the host clock around each event-timed call
        ok_h = isinstance(h, list) and len(h) == rnd.reps and all(type(t) is float and math.isfinite(t) for t in h)
        host.append(float(np.median(h)) if ok_h and h else None)
    return "ok", "", meds, host


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
        ref = rnd.reference(ci, rep)
        if len(outs) != len(ref):
            return f"repetition {rep}: {len(outs)} outputs, expected {len(ref)}"
        for o, (r, e) in zip(outs, ref):
            if type(o) is not torch.Tensor or tuple(o.shape) != tuple(r.shape) or o.dtype != e.dtype:
                got = f"{tuple(o.shape)} {o.dtype}" if type(o) is torch.Tensor else line(o, 40)
                return f"repetition {rep}: output is {got}, expected {tuple(r.shape)} {e.dtype}"
            c = compare(o, r, e, o.dtype)
            if not c.ok:
                return f"output of timed call {rep} differs from the reference: {c.detail()}"
    return ""


def _run_job(op: str, f: Timed, rnd: Round, r: int, policy: Policy, root: Path) -> None:
    """One sandboxed job of file f in round r; records its figures or its failure on f."""
    payload = {"op": op, "cases": [{"shape": c["shape"], "dtype": c["dtype"]} for c in rnd.cases],
               "seed": rnd.seed, "reps": rnd.reps}
    job_dir = root / f"round{r:02d}-{f.role}{'' if f.role == 'incumbent' else f.path.stem}-{secrets.token_hex(2)}"
    with Watch() as w:
        res = sandbox.run(ENTRY, payload, job_dir, policy.sandbox, inputs={f"{op}.py": f.source})
    s = w.stats
    f.jobs.append({"round": r, "job_dir": str(job_dir), "reps": rnd.reps, "wall_s": round(s.wall_s, 3),
                   "cpu_s": round(s.cpu_s, 3), "processes_seen": s.max_processes, "extra_processes": s.extra,
                   "isolation": res.isolation})
    fork_ok = "fork" in res.isolation.split("+")
    extra = [p for p in s.extra if not (fork_ok and p.split(" ")[0].startswith(COMPILERS))]
    if not res.ok:
        status, detail = res.reason or "sandbox.error", line(res.detail, 300)
    elif extra:
        status, detail = "bench.tampered", f"other processes ran in the job while it was timed: {', '.join(extra[:4])}"
    else:
        status, detail, meds, host = check(rnd, res.data)
        if status == "ok":
            for ci, (m, h) in enumerate(zip(meds, host)):
                f.times[ci].append(m)
                if h is not None:
                    f.host[ci].append(h)
            return
    if f.role == "incumbent":
        raise IncumbentFailed(f"{f.path} could not be timed (round {r}): {status}: {detail}")
    f.status, f.detail = status, f"{detail} (round {r})"


def _order(files: list[Timed], r: int) -> list[Timed]:
    """ABBA: rotate by r // 2, reverse odd rounds; over an even number of rounds each file goes first equally often."""
    k = (r // 2) % len(files)
    order = files[k:] + files[:k]
    return order if r % 2 == 0 else order[::-1]


def _reps(inc: Timed, policy: Policy, n_files: int, device: str) -> int:
    """Repetitions per job after round 0: the job's share of max_time_s left after its start-up, at the incumbent's
    measured cost per repetition (all shapes)."""
    j = inc.jobs[0]
    per_rep_s = sum(t[0] for t in inc.times) / 1e3
    timed_s = per_rep_s * j["reps"]
    overhead_s = max(0.0, j["wall_s"] - timed_s)
    share_s = policy.bench.max_time_s / (policy.bench.rounds * n_files) - overhead_s
    reps = int(share_s / per_rep_s) if per_rep_s > 0 else MAX_REPS[device]
    return max(MIN_REPS, min(MAX_REPS[device], reps))


def _precise(files: list[Timed], target: float) -> bool:
    live = [f for f in files if f.status == "ok"]
    return all(rse_of_median(t) < target for f in live for t in f.times)


def run_rounds(op: str, files: list[Timed], cases: list[dict], policy: Policy, root: Path, device: str) -> int:
    """Time `files` (the incumbent first) in rounds of fresh jobs; returns the number of rounds. Raises
    IncumbentFailed when the incumbent's own job fails."""
    spec = get(op)
    for f in files:
        f.times, f.host = [[] for _ in cases], [[] for _ in cases]
    t0 = time.monotonic()
    reps, r = FIRST_REPS, 0
    while True:
        rnd = Round(spec, cases, secrets.randbits(62), reps)
        for f in _order(files, r):
            if f.status == "ok":
                _run_job(op, f, rnd, r, policy, root)
        r += 1
        if not any(f.status == "ok" for f in files[1:]) and len(files) > 1:
            return r  # every candidate failed: nothing left to compare
        if r == 1:
            reps = _reps(files[0], policy, len(files), device)
        if r < policy.bench.rounds or r % 2:
            continue
        if r >= MAX_ROUNDS or time.monotonic() - t0 > policy.bench.max_time_s \
                or _precise(files, policy.bench.rse_target):
            return r


def measure_rounds(op: str, candidates: list[Path], cases: list[dict], policy: Policy, job_root: Path,
                   incumbent: Path) -> Measurement:
    """autokernel.bench.measure.measure(): the files are read once (the bytes every job of a file gets), timed in
    rounds, and judged by measure.judge from the per-round figures."""
    fp = device_mod.fingerprint()
    peak = roofline.peak_for(fp)
    label = CPU_LABEL if fp["kind"] != "cuda" else f"CUDA {fp.get('gpu', '')}".strip()
    root = Path(job_root) / (time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3))
    files = [Timed(Path(incumbent), "incumbent", Path(incumbent).read_bytes())]
    files += [Timed(Path(c), "candidate", Path(c).read_bytes()) for c in candidates]
    n = run_rounds(op, files, cases, policy, root, "cuda" if fp["kind"] == "cuda" else "cpu")
    raw = {"files": [{"path": str(f.path), "status": f.status, "detail": f.detail} for f in files],
           "cases": [{"shape": c["shape"], "dtype": c["dtype"], "reps": len(files[0].times[ci]),
                      "times_ms": [f.times[ci] if f.status == "ok" else [] for f in files],
                      "host_ms": [f.host[ci] if f.status == "ok" else [] for f in files]}
                     for ci, c in enumerate(cases)]}
    judged = judge(op, raw, [c["calls"] for c in cases], policy.bench, peak, [f.role for f in files])
    jobs = [{"file": str(f.path), "role": f.role, **j} for f in files for j in f.jobs]
    isolation = next((j["isolation"] for j in jobs if j["isolation"]), "")
    return Measurement(op, label, fp, asdict(peak) if peak else None, policy.bench.model_dump(), judged,
                       sorted({j["job_dir"] for j in jobs}), isolation, rounds=n, jobs=jobs)
