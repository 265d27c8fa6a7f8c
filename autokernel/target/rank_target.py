"""`autokernel rank` for a target's trace (autokernel/target/profile_target.py): the declared ops by expected
end-to-end gain (share of the workload x headroom to the roofline, autokernel/profile/rank.py's rule) where the op
declares `work` (its FLOP/byte counts), by time share where it does not, with their launches,
launcher call sites and the layouts the workload called them with; then the protected or excluded ones, then the
kernels no op declares ("(not declared)"). Interpreter times are labelled as such, never shown as GPU figures.

The trace is read back from the checkout's traces/, which is untrusted (trust rule 6): it must be a regular file
inside the checkout, and every string shown goes through autokernel.untrusted.markup.
"""
from __future__ import annotations

import json
from pathlib import Path

from autokernel.errors import UserError

NOT_DECLARED = "(not declared)"


def is_target(t: dict) -> bool:
    return isinstance(t.get("target"), dict)


def load(root: Path, path: Path | None = None) -> dict:
    """The trace at `path`, else the newest run under the checkout's traces/ (a regular file inside it)."""
    from autokernel import paths
    from autokernel.profile import trace
    if path is None:
        traces = paths.Layout(root).traces  # refuses a symlinked traces/
        runs = sorted(traces.glob("*/summary.json"), key=lambda p: p.lstat().st_mtime) if traces.is_dir() else []
        if not runs:
            raise UserError(f"no trace under {traces}/: run `autokernel profile --repo {root}` first")
        path = paths.regular_inside(runs[-1], root)
    t: dict = dict(trace.load_trace(path))  # a Trace, with the target's own fields ("target", "not_declared")
    if not is_target(t):
        raise UserError(f"{t['_path']}: a trace of the embedded engine, not of the target {root}: pass a trace "
                        f"written by `autokernel profile --repo {root}`")
    return t


def rank(t: dict, policy=None) -> list[dict]:
    """The declared ops, targets first by share of launch time, then the excluded ones (protected, denied, not
    allowed: the declaration's `protected`, then the policy's ops section), each {op, status, ...entry}."""
    from autokernel.profile.rank import status_of
    rows = []
    for op, e in t["ops"].items():
        status = "protected" if e.get("protected") else status_of(op, policy) if policy is not None else \
            e.get("status", "target")
        rows.append({"op": op, **e, "status": status, **_roofline(e, t.get("roofline") or {})})
    rows.sort(key=lambda r: (r["status"] != "target", -(r["gain"] if r["gain"] is not None else r["e2e_share"])))
    return rows


def _roofline(e: dict, peaks: dict) -> dict:
    """{roof_ms, headroom, gain, bound}: the op's calls at the roofline of the trace's peaks, when every layout has
    its work counts (numbers checked: the trace is read back from the checkout); None each otherwise."""
    from autokernel.profile.rank import roof_ms
    shapes = e.get("shapes") or []
    none = {"roof_ms": None, "headroom": None, "gain": None, "bound": None}
    ok = shapes and all(all(type(s.get(k)) in (int, float) and 0 <= s[k] < 2 ** 63 for k in ("flops", "bytes", "calls"))
                        and isinstance(s.get("dtype"), str) for s in shapes)
    total, share = e.get("total_ms"), e.get("e2e_share", e.get("share"))
    if not ok or not (type(total) is float and total > 0) or type(share) is not float:
        return none
    roof, bound = roof_ms({"shapes": shapes}, peaks)
    if roof is None:
        return none
    headroom = max(0.0, 1.0 - roof / total)
    return {"roof_ms": roof, "headroom": headroom, "gain": share * headroom, "bound": bound}


def _layouts(e: dict, limit: int = 3) -> str:
    """'X float32 (1, 7, 64) ×5; X float32 (1, 1, 64) ×20' from the op's first tensor per layout."""
    parts = []
    for s in sorted(e.get("shapes") or [], key=lambda s: -s["calls"])[:limit]:
        first = next(iter(s.get("sizes") or {}), None)
        what = f"{first} {s['dtypes'][first]} {tuple(s['sizes'][first])}" if first else s.get("args", "")
        parts.append(f"{what} ×{s['calls']}")
    more = len(e.get("shapes") or []) - limit
    return "; ".join(parts) + (f"; +{more} more" if more > 0 else "")


def _sites(e: dict) -> str:
    """'rms_norm_forward:483' (a function of the op's own file), else 'file:function:line'."""
    out = []
    for k, v in (e.get("sites") or {}).items():
        file, _, fn = k.rpartition(":")
        out.append(f"{fn if file == e.get('file') else k}:{','.join(map(str, v.get('lines', [])))}")
    return " ".join(out)


def print_rank(t: dict, ranked: list[dict]) -> None:
    from rich.console import JustifyMethod
    from rich.table import Table

    from autokernel.profile.show import console as _console
    from autokernel.profile.show import num
    from autokernel.profile.show import pct as _pct
    from autokernel.target.profile_target import TIMING
    from autokernel.untrusted import markup
    console = _console()
    tg, timing, totals = t["target"], t.get("timing", {}), t.get("totals", {})
    # the label follows the device the trace was taken on (load_trace checked it is this machine's kind), never the
    # file's own words: a trace may be the checkout's, which called CPU interpreter times CUDA's
    interp = tg.get("interpreted") is True or (t.get("device") or {}).get("kind") != "cuda"
    label, note = TIMING[interp]
    ms = {k: totals.get(k) / 1e3 if type(totals.get(k)) in (int, float) else None for k in ("workload_ms", "launch_ms")}
    console.print(f"[bold]{markup(t.get('run_id'))}[/] · target {markup(tg.get('build'))} ({markup(tg.get('root'))})"
                  f" · {num(totals.get('calls'))} Triton launches · workload {num(ms['workload_ms'], '.1f')} s, "
                  f"launches {num(ms['launch_ms'], '.1f')} s of it")
    console.print(f"timing: [bold yellow]{markup(label)}[/] — {markup(note)}")
    roof = any(r.get("gain") is not None for r in ranked)
    console.print(f"ranked by {markup(timing.get('ranking') or 'time share alone')}" + (
        f" · peaks: {markup((t.get('roofline') or {}).get('source'))}" if roof else ""))
    table = Table(show_lines=False)
    unit = "interpreter ms" if interp else "synced ms"
    extra: list[tuple[str, JustifyMethod]] = [("headroom", "right"), ("gain", "right"), ("bound", "left")] if roof \
        else []
    columns: list[tuple[str, JustifyMethod]] = [
        ("#", "right"), ("op", "left"), ("launches", "right"), (unit, "right"), ("share", "right"),
        ("of workload", "right"), *extra, ("kernels", "left"), ("launched from", "left"), ("layouts (calls)", "left")]
    for col, just in columns:
        table.add_column(col, justify=just, overflow="fold")
    n = 0
    for r in ranked:
        target = r["status"] == "target"
        n += target
        cells = [_pct(r.get("headroom")), _pct(r.get("gain")), markup(r.get("bound") or "—")] if roof else []
        table.add_row(str(n) if target else "—", markup(r["op"]) + ("" if target else
                                                                     f" [dim]({markup(r['status'])})[/]"),
                      num(r["calls"]), num(r["total_ms"], ".1f"), _pct(r["share"]), _pct(r.get("e2e_share")), *cells,
                      markup(" ".join(k["kernel"] for k in r.get("kernels", []))), markup(_sites(r)),
                      markup(_layouts(r)), style=None if target else "dim")
    for x in t.get("not_declared") or []:
        table.add_row("—", NOT_DECLARED, num(x["calls"]), num(x["total_ms"], ".1f"), _pct(x["share"]), "—",
                      *(["—"] * len(extra)), markup(x["kernel"]), markup(x.get("site") or x["kernel_file"]), "",
                      style="dim")
    console.print(table)
    console.print("[dim]share: of all Triton launch time in the workload · of workload: of its wall time · "
                  f"{NOT_DECLARED}: launched, in no \\[ops] table of autokernel.toml · protected ops are listed, never "
                  "targets[/]")


def print_op(t: dict, op: str) -> None:
    from rich.table import Table

    from autokernel.profile.show import console as _console
    from autokernel.untrusted import markup
    e = t["ops"][op]
    console = _console()
    table = Table(title=f"{op}: the layouts its launchers were called with ({e['file']})", title_justify="left")
    for col in ("launcher", "calls", "arguments", "written in place"):
        table.add_column(col, overflow="fold")
    written = {c["launcher"]: ", ".join(c.get("written") or []) for c in e.get("launcher_calls") or []}
    for s in e.get("shapes") or []:
        table.add_row(markup(s["launcher"]), str(s["calls"]), markup(s["args"]), markup(written.get(s["launcher"], "")))
    console.print(table)


def to_json(t: dict, ranked: list[dict], op: str | None = None) -> str:
    doc = {"trace": t["_path"], "run_id": t.get("run_id"), "device": t.get("device"), "target": t.get("target"),
           "timing": t.get("timing"), "totals": t.get("totals"),
           "ranking": (t.get("timing") or {}).get("ranking") or "time share alone",
           "targets": [r for r in ranked if r["status"] == "target"],
           "excluded": [r for r in ranked if r["status"] != "target"],
           "not_declared": t.get("not_declared") or []}
    if op is not None:
        doc["op"] = {"name": op, **t["ops"][op]}
    return json.dumps(doc, indent=1)
