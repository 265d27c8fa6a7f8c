"""What `autokernel profile`/`rank` print (autokernel/cli/profile.py; `autokernel run` prints the rank table too), and
what a target's rank table (autokernel/target/rank_target.py) shares with them."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import JustifyMethod

    from autokernel.profile.trace import Trace


def console():
    """Rich's console; piped output gets 150 columns rather than 80, so the rank table is not cut to ellipses."""
    from rich.console import Console
    c = Console()
    return c if c.is_terminal else Console(width=max(c.width, 150))


def pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f}%"


def num(x: object, spec: str = "", default: str = "?") -> str:
    """A trace's number formatted with `spec`; `default` for anything else (a trace may be a checkout's file: a
    string where a number belongs is shown as unknown, never a traceback, never as markup)."""
    return format(x, spec) if type(x) in (int, float) else default


def print_rank(t: Trace, ranked, top: int | None = None) -> None:
    from rich.table import Table

    from autokernel.untrusted import markup as m  # every string of a trace: it may be a checkout's committed file
    out = console()
    timing, totals, roof = t.get("timing", {}), t.get("totals", {}), t.get("roofline", {})
    wl = t.get("workload", {})
    out.print(f"[bold]{m(t.get('run_id'))}[/] · {m(t.get('kernels'))} kernels, {m(t.get('weights'))} weights · "
              f"workload {m(wl.get('name'))} ({m(str(wl.get('sha256', ''))[:12])}) · {num(totals.get('calls'))} op "
              "calls")
    out.print(f"timing: [bold yellow]{m(timing.get('label'))}[/] — {m(timing.get('note'))}")
    if timing.get("extrapolated_calls"):
        out.print(f"        {num(timing.get('timed_calls'))} calls timed, {num(timing['extrapolated_calls'])} charged "
                  "their shape's mean")
    gf = (roof.get("gflops") or {})
    flops = ", ".join(f"{m(k)} {num(v, '.0f')} GFLOP/s" for k, v in gf.items() if k in ("float32", "bfloat16")
                      and (k == "float32" or v != gf.get("float32")))
    out.print(f"roofline: {num(roof.get('gbps') or 0, '.0f')} GB/s, {flops} — {m(roof.get('source'))}; "
              f"{m(roof.get('note'))}")
    tps, wall = totals.get("decode_tokens_per_s"), totals.get("wall_ms", 0)
    out.print(f"end to end: {num(totals.get('e2e_ms', 0), '.0f')} ms = ops {num(totals.get('total_op_ms', 0), '.0f')} "
              f"ms + outside ops {num(totals.get('non_op_ms', 0), '.0f')} ms · {num(totals.get('prefill_tokens'))} "
              f"prefill + {num(totals.get('decode_tokens'))} decode tokens"
              + (f", decode {num(tps, '.3g')} tok/s ({m(totals.get('decode_tokens_per_s_basis'))})" if tps else "")
              + f" · this run's wall {num(wall / 1e3 if type(wall) in (int, float) else None, '.1f')} s")
    table = Table(show_lines=False)
    columns: list[tuple[str, JustifyMethod]] = [
        ("#", "right"), ("op", "left"), ("calls", "right"), ("total ms", "right"), ("share", "right"),
        ("GB/s", "right"), ("GFLOP/s", "right"), ("% peak", "right"), ("bound", "left"), ("headroom", "right"),
        ("gain", "right"), ("e2e ×", "right")]
    for col, just in columns:
        table.add_column(col, justify=just)
    shown = ranked if top is None else ranked[:top]
    n = 0
    for r in shown:
        mark = "" if r.status == "target" else f" [dim]({m(r.status)})[/]"
        n += r.status == "target"
        peak = r.pct_peak_gflops if r.bound == "compute" else r.pct_peak_gbps
        table.add_row(str(n) if r.status == "target" else "—", m(r.op) + mark, num(r.calls), num(r.total_ms, ".1f"),
                      pct(r.share), num(r.gbps, ".3g"), num(r.gflops, ".3g"),
                      "—" if peak is None else f"{peak:.2g}%", m(r.bound or "—"), pct(r.headroom),
                      pct(r.gain), "—" if r.e2e_speedup is None else f"{r.e2e_speedup:.2f}",
                      style=None if r.status == "target" else "dim")
    out.print(table)
    if top is not None and len(ranked) > top:
        out.print(f"[dim]… {len(ranked) - top} more: autokernel rank {m(t['_path'])}[/]")
    out.print("[dim]share: of op time · gain: share of end-to-end time a roofline kernel would save · e2e ×: "
                  "Amdahl speedup if the op reached its roofline · protected/denied ops are listed, never targets[/]")


def print_op(t: Trace, op: str) -> None:
    from rich.table import Table
    out = console()
    e = t["ops"][op]
    out.print(f"\n[bold]{op}[/]: {e['calls']} calls, {e['total_ms']:.1f} ms, mean {e['mean_ms']:.3f} ms, "
                  f"p50 {e['p50_ms']:.3f} ms, p95 {e['p95_ms']:.3f} ms")
    shapes = Table(title=f"{op}: shape corpus")
    for col in ("shape", "calls", "timed", "mean ms", "timed min–max ms", "MFLOP", "KB", "dtypes", "sites"):
        shapes.add_column(col)
    for s in e["shapes"]:
        spread = f"{s['min_ms']:.3g}–{s['max_ms']:.3g}" if "min_ms" in s else "—"
        shapes.add_row(", ".join(f"{k}={v}" for k, v in s["shape"].items()), str(s["calls"]), str(s["timed_calls"]),
                       f"{s['mean_ms']:.3f}", spread, f"{s['flops'] / 1e6:.3g}", f"{s['bytes'] / 1e3:.4g}",
                       " ".join(sorted({v for d in s["dtypes"] for v in d.values()})), " ".join(s["sites"]))
    out.print(shapes)


def print_pyspy(spy: dict, timing: dict) -> None:
    from rich.table import Table
    out = console()
    if not spy.get("ok"):
        out.print(f"[yellow]py-spy: no samples: {spy.get('reason')}[/]")
        return
    table = Table(title=f"py-spy: top Python frames by self time ({spy['samples']} samples)",
                  caption="autokernel/ops/*.py reference frames are the stand-ins for calls charged their shape's "
                          "mean" if timing.get("extrapolated_calls") else None)
    table.add_column("self", justify="right")
    table.add_column("frame")
    for f in spy["top_self"]:
        table.add_row(pct(f["share"]), f["frame"])
    out.print(table)
