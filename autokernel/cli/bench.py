"""`autokernel bench OP [CANDIDATE.py ...] [--trace TRACE] [--json]`: exit 0 a candidate accepted; 1 none accepted, or
the gate's static stage refuses a candidate (nothing is timed then); 2 bad input or an incumbent that cannot be
timed."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from autokernel import device, paths
from autokernel import policy as policy_mod
from autokernel.bench.measure import IncumbentFailed, check_inputs, measure, refusals
from autokernel.bench.show import print_refused, render  # re-exported: render is the bench's table
from autokernel.errors import UserError
from autokernel.ops import get
from autokernel.untrusted import data
from autokernel.untrusted import line as one_line


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
        from autokernel.target.declaration import checkout_root
        try:
            root = checkout_root(Path(repo))
            if policy is None:
                policy = policy_mod.for_checkout(root, policy_file, uses=policy_mod.RUNS_CODE)
        except (UserError, OSError) as e:
            return _failed(op, e, as_json)
        return bench_target(root, op, candidates, trace, as_json, policy=policy, incumbent=incumbent,
                            run_dir=job_root)
    candidates = [Path(c) for c in candidates]
    try:
        layout = paths.target()
        if incumbent is not None:  # the user's own file (e.g. from `git show`): any regular file that parses
            incumbent, root = Path(incumbent), Path(incumbent).resolve().parent
        else:
            incumbent, root = layout.kernels / f"{op}.py", layout.root
        check_inputs(op, candidates, incumbent, root)
        cases = _cases(op, trace)
        if policy is None:
            policy = policy_mod.for_checkout(layout.root, policy_file, policy_mod.flags(),
                                             uses=policy_mod.RUNS_CODE)
        from autokernel import sandbox
        sandbox.preflight(policy.sandbox, untrusted_author=layout.foreign)  # another checkout's kernels: rule 6
        refused = refusals(op, candidates, incumbent, policy)
        if refused:
            print_refused(op, refused, as_json)
            return 1
        m = measure(op, candidates, cases, policy, job_root or layout.sandbox, incumbent=incumbent)
    except (UserError, IncumbentFailed) as e:
        return _failed(op, e, as_json)
    if as_json:
        print(json.dumps(data(m.to_dict()), indent=2, default=str))
    else:
        from autokernel.cli.console import make
        render(m, make())
    return 0 if m.accepted else 1


def _failed(op: str, e: Exception, as_json: bool) -> int:
    """Bad input: one line on stderr, never wrapped (with --json a JSON error object on stdout too: a machine reading
    stdout still gets JSON); exit 2."""
    print(f"autokernel bench: {one_line(e)}", file=sys.stderr)
    if as_json:
        print(json.dumps({"op": one_line(op, 100), "error": one_line(e, 1000), "exit_code": 2}, indent=2))
    return 2


def bench(
    op: str = typer.Argument(..., help="The op (kernels/<op>.py is the incumbent)."),
    candidates: List[Path] = typer.Argument(None, help="Candidate files replacing kernels/<op>.py."),
    trace: Optional[Path] = typer.Option(None, help="traces/<run>/ whose shape corpus and call counts weight the "
                                                    "shapes (default: the op's model shapes, equal weights)."),
    as_json: bool = typer.Option(False, "--json", help="JSON for machines."),
    incumbent: Optional[Path] = typer.Option(None, help="The file to compare against (default: kernels/<op>.py of "
                                                        "the checkout here); e.g. a base commit's kernel from "
                                                        "`git show BASE:kernels/<op>.py`."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="policies.yaml to use instead of the "
                                                                      "checkout's (trusted: your own choice)."),
    repo: Optional[Path] = typer.Option(None, help="A target checkout with an autokernel.toml: OP is one of its "
                                                   "declared ops, the incumbent its file (docs/targets.md)."),
):
    """A/B timing of the incumbent against candidates, each file in fresh sandboxed processes, with confidence
    intervals over rounds. Exit 0 if one wins; 1 if none wins or the gate's static stage refuses a candidate (then
    nothing is timed); 2 on bad input."""
    raise typer.Exit(bench_command(op, list(candidates or []), trace, as_json, incumbent=incumbent,
                                   policy_file=policy_file, repo=repo))


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
