"""`rank --plot FILE.png`: time-share bars and a roofline chart of one trace (matplotlib, drawn off-screen)."""
from __future__ import annotations

from pathlib import Path

from autokernel.errors import UserError
from autokernel.profile.rank import Target
from autokernel.profile.trace import Trace

COLORS = {"target": "#1f77b4", "protected": "#999999", "denied": "#bbbbbb", "not allowed": "#bbbbbb"}


def plot(trace: Trace, ranked: list[Target], path: str | Path) -> Path:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot needs matplotlib: pip install matplotlib") from None
    import numpy as np
    path = Path(path)
    peaks = trace.get("roofline") or {}
    label = trace.get("timing", {}).get("label", "")
    fig, (bars, roof) = plt.subplots(1, 2, figsize=(13, 5.5))

    order = sorted(ranked, key=lambda t: t.e2e_share)
    names = [t.op + (" (protected)" if t.status == "protected" else "") for t in order]
    bars.barh(names, [100 * t.e2e_share for t in order], color=[COLORS[t.status] for t in order])
    for i, t in enumerate(order):
        bars.text(100 * t.e2e_share, i, f" {100 * t.e2e_share:.1f}%", va="center", fontsize=8)
    bars.set_xlabel("share of end-to-end time (%)")
    bars.set_title(f"time share: {label}")

    gbps = peaks.get("gbps")
    gflops = (peaks.get("gflops") or {}).get("float32")
    ops = trace["ops"]
    points = [(t, ops[t.op]["flops_per_call"] / ops[t.op]["bytes_per_call"]) for t in ranked
              if ops[t.op]["bytes_per_call"] > 0 and t.gflops > 0]
    if points:
        xs = np.array([p[1] for p in points])
        lo, hi = max(min(xs.min() / 4, 0.05), 1e-3), max(xs.max() * 4, 100.0)
        if gbps and gflops:
            x = np.logspace(np.log10(lo), np.log10(hi), 200)
            roof.plot(x, np.minimum(gflops, x * gbps), "k-", lw=1.5,
                      label=f"roofline: {gbps:.0f} GB/s, {gflops:.0f} GFLOP/s fp32")
        for t, ai in points:
            roof.scatter(ai, t.gflops, color=COLORS[t.status], s=30 + 400 * t.e2e_share, zorder=3)
            roof.annotate(t.op, (ai, t.gflops), fontsize=8, xytext=(4, 4), textcoords="offset points")
        roof.set_xscale("log")
        roof.set_yscale("log")
        roof.set_xlim(lo, hi)
        roof.legend(loc="lower right", fontsize=8)
    roof.set_xlabel("arithmetic intensity (FLOP / byte)")
    roof.set_ylabel(f"achieved GFLOP/s ({label})" if label else "achieved GFLOP/s")
    roof.set_title(f"roofline ({peaks.get('source', 'no peaks')})", fontsize=10)
    dev = trace.get("device", {})
    fig.suptitle(f"{trace.get('run_id', '')}  ·  {dev.get('gpu') or dev.get('cpu', '')}  ·  {label}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
