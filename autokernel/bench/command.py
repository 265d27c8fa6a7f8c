"""`autokernel bench OP [CANDIDATE.py ...] [--trace TRACE] [--json]`: exit 0 a candidate accepted; 1 none accepted, or
the gate's static stage refuses a candidate (nothing is timed then); 2 bad input or an incumbent that cannot be
timed."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from autokernel import device, paths
from autokernel import policy as policy_mod
from autokernel.bench.measure import CPU_LABEL, FileResult, IncumbentFailed, Measurement, measure
from autokernel.bench.stats import Interval
from autokernel.errors import UserError
from autokernel.ops import OPS, get
from autokernel.untrusted import data
from autokernel.untrusted import line as one_line
from autokernel.untrusted import markup as escape  # markup-escaped AND control characters stripped


def _cases(op: str, trace: Path | None) -> list[dict]:
    spec = get(op)
    default = str(device.default_dtype()).removeprefix("torch.")
    if trace is None:  # no trace: the model's own shapes, one call each
        return [{"shape": dict(s), "calls": 1, "dtype": default} for s in spec.model_shapes]
    from autokernel.profile import trace as trace_mod
    cases = trace_mod.cases(trace_mod.load_trace(trace, check_device=False), op)
    known = {str(d).removeprefix("torch.") for d in spec.dtypes}
    for c in cases:
        c["dtype"] = c["dtype"] or default
        if c["dtype"] not in known:
            raise UserError(f"{trace}: dtype '{c['dtype']}' of op '{op}' is not one of {sorted(known)}")
    return cases


def _check_inputs(op: str, candidates: list[Path], incumbent: Path, root: Path) -> None:
    """Bad input is exit 2 before anything runs; the incumbent must be a regular file inside `root` (the checkout's
    own, or, given with --incumbent, wherever the user keeps it) that parses (autokernel.paths.read_python)."""
    if op not in OPS:
        raise UserError(f"unknown op '{op}'; known ops: {', '.join(OPS)}")
    try:
        get(op)
    except ImportError as e:
        raise UserError(f"op '{op}' has no trusted spec yet (autokernel/ops/{op}.py): {e}") from None
    if not os.path.lexists(incumbent):
        raise UserError(f"{incumbent}: no incumbent kernel for op '{op}'")
    paths.read_python(incumbent, root)
    for c in candidates:
        if not Path(c).is_file():
            raise UserError(f"{c}: no such candidate file")
        if Path(c).suffix != ".py":
            raise UserError(f"{c}: a candidate is a Python file replacing kernels/{op}.py")


def _refused(op: str, candidates: list[Path], incumbent: Path, policy: policy_mod.Policy) -> list[tuple[Path, object]]:
    """The gate's static stage on every candidate, before anything runs: what the gate refuses is never timed
    (a file it refuses would be rejected by `autokernel verify` anyway, and timing runs the file's code)."""
    from autokernel.gate import static
    out = []
    for c in candidates:
        try:
            source = c.read_bytes()
        except OSError as e:
            raise UserError(f"{c}: cannot read the candidate ({e.strerror})") from None
        res = static.check_source(source, op, incumbent, policy=policy)
        if not res.passed:
            out.append((c, res))
    return out


def _print_refused(op: str, refused: list[tuple[Path, object]], as_json: bool) -> None:
    """Exit 1 (a clean negative), with the static findings; candidate-derived text is reduced to plain lines."""
    items = [{"path": str(c), "stage": "static", "reason": r.reason, "detail": one_line(r.detail, 500),
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


def bench_command(op: str, candidates: list[Path], trace: Path | None, as_json: bool, *,
                  policy: policy_mod.Policy | None = None, job_root: Path | None = None,
                  incumbent: Path | None = None, policy_file: Path | None = None, repo: Path | None = None) -> int:
    """Benchmark kernels/OP.py against each candidate and print a table (or JSON).

    `policy` defaults to policy.for_checkout on the target checkout (or `policy_file`, --policy); `job_root` (where
    each job's directory goes) to the target checkout's sandbox/ (autokernel.paths: the user's cache directory when
    there is no checkout here); `incumbent` to that checkout's kernels/OP.py (another file, e.g. the base commit's
    kernel from `git show`, compares a branch against its base). Exit 2 (with --json, a JSON error object too) on
    bad input: an incumbent that is not a regular file of the checkout, or does not parse, is named, never quoted.
    `repo`: a target checkout with an autokernel.toml; OP is one of its declared ops (autokernel/target/bench.py).
    """
    if repo is not None:
        from autokernel.target.bench import bench_target
        return bench_target(Path(repo), op, candidates, trace, as_json, policy=policy, policy_file=policy_file,
                            incumbent=incumbent, run_dir=job_root)
    candidates = [Path(c) for c in candidates]
    try:
        layout = paths.target()
        if incumbent is not None:  # the user's own file (e.g. from `git show`): any regular file that parses
            incumbent, root = Path(incumbent), Path(incumbent).resolve().parent
        else:
            incumbent, root = layout.kernels / f"{op}.py", layout.root
        _check_inputs(op, candidates, incumbent, root)
        cases = _cases(op, trace)
        if policy is None:
            policy = policy_mod.for_checkout(layout.root, policy_file, policy_mod.flags(),
                                             uses=policy_mod.RUNS_CODE)
        refused = _refused(op, candidates, incumbent, policy)
        if refused:
            _print_refused(op, refused, as_json)
            return 1
        m = measure(op, candidates, cases, policy, job_root or layout.sandbox, incumbent=incumbent)
    except (UserError, IncumbentFailed) as e:
        print(f"autokernel bench: {one_line(e)}", file=sys.stderr)  # one line, never wrapped
        if as_json:  # a machine reading stdout still gets JSON
            print(json.dumps({"op": one_line(op, 100), "error": one_line(e, 1000), "exit_code": 2}, indent=2))
        return 2
    if as_json:
        print(json.dumps(data(m.to_dict()), indent=2, default=str))
    else:
        console = Console()
        if not console.is_terminal:  # logs and pipes: rich would wrap the table at 80 columns
            console = Console(width=160)
        render(m, console)
    return 0 if m.accepted else 1


def _ci(x: Interval | None, fmt: str = ".3g") -> str:
    return "" if x is None else f"{x.est:{fmt}} [{x.lo:{fmt}}–{x.hi:{fmt}}]"


def render(m: Measurement, console: Console, incumbent: str | None = None, flops: bool = True) -> None:
    """The tables and verdicts; `incumbent` names the incumbent (default kernels/<op>.py; a target's own file);
    flops=False: the op declares no FLOP count (a target's), its GFLOP/s column stays empty."""
    inc = m.files[0] if m.files and m.files[0].role == "incumbent" else None
    cands = [f for f in m.files if f.role == "candidate"] or ([None] if inc else [])
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
        rows = (c or inc).shapes
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
