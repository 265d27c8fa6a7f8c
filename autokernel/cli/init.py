"""`autokernel init [--repo PATH] [--engine module:function] [--force] [--policy FILE]`: run a checkout's engine
workload once in the sandbox, list every Triton kernel it launched and the function that launched it, and write the
starting declaration (autokernel.toml: one [ops.<name>] table per kernel file, `reference = "TODO"` for the user). The
work: autokernel/target/init.py.

Exit 0 written; 2 bad input (no engine entry, a declaration that already declares ops without --force, an engine
that raises or launches nothing, a file outside the checkout or a symlink), with nothing written.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from autokernel.target import declaration as decl
from autokernel.target import discover


def init_command(repo: Path | None, engine: str | None, force: bool, policy_file: Path | None) -> int:
    from autokernel import policy
    from autokernel.target import init as target_init
    root = decl.checkout_root(repo)
    pol = policy.for_checkout(root, policy_file, uses=("sandbox",))
    found, build, d, job_dir = target_init.discovery(root, engine, force, pol)
    show(d)
    verb = target_init.declare(root, found, build, d, job_dir)
    typer.echo(f"{verb} {root / decl.NAME}: {len(d.ops)} op(s) ({', '.join(op.name for op in d.ops)}); "
               "next: set each reference (docs/targets.md)")
    for op in d.ops:
        if not any(x.plain for x in op.launchers()):  # declared launchers = ["TODO"]: say why, not only in the file
            sites = sorted({f"{x.site.file}:{x.site.function}" for x in op.launches if x.site is not None})
            typer.echo(f"warning: [ops.{op.name}] has no launcher in {op.file}"
                       + (f" (its kernels are launched from {', '.join(sites[:3])})" if sites else "")
                       + ": a launcher is a plain function of the kernel's own file; move or wrap the launch there, "
                       "or set protected = true", err=True)
    typer.echo(f"discovery record: {job_dir / 'discovery.json'}")
    return 0


def show(d: discover.Discovery) -> None:
    from rich.console import Console
    from rich.table import Table

    from autokernel.untrusted import markup
    t = d.timings
    calls = sum(x.calls for x in d.launches)
    kernels = len({(x.kernel_file, x.kernel) for x in d.launches})
    mode = ("CPU interpreter: times are interpreter times" if d.interpreted
            else "compiled: launch times between device synchronisations")
    typer.echo(f"ran {d.build} in the sandbox ({d.isolation}): build {t.get('build_s', 0):.1f} s, workload "
               f"{t.get('workload_s', 0):.1f} s, {calls} Triton launches of {kernels} kernel(s) ({mode})")
    total_s = sum(x.seconds for x in d.launches) or 1.0
    table = Table(title_justify="left")
    for col in ("op", "kernel", "launched from", "calls", "time", "arguments (first layout)"):
        table.add_column(col, overflow="fold")
    ops = {x.kernel_file: op.name for op in d.ops for x in op.launches}
    for x in sorted(d.launches, key=lambda x: -x.seconds):
        site = f"{x.site.file}:{x.site.function}" if x.site else "-"
        table.add_row(markup(ops.get(x.kernel_file, "(not in the checkout)")), markup(x.kernel), markup(site),
                      str(x.calls), f"{100 * x.seconds / total_s:.0f}%",
                      markup(discover.describe(x.signatures[0], 4) if x.signatures else ""))
    Console().print(table)
    if d.pinned:
        typer.echo("autotuned kernels ran one config each under the interpreter: "
                   + ", ".join(f"{k} (1 of {v})" for k, v in d.pinned.items()))


def register(app: typer.Typer) -> None:
    @app.command("init")
    def init(
        repo: Optional[Path] = typer.Option(None, help="The checkout (default: the git work tree here)."),
        engine: Optional[str] = typer.Option(None, help="The engine entry \"package.module:function\" for a new "
                                                        "declaration (default: `build` in autokernel.toml's engine "
                                                        "table)."),
        force: bool = typer.Option(False, "--force", help="Replace a declaration that already declares ops."),
        policy_file: Optional[Path] = typer.Option(None, "--policy", help="policies.yaml for the sandbox's limits "
                                                                          "(default: the checkout's, trust rule 6)."),
    ):
        """Discover a checkout's Triton kernels: run its engine's workload in the sandbox, list each kernel launched
        and the function that launched it, and write the starting declaration (autokernel.toml). Exit 0 written,
        2 bad input (nothing written)."""
        raise typer.Exit(init_command(repo, engine, force, policy_file))
