"""`autokernel init [--repo PATH] [--engine module:function] [--force] [--policy FILE]`: run a checkout's engine
workload once in the sandbox, list every Triton kernel it launched and the function that launched it, and write the
starting declaration (autokernel.toml: one [ops.<name>] table per kernel file, `reference = "TODO"` for the user).

Exit 0 written; 2 bad input (no engine entry, a declaration that already declares ops without --force, an engine
that raises or launches nothing, a file outside the checkout or a symlink), with nothing written.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Optional

import typer

from autokernel.errors import UserError
from autokernel.target import declaration as decl
from autokernel.target import discover

HEADER = ("# autokernel target declaration (docs/targets.md). Written by `autokernel init`; fill in each op's\n"
          "# `reference` (a torch function with the launcher's signature), then check what it inferred.\n")


def checkout_root(repo: Path | None) -> Path:
    """--repo PATH (a directory), else the git work tree of the current directory, else the current directory."""
    if repo is not None:
        if not Path(repo).expanduser().is_dir():
            raise UserError(f"--repo {repo}: no such directory")
        return Path(repo).expanduser().resolve()
    here = Path.cwd().resolve()
    return next((d for d in (here, *here.parents) if (d / ".git").exists()), here)


def engine_entry(root: Path, found: decl.Declaration | None, engine: str | None, force: bool) -> str:
    """The engine's "module:function": --engine for a new declaration, else the declaration's [engine] build."""
    path = root / decl.NAME
    if found is not None and found.ops and not force:
        raise UserError(f"{path}: already declares {len(found.ops)} op(s) ({', '.join(list(found.ops)[:4])}); "
                        "autokernel init does not overwrite them: rerun with --force to replace the file")
    if found is not None and engine is not None and engine != found.build:
        raise UserError(f"{path} exists: set [engine] build = \"{engine}\" there (or drop --engine)")
    build = engine or (found.build if found is not None else None)
    if build is None:
        raise UserError(f"{path}: no engine entry: write [engine] build = \"package.module:function\" there, or pass "
                        "--engine package.module:function (a function of the checkout returning an object with "
                        "workload() and logits(ids); docs/targets.md)")
    return decl.entry(build, "--engine" if engine else f"{path}: [engine] build", root)


def init_command(repo: Path | None, engine: str | None, force: bool, policy_file: Path | None) -> int:
    from autokernel import paths, sandbox
    from autokernel import policy as policy_mod
    root = checkout_root(repo)
    found = decl.load(root)
    build = engine_entry(root, found, engine, force)
    policy = policy_mod.for_checkout(root, policy_file, uses=("sandbox",))
    sandbox.preflight(policy.sandbox, untrusted_author=False)
    job_dir = paths.user_cache() / "init" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    d = discover.run(root, build, policy, job_dir)
    show(d)
    if not d.ops:
        raise UserError(f"[engine] build = {build}: no launched kernel is defined in a file of the checkout {root} "
                        "(all came from installed packages); vendor the kernels you want tuned into the checkout")
    keep = found is not None and not found.ops  # an [engine]-only file the user wrote: keep it, add the ops
    head = paths.read_text(found.path, root).rstrip("\n") + "\n\n" if keep else (
        HEADER + f"\n[engine]\nbuild = {decl.quote(build)}\n\n")
    write(root / decl.NAME, head + render(d.ops))
    (job_dir / "discovery.json").write_text(json.dumps(record(d), indent=1))
    verb = "replaced" if found is not None and found.ops else "added to" if keep else "wrote"
    typer.echo(f"{verb} {root / decl.NAME}: {len(d.ops)} op(s) ({', '.join(op.name for op in d.ops)}); "
               "next: set each reference (docs/targets.md)")
    typer.echo(f"discovery record: {job_dir / 'discovery.json'}")
    return 0


def write(path: Path, text: str) -> None:
    """Through a temporary file in the same directory and a rename: a link at `path` is replaced, never followed."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".autokernel-", suffix=".toml")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def render(ops: list[discover.FoundOp]) -> str:
    total_s = sum(op.seconds for op in ops) or 1.0
    blocks = []
    for op in ops:
        lines = [f"[ops.{op.name}]"]
        for x in op.launches:
            where = f"{x.site.file}:{x.site.function}, line {', '.join(map(str, x.site.lines))}" if x.site else \
                "no function of the checkout"
            lines.append(f"# {x.kernel} (line {x.kernel_line}): {x.calls} launch{'es' * (x.calls != 1)} from {where}; "
                         f"{100 * x.seconds / total_s:.0f}% of the launch time")
            if x.signatures:
                more = f" (1 of {len(x.signatures)} layouts)" if len(x.signatures) > 1 else ""
                lines.append(f"#   arguments{more}: {discover.describe(x.signatures[0], 8)}")
        launchers = op.launchers()
        others = sorted({f"{x.site.file}:{x.site.function}" for x in op.launches
                         if x.site is not None and x.site.file != op.file})
        for o in others:
            lines.append(f"# also launched from {o}: not in this file, so a candidate for it cannot change that call")
        lines.append(f"file = {decl.quote(op.file)}")
        names = [s.function for s in launchers] or [decl.TODO]
        lines.append("launchers = [" + ", ".join(decl.quote(n) for n in names) + "]")
        sig = "; ".join(f"{s.function}({', '.join(s.params)})" for s in launchers) or "the launcher's"
        lines.append(f"reference = {decl.quote(decl.TODO)}  # \"module:function\": torch, with the signature {sig}")
        lines.append("# outputs = [0]  # which return values the gate compares (default: every tensor returned)")
        lines.append("# tolerance = { atol = 1e-5, rtol = 1e-5 }  # optional: replaces the derived tolerance")
        lines.append("protected = false")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def record(d: discover.Discovery) -> dict:
    """The discovery as data (written next to the job's log): every launch group the parent accepted."""
    return {"build": d.build, "isolation": d.isolation, "interpreted": d.interpreted, "pinned_autotune": d.pinned,
            "timings_s": d.timings,
            "launches": [{"kernel": x.kernel, "kernel_file": x.kernel_file, "in_checkout": x.in_checkout,
                          "site": None if x.site is None else vars(x.site), "calls": x.calls, "seconds": x.seconds,
                          "grids": x.grids, "signatures": [[[n, list(v)] for n, v in s] for s in x.signatures],
                          "signature_calls": x.signature_calls} for x in d.launches]}


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
