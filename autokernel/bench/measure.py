"""Benchmark an op's candidates against its incumbent: one sandboxed A/B job per candidate, judged in the parent.

The child (autokernel.bench.child) only returns raw times; everything that decides a verdict is computed here, in
the trusted process: medians and bootstrap intervals, paired speedups, the weighted speedup, the roofline checks.
"""
from __future__ import annotations

import json
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from autokernel import device, sandbox
from autokernel.bench import roofline
from autokernel.bench.stats import Interval, median_ci, paired_speedup, weighted_speedup
from autokernel.ops import get
from autokernel.policy import Bench, Policy

ENTRY = "autokernel.bench.child:time_op"
CPU_LABEL = "CPU / Triton interpreter"
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


@dataclass
class FileResult:
    path: str
    role: str  # "incumbent" | "candidate"
    status: str  # "ok", or the reason code of the failure that stopped its timing
    detail: str = ""
    shapes: list[ShapeResult] = field(default_factory=list)
    speedup: Interval | None = None  # weighted geometric mean over shapes
    accepted: bool = False
    reason: str | None = None  # why not accepted: bench.no_win | bench.implausible | the status


@dataclass
class Measurement:
    op: str
    label: str  # "CPU / Triton interpreter" or "CUDA <gpu>": printed beside every figure
    fingerprint: dict
    peak: dict | None
    policy: dict
    files: list[FileResult]  # the incumbent first
    job_dirs: list[str]
    isolation: str

    @property
    def accepted(self) -> list[FileResult]:
        return [f for f in self.files if f.accepted]

    def to_dict(self) -> dict:
        return asdict(self)


class IncumbentFailed(Exception):
    """The incumbent kernel itself could not be timed: an environment problem (exit 2), not a verdict.

    The child raises its namesake (autokernel.bench.child.IncumbentFailed); the parent recognises it by name in the
    sandbox's one-line detail.
    """


def judge(op: str, raw: dict, calls: list[int], bench: Bench, peak: roofline.Peak | None,
          roles: list[str]) -> list[FileResult]:
    """Turn the child's raw times into per-file results; file 0 is the incumbent. Pure: tests feed it synthetic data."""
    spec = get(op)
    out = []
    for i, st in enumerate(raw["files"]):
        fr = FileResult(st["path"], roles[i], st["status"], st.get("detail", ""))
        out.append(fr)
        if fr.status != "ok":
            fr.reason = fr.status
            continue
        pairs, weights = [], []
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
            host = case.get("host_ms") or []
            if len(host) > i and len(host[i]) and np.median(host[i]) * 1.1 < med.est:
                why.append("CUDA events report more time than the host clock saw")
            fr.shapes.append(ShapeResult(shape, case["dtype"], n_calls, case["reps"], med, sp,
                                         nbytes / med.est / 1e6, flops / med.est / 1e6,
                                         floor / med.est if floor is not None else None, "; ".join(why)))
            pairs.append((inc, mine))
            weights.append(n_calls * float(np.median(inc)))  # the shape's share of the incumbent's traced time
        if i == 0:
            continue
        if not pairs:
            fr.reason = "bench.no_win"
            continue
        fr.speedup = weighted_speedup(pairs, weights, bench.confidence)
        implausible = [s for s in fr.shapes if s.implausible]
        fr.accepted = not implausible and fr.speedup.lo > bench.min_speedup
        fr.reason = None if fr.accepted else "bench.implausible" if implausible else "bench.no_win"
        if implausible:
            fr.detail = f"shape {implausible[0].shape}: {implausible[0].implausible}"
        elif not fr.accepted:
            fr.detail = (f"the weighted speedup's lower {bench.confidence:.0%} bound {fr.speedup.lo:.3f} is not above "
                         f"{bench.min_speedup:g}")
    return out


def _job(op: str, cands: list[Path], cases: list[dict], policy: Policy, job_dir: Path,
         incumbent: Path) -> sandbox.SandboxResult:
    """One sandboxed timing of `incumbent` followed by `cands`, from snapshots copied into job_dir/files."""
    (job_dir / "files").mkdir(parents=True, exist_ok=True)
    paths = [job_dir / "files" / f"incumbent_{op}.py"]
    shutil.copyfile(incumbent, paths[0])
    for k, c in enumerate(cands):
        paths.append(job_dir / "files" / f"candidate{k}_{c.name}")
        shutil.copyfile(c, paths[-1])
    payload = {"op": op, "files": [str(p) for p in paths],
               "cases": [{"shape": c["shape"], "dtype": c["dtype"]} for c in cases],
               "seed": secrets.randbits(62), "max_time_s": policy.bench.max_time_s,
               "rse_target": policy.bench.rse_target}
    res = sandbox.run(ENTRY, payload, job_dir, policy.sandbox)
    if res.ok:
        (job_dir / "times.json").write_text(json.dumps(res.data))  # raw, as the child reported it
    return res


def measure(op: str, candidates: list[Path], cases: list[dict], policy: Policy, job_root: Path,
            incumbent: Path | None = None) -> Measurement:
    """Time kernels/<op>.py against the candidates, interleaved in one sandboxed job.

    If that job dies (a candidate crashed the process, hung, or ran out of memory), each candidate is timed again in
    a job of its own with the incumbent, so that one bad file neither hides the others nor escapes its own verdict.
    cases: [{"shape": {...}, "calls": n, "dtype": "float32"}]. Jobs run one after another, never in parallel: they
    would share the device being measured. `incumbent` is the target checkout's kernels/<op>.py (autokernel.paths;
    default: the installed project's).
    """
    incumbent = Path(incumbent) if incumbent is not None else sandbox.bwrap.PROJECT / "kernels" / f"{op}.py"
    fp = device.fingerprint()
    peak = roofline.peak_for(fp)
    label = CPU_LABEL if fp["kind"] != "cuda" else f"CUDA {fp.get('gpu', '')}".strip()
    root = Path(job_root) / (time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3))
    calls = [c["calls"] for c in cases]
    files: list[FileResult] = []
    job_dirs, isolation = [], ""
    groups = [list(candidates)]
    while groups:
        group = groups.pop(0)
        job_dir = root / ("all" if group == list(candidates) else f"alone-{candidates.index(group[0])}")
        res = _job(op, group, cases, policy, job_dir, incumbent)
        job_dirs.append(str(job_dir))
        isolation = res.isolation
        if not res.ok:
            if not group or res.detail.split(":")[0].endswith(IncumbentFailed.__name__):
                raise IncumbentFailed(f"kernels/{op}.py could not be timed: {res.reason}: {res.detail}")
            if len(group) > 1:
                groups = [[c] for c in group]
            else:
                reason = res.reason or "sandbox.error"
                if res.detail.split(":")[0].endswith("JobContaminated"):
                    reason = "bench.tampered"
                files.append(FileResult(str(group[0]), "candidate", reason, res.detail, reason=reason))
            continue
        judged = judge(op, res.data, calls, policy.bench, peak, ["incumbent"] + ["candidate"] * len(group))
        for fr, path in zip(judged, [incumbent, *group]):
            fr.path = str(path)
        if not files or files[0].role != "incumbent":
            files.insert(0, judged[0])  # the first job's incumbent figures stand for the incumbent
        elif not files[0].shapes:
            files[0] = judged[0]
        files.extend(judged[1:])
    return Measurement(op, label, fp, asdict(peak) if peak else None, policy.bench.model_dump(), files, job_dirs,
                       isolation)
