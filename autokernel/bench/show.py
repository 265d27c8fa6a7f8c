"""What `autokernel bench` prints (also for a target, autokernel/target/bench.py): the tables and verdicts of a
Measurement, and the files the gate's static stage refused. Candidate-derived text is escaped or reduced to
plain lines.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table

from autokernel.bench.results import CPU_LABEL, FileResult, Measurement
from autokernel.bench.stats import Interval
from autokernel.untrusted import line as one_line
from autokernel.untrusted import markup as escape  # markup-escaped AND control characters stripped

if TYPE_CHECKING:
    from autokernel.gate.verdict import StageResult


def print_refused(op: str, refused: list[tuple[Path, StageResult]], as_json: bool) -> None:
    """Exit 1 (a clean negative), with the static findings; candidate-derived text is reduced to plain lines."""
    items: list[dict[str, Any]] = [
        {"path": str(c), "stage": "static", "reason": r.reason, "detail": one_line(r.detail, 500),
         "findings": [{k: one_line(v, 300) if isinstance(v, str) else v for k, v in f.items()}
                      for f in r.metrics.get("findings", [])]} for c, r in refused]
    if as_json:
        print(json.dumps({"op": op, "refused": items}, indent=2))
        return
    for it in items:
        print(f"autokernel bench: {one_line(Path(it['path']).name, 120)}: refused by the gate's static stage, not "
              f"timed: {it['reason']}: {it['detail']}")
        for f in it["findings"][1:]:
            print(f"  line {f.get('line', '?')}: {f.get('reason')}: {f.get('detail')}")


def _ci(x: Interval | None, fmt: str = ".3g") -> str:
    return "" if x is None else f"{x.est:{fmt}} [{x.lo:{fmt}}–{x.hi:{fmt}}]"


def render(m: Measurement, console: Console, incumbent: str | None = None, flops: bool = True) -> None:
    """The tables and verdicts; `incumbent` names the incumbent (default kernels/<op>.py; a target's own file);
    flops=False: the op declares no FLOP count (a target's), its GFLOP/s column stays empty."""
    inc = m.files[0] if m.files and m.files[0].role == "incumbent" else None
    cands: list[FileResult | None] = [f for f in m.files if f.role == "candidate"] or ([None] if inc else [])
    conf = f"{m.policy['confidence']:.0%} CI"
    base = incumbent or f"kernels/{m.op}.py"
    for c in cands:
        title = f"{m.op}: {one_line(Path(c.path).name)} vs {base}" if c else f"{m.op}: {base}"
        t = Table(title=escape(f"{title} — {m.label}"), title_justify="left")
        t.caption = escape(f"[lo–hi]: {conf}")
        for col in ("shape", "dtype", "calls", "rounds", "incumbent ms", "candidate ms", "speedup", "GB/s",
                    "GFLOP/s", "% of peak", "note"):
            t.add_column(col, justify="left" if col in ("shape", "note") else "right",
                         no_wrap=col != "note", overflow="fold")
        if c is not None and c.status != "ok":
            console.print(escape(f"{title} — {m.label}"), highlight=False)
            console.print(f"  [red]rejected[/red] {c.status}: " + escape(c.detail), highlight=False)
            continue
        shown = c or inc
        assert shown is not None  # None stands in for a candidate only when there is an incumbent
        rows = shown.shapes
        for k, s in enumerate(rows):
            i = inc.shapes[k] if inc and k < len(inc.shapes) else None
            pct = "" if s.fraction_of_peak is None else f"{100 * s.fraction_of_peak:.3g}"
            t.add_row(*map(escape, (" ".join(f"{a}={b}" for a, b in s.shape.items()), s.dtype, str(s.calls),
                                    str(s.reps), _ci(i.median_ms) if i else "", _ci(s.median_ms) if c else "",
                                    _ci(s.speedup, ".3f"), f"{s.gbps:.3g}", f"{s.gflops:.3g}" if flops else "", pct,
                                    s.implausible)))
        if m.label == CPU_LABEL:
            t.caption += f"; every time is {m.clock or CPU_LABEL}: what the interpreter does, never GPU speed"
        console.print(t)
        if c is not None:
            _verdict(c, m, console)
    if m.peak:
        console.print(f"  peak: {m.peak['name']} {m.peak['gbps']:.4g} GB/s ({m.peak['source']}); "
                      f"isolation: {m.isolation}", highlight=False)
    if m.rounds:
        cpu = [j["cpu_s"] / j["wall_s"] for j in m.jobs if j.get("wall_s") and j.get("cpu_s", -1) >= 0]
        reps = sorted({j["reps"] for j in m.jobs})
        console.print(f"  {m.rounds} rounds, each file timed in a fresh sandboxed process per round ({len(m.jobs)} "
                      f"jobs, {reps[0]}-{reps[-1]} repetitions each); clock: {m.clock}; job CPU/wall median "
                      f"{np.median(cpu) if cpu else float('nan'):.2f}", highlight=False)


def _verdict(c: FileResult, m: Measurement, console: Console) -> None:
    line = escape(f"  weighted speedup {_ci(c.speedup, '.3f')} ({m.policy['confidence']:.0%} CI, {m.label}): ")
    if c.accepted:
        console.print(line + f"[green]accepted[/green] (lower bound above {m.policy['min_speedup']:g})",
                      highlight=False)
    else:
        console.print(line + f"[red]not accepted[/red] {c.reason}: " + escape(c.detail), highlight=False)
