"""The bench's result types and its decision: raw times from the jobs -> per-file results, decided in the
trusted parent (autokernel.bench.rounds runs the jobs and calls `decide`; autokernel.bench.measure re-exports
all of this beside `measure`). Down here so that rounds.py and measure.py both import it and neither the other.

Each file is timed in fresh sandboxed processes of its own, in A/B rounds (autokernel.bench.rounds; the harness is
autokernel.bench.job). Jobs only return raw times and outputs; everything that decides a verdict is computed in the
trusted process: the output checks (rounds.py), medians and bootstrap intervals over rounds, paired speedups, the
weighted speedup, the roofline and 10x checks and the wait check (here).

Times are on the verdict's clock (rounds.CLOCK): on CPU the process's CPU time of each call, on CUDA CUDA events;
the wall clock around the same calls comes along. The wait check (CPU): a file whose calls spend much more wall time
per CPU second than the incumbent's did (median over rounds, `bench.max_wait_ratio`) waited for something while its
CPU time stood still, which is how work done outside the process would look however it was arranged; it is
flagged implausible, never accepted. Load on the machine stretches both files' wall time alike; the incumbent's
ratio counts as at least 1 (a multi-threaded incumbent's is under 1, and is no measure of waiting).

The speedup that decides is the traced workload's time in the op, incumbent over candidate (stats.weighted_speedup):
1 / sum_i(share_i / speedup_i) over the shapes, share_i a shape's part of the incumbent's traced time (its calls x
median time). That is the harmonic mean, never above the geometric one: a 4x win on shapes holding half the time and
a 2x loss on the rest is 0.89x here (the workload's time grows), where a geometric mean would call it 1.41x.

A target op with several launchers (autokernel/target/bench.py: each case's shape names its launcher) is decided on
every launcher's calls at once, since a candidate replaces the whole file: each launcher's figure over its shapes
(LauncherResult), and across launchers the same ratio, 1 / sum_L(share_L / speedup_L). Its interval is the same
function of the launchers' intervals (increasing in each), so it holds whenever theirs do.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from autokernel.bench import roofline
from autokernel.bench.stats import Interval, median_ci, paired_speedup, weighted_speedup
from autokernel.ops import get
from autokernel.policy import Bench

CPU_LABEL = "CPU / Triton-interpreter CPU time"
MIN_MS = 1e-6  # a timer reading of 0 would be an infinite speedup


@dataclass
class ShapeResult:
    shape: dict
    dtype: str
    calls: int
    reps: int
    median_ms: Interval
    speedup: Interval | None  # incumbent / this file, paired by repetition; None for the incumbent
    gbps: float  # achieved: the op's bytes_moved / median time
    gflops: float
    fraction_of_peak: float | None  # roofline floor / median time (None: unknown device)
    implausible: str = ""  # why, if this shape's figure cannot be physical
    rounds_ms: list[float] = field(default_factory=list)  # the figure of each round (a median over its repetitions)


@dataclass
class LauncherResult:
    """One launcher of a several-launcher target op, for one file: its part of the workload's time in the op."""
    launcher: str
    share: float  # of the incumbent's traced time in the op (calls x median ms over its shapes, summed)
    workload_ms: float  # this file's time for the launcher's calls in the workload: sum of calls x median ms
    speedup: Interval | None  # the workload-time ratio over the launcher's shapes; None for the incumbent


@dataclass
class FileResult:
    path: str
    role: str  # "incumbent" | "candidate"
    status: str  # "ok", or the reason code of the failure that stopped its timing
    detail: str = ""
    shapes: list[ShapeResult] = field(default_factory=list)
    speedup: Interval | None = None  # the traced workload's time, incumbent over candidate (weighted_speedup)
    accepted: bool = False
    reason: str | None = None  # why not accepted: bench.no_win | bench.implausible | the status
    # a target op with several launchers: per launcher, in declaration order (empty for one launcher)
    launchers: list[LauncherResult] = field(default_factory=list)


@dataclass
class Measurement:
    op: str
    label: str  # "CPU / Triton-interpreter CPU time" or "CUDA <gpu>": printed beside every figure
    fingerprint: dict
    peak: dict | None
    policy: dict
    files: list[FileResult]  # the incumbent first
    job_dirs: list[str]
    isolation: str
    rounds: int = 0  # A/B rounds: each timed every file in a fresh process (autokernel.bench.rounds)
    jobs: list[dict] = field(default_factory=list)  # per job: file, round, wall_s, cpu_s, processes seen
    clock: str = ""  # what every time is: the process's CPU time (CPU: Triton interpreter) or CUDA events

    @property
    def accepted(self) -> list[FileResult]:
        return [f for f in self.files if f.accepted]

    def to_dict(self) -> dict:
        return asdict(self)


class IncumbentFailed(Exception):
    """The incumbent kernel itself could not be timed: an environment problem (exit 2), not a verdict. Raised by
    autokernel.bench.rounds when the incumbent's own job fails; no candidate was ever loaded in that job."""


def decide(op: str, raw: dict, calls: list[int], bench: Bench, peak: roofline.Peak | None,
           roles: list[str], spec=None) -> list[FileResult]:
    """Turn the child's raw times into per-file results; file 0 is the incumbent. Pure: tests feed it synthetic data.
    `spec`: the op's OpSpec (default autokernel.ops.get(op); a target's from autokernel/target/contract.py)."""
    spec = get(op) if spec is None else spec
    out = []
    for i, st in enumerate(raw["files"]):
        fr = FileResult(st["path"], roles[i], st["status"], st.get("detail", ""))
        out.append(fr)
        if fr.status != "ok":
            fr.reason = fr.status
            continue
        pairs, weights, groups = [], [], []
        for case, n_calls in zip(raw["cases"], calls):
            if not case["times_ms"][0]:  # every candidate of the job failed before this shape was timed
                continue
            inc = np.maximum(np.asarray(case["times_ms"][0], np.float64), MIN_MS)
            mine = np.maximum(np.asarray(case["times_ms"][i], np.float64), MIN_MS)
            dtype = getattr(torch, case["dtype"])
            shape = case["shape"]
            med = median_ci(mine, bench.confidence)
            sp = paired_speedup(inc, mine, bench.confidence) if i > 0 else None
            flops, nbytes = spec.flops(shape), spec.bytes_moved(shape, dtype)
            floor = roofline.floor_ms(flops, nbytes, dtype, peak) if peak else None
            why = []
            if floor is not None and med.est < floor:
                why.append(f"median {med.est:.4g} ms is below the roofline floor {floor:.4g} ms")
            if sp is not None and sp.est > bench.implausible_factor:
                why.append(f"{sp.est:.1f}x faster than the incumbent (limit {bench.implausible_factor:g}x)")
            why += _clock_checks(case, i, bench, raw.get("device", "cpu"), med.est)
            fr.shapes.append(ShapeResult(shape, case["dtype"], n_calls, case["reps"], med, sp,
                                         nbytes / med.est / 1e6, flops / med.est / 1e6,
                                         floor / med.est if floor is not None else None, "; ".join(why),
                                         [float(t) for t in mine]))
            pairs.append((inc, mine))
            weights.append(n_calls * float(np.median(inc)))  # the shape's share of the incumbent's traced time
            groups.append(shape.get("launcher"))
        several = len(set(groups)) > 1
        if several:
            fr.launchers = _per_launcher(pairs, weights, groups, [s.calls for s in fr.shapes], i, bench.confidence)
        if i == 0:
            continue
        if not pairs:
            fr.reason = "bench.no_win"
            continue
        fr.speedup = _time_ratio(fr.launchers) if several else weighted_speedup(pairs, weights, bench.confidence)
        implausible = [s for s in fr.shapes if s.implausible]
        fr.accepted = not implausible and fr.speedup.lo > bench.min_speedup
        fr.reason = None if fr.accepted else "bench.implausible" if implausible else "bench.no_win"
        if implausible:
            fr.detail = f"shape {implausible[0].shape}: {implausible[0].implausible}"
        elif not fr.accepted:
            fr.detail = (f"the weighted speedup's lower {bench.confidence:.0%} bound {fr.speedup.lo:.3f} is not above "
                         f"{bench.min_speedup:g}")
            if several:
                fr.detail += " (over every launcher's calls: " + ", ".join(
                    f"{r.launcher} {r.speedup.est:.3f}x on {r.share:.0%} of the time" for r in fr.launchers
                    if r.speedup) + ")"
    return out


def _per_launcher(pairs: list, weights: list[float], groups: list, calls: list[int], i: int,
                  confidence: float) -> list[LauncherResult]:
    """File i's figures per launcher (module docstring), the launchers in the order their shapes come."""
    total = sum(weights)
    out = []
    for name in dict.fromkeys(groups):
        mine = [k for k, g in enumerate(groups) if g == name]
        out.append(LauncherResult(
            str(name), sum(weights[k] for k in mine) / total,
            sum(calls[k] * float(np.median(pairs[k][1])) for k in mine),
            weighted_speedup([pairs[k] for k in mine], [weights[k] for k in mine], confidence) if i else None))
    return out


def _time_ratio(launchers: list[LauncherResult]) -> Interval:
    """Incumbent time / candidate time over the workload's calls of every launcher: 1 / sum(share / speedup), at the
    estimate and at each end of the launchers' intervals."""
    def ratio(pick) -> float:
        return 1.0 / sum(r.share / pick(r.speedup) for r in launchers)
    assert all(r.speedup is not None for r in launchers)
    return Interval(ratio(lambda x: x.est), ratio(lambda x: x.lo), ratio(lambda x: x.hi))


def _clock_checks(case: dict, i: int, bench: Bench, device: str, med_ms: float) -> list[str]:
    """What the wall clock says against file i's verdict-clock figures on one shape: [] when nothing."""
    wall = case.get("wall_ms") or []
    if len(wall) <= i or not len(wall[i]):
        return []
    if device == "cuda":
        return ["CUDA events report more time than the host clock saw"] if np.median(wall[i]) * 1.1 < med_ms else []
    if i == 0 or not len(wall[0]):
        return []
    def wait(k):  # median over rounds of wall time per CPU time
        return float(np.median(np.asarray(wall[k], np.float64) / np.maximum(case["times_ms"][k], MIN_MS)))
    # The base is at least 1: one thread's wall time is never under its CPU time. An incumbent whose calls kept two
    # threads busy (ratio ~0.5: numpy's BLAS inside the interpreter, at its block sizes) is no base for a candidate
    # whose block sizes keep to one (measured: a legitimate attention_decode block-size change, 1.9 against 0.51).
    mine, inc = wait(i), max(wait(0), 1.0)
    if mine > bench.max_wait_ratio * inc:
        return [f"its calls took {mine:.2g} s of wall time per CPU second, the incumbent's {inc:.2g} (limit "
                f"{bench.max_wait_ratio:g}x): waiting while work happens outside the process is not a speedup"]
    return []
