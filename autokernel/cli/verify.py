"""`autokernel verify OP CANDIDATE.py [--trace DIR] [--seed S] [--json] [--cluster ADDR] [--policy FILE]`: exit 0
accepted, 1 rejected, 2 bad input."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

from autokernel.errors import UserError


def _traced_shapes(trace: Path, op: str) -> list[dict[str, int]]:
    """The distinct shapes of `op` in a trace (autokernel.profile.trace, the one reader); another device's trace
    still gives its shapes."""
    from autokernel.profile import trace as trace_mod
    return trace_mod.shapes(trace_mod.load_trace(trace, check_device=False), op)


def verify_command(op: str, candidate: Path, trace: Path | None = None, seed: int | None = None,
                   as_json: bool = False, cluster: str | None = None, policy_file: Path | None = None,
                   repo: Path | None = None) -> int:
    """Run the gate on one candidate and print the verdict; returns the exit code (0 accepted, 1 rejected, 2 bad
    input). `cluster`: a Ray address to run the job on (autokernel/cluster.py; RAY_ADDRESS too), else this machine.
    The checkout is the one verify runs in (autokernel.paths): its policy (policy.for_checkout, or `policy_file`),
    its kernels/<op>.py's launcher signature (a regular file inside it that parses, else exit 2), its sandbox/ for
    the run directory (the user's cache directory when there is no checkout here). `repo`: a target checkout with an
    autokernel.toml (docs/targets.md): OP is one of its declared ops (autokernel/target/gate.py)."""
    from autokernel.ops import OPS
    if repo is not None:
        return _verify_target(Path(repo), op, Path(candidate), seed, as_json, policy_file, trace)
    try:
        if op not in OPS:
            raise UserError(f"unknown op '{op}'; known ops: {', '.join(OPS)}")
        candidate = Path(candidate)
        if not candidate.is_file():
            raise UserError(f"{candidate}: no such candidate file")
        shapes = _traced_shapes(Path(trace), op) if trace else None
        from autokernel import paths
        from autokernel import policy as policy_mod
        layout = paths.target()  # the signature is the incumbent's of the checkout verify runs in
        policy = policy_mod.for_checkout(layout.root, policy_file, flags=policy_mod.flags(cluster=cluster),
                                         uses=policy_mod.RUNS_CODE)
        kernels_dir = paths.INSTALLED_LAYOUT.kernels  # a checkout without this op: the installed project's
        if os.path.lexists(layout.kernels / f"{op}.py"):
            paths.read_python(layout.kernels / f"{op}.py", layout.root)
            kernels_dir = layout.checked_kernels()
        from autokernel import sandbox
        sandbox.preflight(policy.sandbox, untrusted_author=layout.foreign)  # another checkout's kernels: rule 6
        from autokernel.cluster import executor
        verify = executor(cluster, policy).verify  # gate.verify itself, or the same run as a Ray task
        v = verify(op, candidate, shapes=shapes, seed=seed, policy=policy, kernels_dir=kernels_dir,
                   run_dir=layout.run_dir("verify", op))
    except (OSError, UserError) as e:
        return _error(op, candidate, e, as_json)
    return _shown(v, as_json)


def _verify_target(repo: Path, op: str, candidate: Path, seed, as_json: bool, policy_file, trace=None) -> int:
    from autokernel import policy as policy_mod
    from autokernel.target import gate
    from autokernel.target.declaration import checkout_root
    try:
        if not candidate.is_file():
            raise UserError(f"{candidate}: no such candidate file")
        root = checkout_root(repo)
        policy = policy_mod.for_checkout(root, policy_file, uses=policy_mod.RUNS_CODE)
        v = gate.verify(root, op, candidate, policy=policy, seed=seed, trace=trace and Path(trace))
    except (OSError, UserError) as e:
        return _error(op, candidate, e, as_json)
    return _shown(v, as_json)


def _shown(v, as_json: bool) -> int:
    """The verdict printed (JSON, or the table); exit 0 accepted, 1 rejected."""
    if as_json:
        print(v.to_json())
    else:
        show(v)
    return 0 if v.accepted else 1


def _error(op: str, candidate, e: Exception, as_json: bool) -> int:
    """Bad input or environment: one line on stderr (escapes stripped: it may name a checkout's file), and with
    --json a JSON object on stdout too, so a machine reading stdout still gets JSON. Exit code 2."""
    from autokernel.untrusted import line
    msg = line(e, 1000)
    print(f"autokernel verify: error: {msg}", file=sys.stderr)
    if as_json:
        print(json.dumps({"op": line(op, 100), "candidate": line(candidate, 500), "verdict": "error", "error": msg,
                          "exit_code": 2}, indent=2))
    return 2


def show(v) -> None:
    """A readable summary: one row per stage, the reason and detail of a failure, where the artifacts are."""
    from rich.table import Table

    from autokernel.cli.console import make as make_console
    from autokernel.untrusted import markup  # details and names come from the candidate: no markup, no escapes

    console = make_console()
    table = Table(title=markup(f"verify {v.op}: {v.candidate}"), title_justify="left")
    for col in ("stage", "result", "reason", "detail", "time"):
        table.add_column(col, overflow="fold")
    for s in v.stages:
        result = "[green]pass[/green]" if s.passed else "[red]FAIL[/red]"
        table.add_row(markup(s.name), result, markup(s.reason or ""), markup(s.detail), f"{s.elapsed_s:.1f} s")
    console.print(table)
    word = "[bold green]ACCEPTED[/bold green]" if v.accepted else "[bold red]REJECTED[/bold red]"
    dev = v.device.get("gpu") or f"{v.device.get('kind')} ({v.device.get('cpu')})"
    console.print(f"{word}  sha256 {v.candidate_sha256[:12]}  seed {v.seed}  {v.elapsed_s:.1f} s on {dev}")
    if v.device.get("timing_note"):
        console.print(f"[dim]{v.device['timing_note']}[/dim]")
    console.print(f"[dim]verdict: {markup(v.run_dir)}/verdict.json[/dim]")


def register(app) -> None:
    """Add `verify` to the autokernel typer app (autokernel.cli calls this)."""

    import typer

    @app.command("verify")
    def _verify(op: str = typer.Argument(..., help="The op whose kernel the candidate replaces (kernels/OP.py)."),
                candidate: Path = typer.Argument(..., help="The candidate file: a complete kernels/OP.py."),
                trace: Optional[Path] = typer.Option(None, help="A traces/<run>/ dir: check its shapes of OP."),
                seed: Optional[int] = typer.Option(None, help="Reproduce a verdict's inputs (default: a fresh "
                                                                 "secret seed)."),
                json_out: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
                cluster: Optional[str] = typer.Option(None, help="Run the gate job on this Ray cluster (ray://host:"
                                                                 "10001; default: RAY_ADDRESS, else this machine)."
                                                      ),
                policy_file: Optional[Path] = typer.Option(None, "--policy", help="policies.yaml to use instead of "
                                                           "the checkout's (trusted: your own choice)."),
                repo: Optional[Path] = typer.Option(None, help="A target checkout with an autokernel.toml: OP is one "
                                                               "of its declared ops (docs/targets.md)."),
                ) -> None:
        """Run the gate (static, runtime, numeric, ...) on a candidate kernel. Exit 0 accepted, 1 rejected."""
        sys.exit(verify_command(op, candidate, trace, seed, json_out, cluster, policy_file, repo))
