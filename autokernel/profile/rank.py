"""Trace -> ranked Targets: which kernel, rewritten to its roofline, would make the engine fastest end to end.

For an op taking a fraction f of the end-to-end time, whose calls would take roof_ms at the device's peak
bandwidth / FLOP/s (each shape bound by whichever is slower):
    headroom  = 1 - roof_ms / total_ms             (the fraction of the op's time a perfect kernel removes)
    gain      = f * headroom                       (the fraction of end-to-end time saved: the ranking key)
    e2e_speedup = 1 / ((1 - f) + f / s), s = total_ms / roof_ms   (Amdahl; equals 1 / (1 - gain))
Protected ops (policies.yaml ops.protected, e.g. lm_head), denied ones and ones outside `allow` are listed, marked,
and never targets.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from autokernel.bench import roofline
from autokernel.policy import Policy
from autokernel.profile.trace import Trace


@dataclass
class Target:
    op: str
    status: str  # "target" | "protected" | "denied" | "not allowed"
    calls: int
    total_ms: float
    share: float  # of all op time
    e2e_share: float  # of end-to-end time (ops + glue)
    roof_ms: float | None  # the same calls at the roofline; None when the device has no peak entry
    headroom: float | None
    gain: float | None
    e2e_speedup: float | None
    gbps: float
    gflops: float
    pct_peak_gbps: float | None
    pct_peak_gflops: float | None
    bound: str | None  # "memory" | "compute": what limits it at the roofline, by time
    shapes: list[dict] = field(default_factory=list)  # the shape corpus: [{shape, calls}], most time first

    def to_json(self) -> dict:
        return asdict(self)


def amdahl(fraction: float, speedup: float) -> float:
    """End-to-end speedup when a part taking `fraction` of the time gets `speedup` times faster."""
    if speedup <= 0:
        raise ValueError("speedup must be positive")
    return 1.0 / ((1.0 - fraction) + fraction / speedup)


def roof_ms(entry: dict, peaks: dict) -> tuple[float | None, str | None]:
    """(ms the op's calls would take at the roofline, what bounds them by time), from the trace's roofline section
    through the benchmark's own floor (autokernel/bench/roofline.py)."""
    peak = roofline.from_description(peaks)
    if peak is None:
        return None, None
    mem = comp = total = 0.0
    for s in entry["shapes"]:
        t_mem, t_comp = roofline.bounds_ms(s["flops"], s["bytes"], s.get("dtype") or "float32", peak)
        mem += s["calls"] * t_mem
        comp += s["calls"] * t_comp
        total += s["calls"] * max(t_mem, t_comp)
    return total, ("memory" if mem >= comp else "compute")


def status_of(op: str, policy: Policy) -> str:
    if op in policy.ops.protected:
        return "protected"
    if op in policy.ops.deny:
        return "denied"
    if policy.ops.allow is not None and op not in policy.ops.allow:
        return "not allowed"
    return "target"


def rank(trace: Trace, policy: Policy) -> list[Target]:
    """Every op in the trace, targets first by expected end-to-end gain, then the excluded ones (by `policy`'s ops
    section: the caller's, policy.for_checkout's)."""
    peaks = trace.get("roofline") or {}
    out = []
    for op, e in trace["ops"].items():
        roof, bound = roof_ms(e, peaks)
        f = e.get("e2e_share", e["share"])
        if roof is not None and e["total_ms"] > 0:
            headroom = max(0.0, 1.0 - roof / e["total_ms"])
            gain = f * headroom
            speedup = amdahl(f, e["total_ms"] / roof) if headroom > 0 and roof > 0 else 1.0
        else:
            headroom = gain = speedup = None
        g_peak = (peaks.get("gflops") or {}).get(e["shapes"][0].get("dtype", "float32")) if e["shapes"] else None
        out.append(Target(
            op=op, status=status_of(op, policy), calls=e["calls"], total_ms=e["total_ms"], share=e["share"],
            e2e_share=f, roof_ms=roof, headroom=headroom, gain=gain, e2e_speedup=speedup,
            gbps=e["gbps"], gflops=e["gflops"],
            pct_peak_gbps=100 * e["gbps"] / peaks["gbps"] if peaks.get("gbps") else None,
            pct_peak_gflops=100 * e["gflops"] / g_peak if g_peak else None,
            bound=bound, shapes=[{"shape": s["shape"], "calls": s["calls"]} for s in e["shapes"]]))
    out.sort(key=lambda t: (t.status != "target", -(t.gain if t.gain is not None else t.e2e_share)))
    return out


def targets(trace: Trace, policy: Policy) -> list[Target]:
    """Only the ops the loop may rewrite, best first."""
    return [t for t in rank(trace, policy) if t.status == "target"]
