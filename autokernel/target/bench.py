"""`autokernel bench --repo CHECKOUT OP [CANDIDATE.py ...] [--trace TRACE] [--json]`: the benchmark autokernel's own
kernels get (autokernel/bench: every file in fresh sandboxed processes, interleaved A/B rounds, bootstrap intervals
over rounds, every kept output checked against the reference in the parent, the CPU-time clock under the
interpreter labelled as such), on a declared op of a target checkout (docs/targets.md, section 6).

What differs from autokernel's own ops is where the op's description comes from, as for `verify --repo`
(autokernel/target/gate.py):
- Cases: the layouts the workload called the op's launcher with (from TRACE's `launcher_calls`, written by
  `autokernel profile --repo` and read as `verify --repo --trace` reads them, gate.from_trace; else the workload
  runs once in the sandbox, recorded), each at the token size M it was called at, weighted by its call count: what
  production sends, nothing the gate's sweep adds.
- Several launchers: a candidate replaces the whole file, so the cases are every declared launcher's calls, each
  case's shape naming its launcher (each job calls it through that launcher, keeps that launcher's outputs, and the
  parent judges them against that launcher's reference). The figure that decides a win is the workload's time in
  the file, incumbent over candidate, over every launcher's calls (autokernel/bench/results.py, decide): a win on
  one launcher cannot hide a loss on another; each launcher's own figure is reported beside it.
- Files: the incumbent is the checkout's file; a candidate is a replacement for it. Each job imports the file under
  the checkout's module name with the checkout on its path, the interpreter layer installed and the incumbent's
  imports imported first, and keeps the declared outputs (autokernel/bench/job.py, as the gate's job does).
- Inputs are made here from the records (contract.spec's generator) and sent to each job as files.
- Outputs are judged against the checkout's reference, which runs in a sandboxed job of its own once per round on
  the value sets whose outputs were kept (contract.ReferenceTable); no checkout code runs in this process.
- The gate's static stage, relative to the incumbent, refuses before anything runs (exit 1, nothing timed).
Bad input (exit 2, one line): an undeclared op, a missing candidate, a "TODO" reference, a launcher the workload
never calls, a case past contract.MAX_CASE_BYTES (trust rule 7: the records come from the checkout). Nothing is
written into the checkout: run directories go to the user's cache.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from autokernel import paths, sandbox
from autokernel.errors import UserError
from autokernel.target import contract, discover
from autokernel.target import declaration as decl


def cases(spec, calls: discover.LauncherCalls) -> list[dict]:
    """One case per recorded layout and token size, {"shape": {"M", "layout"}, "calls", "dtype"}: the layouts of
    contract.layouts (spec.extra["layouts"]), each recorded signature's call count added to the case it maps to."""
    lays = spec.extra["layouts"]
    weight: dict[tuple[int, int], int] = {}
    for sig, n in zip(calls.signatures, calls.signature_calls):
        key = _placed(lays, sig)
        if key is not None:
            weight[key] = weight.get(key, 0) + n
    out = []
    for i, lay in enumerate(lays):
        for m in lay.m or (0,):
            shape = {"M": m, "layout": i}  # each within contract.MAX_CASE_BYTES: contract.spec refused it otherwise
            out.append({"shape": shape, "calls": weight.get((i, m), 1), "dtype": str(lay.dtype).removeprefix("torch.")})
    return out


def _placed(lays: list[contract.Layout], sig: list[tuple]) -> tuple[int, int] | None:
    """(layout index, M) of one recorded signature: the layout whose sizes at that M are the signature's."""
    d = dict(sig)
    for i, lay in enumerate(lays):
        if contract._skeleton(list(lay.args)) != contract._skeleton(sig):
            continue
        m = next((int(d[n][2][dims[0]]) for n, dims in lay.token.items() if dims), None)
        if m is None:
            m = next((int(d[n][1]) for n in lay.token_ints), 0)
        same = all(tuple(d[n][2]) == dims for n, dims in contract.shape_dims(lay, m).items()) and all(
            d[n][1] == (m if n in lay.token_ints else v[1]) for n, v in lay.args if v[0] == "int")
        if same:
            return i, m if lay.m else 0
    return None


def _candidates(candidates: list[Path], op: decl.Op) -> None:
    for c in candidates:
        if not c.is_file():
            raise UserError(f"{c}: no such candidate file")
        if c.suffix != ".py":
            raise UserError(f"{c}: a candidate is a Python file replacing {op.file}")


def _refused(candidates: list[Path], launchers: list[str], incumbent: Path, policy) -> list[tuple[Path, object]]:
    """The gate's static stage relative to the incumbent (what the incumbent does on the same node is excused), on
    every candidate for each declared launcher (as the gate runs it), before anything runs: what it refuses is never
    timed."""
    from autokernel.gate import static
    out: list[tuple[Path, object]] = []
    for c in candidates:
        for launcher in launchers:
            res = static.check_source(c.read_bytes(), launcher, incumbent, policy=policy, relative=True)
            if not res.passed:
                if len(launchers) > 1:
                    res.detail = f"{launcher}: {res.detail}"
                out.append((c, res))
                break
    return out


def launcher_cases(specs: list, calls: dict[str, discover.LauncherCalls]) -> tuple[object, list[dict]]:
    """(spec, cases) for the rounds: one launcher's, as `cases` makes them; with several, every launcher's cases in
    declaration order, each shape naming its launcher ({"M", "layout", "launcher"}), and one OpSpec over them whose
    extra["launchers"] maps each name to its own spec (autokernel/bench/rounds.py, Round.spec_of)."""
    if len(specs) == 1:
        return specs[0], cases(specs[0], calls[specs[0].extra["target"]["launcher"]])
    by = {sp.extra["target"]["launcher"]: sp for sp in specs}
    out = [{**c, "shape": {**c["shape"], "launcher": name}} for name, sp in by.items() for c in cases(sp, calls[name])]

    def mine(shape: dict):
        return by[shape["launcher"]]
    combined = dataclasses.replace(
        specs[0], make_inputs=lambda shape, *a, **k: mine(shape).make_inputs(shape, *a, **k),
        bytes_moved=lambda shape, dtype: mine(shape).bytes_moved(shape, dtype),
        flops=lambda shape: mine(shape).flops(shape), extra={**specs[0].extra, "launchers": by})
    return combined, out


def measure_target(root: Path, name: str, candidates: list[Path], policy, *, trace: Path | None = None,
                   incumbent: Path | None = None, run_dir: Path | None = None):
    """(Measurement, None), or (None, the static stage's refusals) when it refuses a candidate. `incumbent`: another
    file to time as the incumbent (a base commit's copy of the op's file); the static stage and the preloaded imports
    are still the checkout's file's. UserError on bad input (module docstring)."""
    from autokernel.bench.rounds import measure_rounds
    from autokernel.target import gate
    d, op = gate.declared_op(root, name)
    sandbox.preflight(policy.sandbox, untrusted_author=True)  # the checkout's engine and references: trust rule 6
    candidates = [Path(c) for c in candidates]
    _candidates(candidates, op)
    own = decl.checkout_file(root, root / op.file, f"[ops.{name}] file")
    refused = _refused(candidates, op.launchers, own, policy)
    if refused:
        return None, refused
    base = Path(run_dir) if run_dir else paths.user_cache() / "bench" / paths.run_name(name)
    calls = gate.from_trace(root, d, op, trace) if trace else gate.record(root, d, op, policy, base / "workload")
    try:
        spec, cases_ = launcher_cases(gate.specs(root, op, calls, base, policy), calls)
        m = measure_rounds(name, candidates, cases_, policy, base / "jobs", Path(incumbent or own), spec)
    except contract.ReferenceError as e:
        raise UserError(f"{d.path}: [ops.{name}] {e}") from None
    return m, None


def bench_target(root: Path, name: str, candidates: list[Path], trace: Path | None, as_json: bool, *, policy,
                 incumbent: Path | None = None, run_dir: Path | None = None) -> int:
    """`autokernel bench --repo` on the checkout `root` under `policy` (the command's: policy.for_checkout with uses
    RUNS_CODE): exit 0 a candidate accepted; 1 none accepted, or the static stage refused one (nothing timed); 2 bad
    input or an incumbent that cannot be timed (one line; with --json a JSON error too)."""
    from rich.console import Console

    from autokernel.bench.measure import IncumbentFailed
    from autokernel.bench.show import print_refused as _print_refused
    from autokernel.bench.show import render
    from autokernel.untrusted import data, line
    try:
        m, refused = measure_target(root, name, candidates, policy, trace=trace, incumbent=incumbent,
                                    run_dir=run_dir)
    except (UserError, IncumbentFailed, OSError) as e:
        print(f"autokernel bench: {line(e)}", file=sys.stderr)
        if as_json:
            print(json.dumps({"op": line(name, 100), "error": line(e, 1000), "exit_code": 2}, indent=2))
        return 2
    if refused:
        _print_refused(name, refused, as_json)
        return 1
    inc = Path(m.files[0].path)
    label = str(inc.relative_to(root)) if inc.is_relative_to(root) else str(inc)
    if as_json:
        print(json.dumps(data({**m.to_dict(), "incumbent": label, "checkout": str(root)}), indent=2, default=str))
    else:
        console = Console()
        if not console.is_terminal:  # logs and pipes: rich would wrap the table at 80 columns
            console = Console(width=160)
        render(m, console, incumbent=label, flops=False)  # a target declares no FLOP counts
        print_launchers(m, console, label)
    return 0 if m.accepted else 1


def print_launchers(m, console, incumbent: str) -> None:
    """A several-launcher op's figures per launcher, per file (nothing for one launcher): each launcher's share of
    the incumbent's time in the op, each file's time for the workload's calls of it, and its speedup there."""
    from autokernel.untrusted import line
    inc = m.files[0].launchers if m.files else []
    if not inc:
        return
    console.print(f"  per launcher ({m.label}), the workload's calls of each weighted by their call counts; share of "
                  "the incumbent's time: " + ", ".join(f"{r.launcher} {r.share:.0%}" for r in inc), highlight=False,
                  markup=False)
    for f in m.files:
        if f.status != "ok" or not f.launchers:
            continue
        name = incumbent if f.role == "incumbent" else line(Path(f.path).name, 120)
        console.print(f"    {name}: " + "; ".join(
            f"{r.launcher} {r.workload_ms:.4g} ms" + (f", {r.speedup}x" if r.speedup else "") for r in f.launchers)
            + ("" if f.role == "incumbent" or f.speedup is None else
               f"; over every launcher's calls {f.speedup}x (1 / sum of share / speedup: the workload's time)"),
            highlight=False, markup=False)
