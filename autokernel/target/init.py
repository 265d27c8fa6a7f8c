"""`autokernel init`'s work on a checkout (the command: autokernel/cli/init.py): run its engine workload once in the
sandbox, list every Triton kernel it launched and the function that launched it (autokernel/target/discover.py), and
write the starting declaration (autokernel.toml: one [ops.<name>] table per kernel file, `reference = "TODO"` for the
user).

Bad input (exit 2) leaves nothing written: no engine entry, a declaration that already declares ops without --force,
an engine that raises or launches nothing, a file outside the checkout or a symlink.
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

from autokernel.errors import UserError
from autokernel.target import declaration as decl
from autokernel.target import discover, launches

HEADER = ("# autokernel target declaration (docs/targets.md). Written by `autokernel init`; fill in each op's\n"
          "# `reference` (a torch function with the launcher's signature), then check what it inferred.\n")


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


def discovery(root: Path, engine: str | None, force: bool,
              policy) -> tuple[decl.Declaration | None, str, discover.Discovery, Path]:
    """Run the checkout's engine workload once in the sandbox under `policy` (the command's: policy.for_checkout with
    uses sandbox): (the declaration already there, or None; the engine entry; what the workload launched; the job
    directory its records go to, in the user's cache)."""
    from autokernel import paths, sandbox
    found = decl.load(root)
    build = engine_entry(root, found, engine, force)
    sandbox.preflight(policy.sandbox, untrusted_author=True)  # the checkout's engine: trust rule 6
    job_dir = paths.user_cache() / "init" / paths.run_name()
    return found, build, discover.run(root, build, policy, job_dir), job_dir


def declare(root: Path, found: decl.Declaration | None, build: str, d: discover.Discovery, job_dir: Path) -> str:
    """Write the declaration of what `discovery` found, and its record (job_dir/discovery.json); returns what was
    done to autokernel.toml: "wrote", "added to" (an [engine]-only file the user wrote) or "replaced"."""
    from autokernel import paths
    if not d.ops:
        raise UserError(f"[engine] build = {build}: no launched kernel is defined in a file of the checkout {root} "
                        "(all came from installed packages); vendor the kernels you want tuned into the checkout")
    keep = found is not None and not found.ops  # an [engine]-only file the user wrote: keep it, add the ops
    head = paths.read_text(found.path, root).rstrip("\n") + "\n\n" if keep and found is not None else (
        HEADER + f"\n[engine]\nbuild = {decl.quote(build)}\n\n")
    write(root / decl.NAME, head + render(d.ops))
    (job_dir / "discovery.json").write_text(json.dumps(record(d), indent=1))
    return "replaced" if found is not None and found.ops else "added to" if keep else "wrote"


def write(path: Path, text: str) -> None:
    """Through a temporary file in the same directory and a rename: a link at `path` is replaced, never followed.
    The file keeps the mode of the regular file it replaces, else gets what an editor would give a new one (0666
    less the umask: 0644 under the usual 022); mkstemp's 0600 would hide it from the checkout's other readers."""
    try:
        st = os.lstat(path)
        mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None
    except FileNotFoundError:
        mode = None
    if mode is None:
        umask = os.umask(0o022)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".autokernel-", suffix=".toml")
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), mode)
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
        found = op.launchers()
        launchers = [x for x in found if x.plain]
        for site in found:
            if not site.plain:  # the gate could not call it: say what to declare instead (launches.NOT_PLAIN)
                lines.append(f"# {site.function} launches here but cannot be a launcher: {launches.NOT_PLAIN}")
        others = sorted({f"{x.site.file}:{x.site.function}" for x in op.launches
                         if x.site is not None and x.site.file != op.file})
        for o in others:
            lines.append(f"# also launched from {o}, outside this file: the gate reaches the file's kernels only "
                         "through its launchers, so it refuses to judge a rewrite (move that launch into a function "
                         "of the file, or set protected = true)")
        lines.append(f"file = {decl.quote(op.file)}")
        names = [s.function for s in launchers] or [decl.TODO]
        lines.append("launchers = [" + ", ".join(decl.quote(n) for n in names) + "]")
        sig = "the signature " + "; ".join(f"{s.function}({', '.join(s.params)})" for s in launchers) \
            if launchers else "the launcher's signature"
        if len(launchers) > 1:  # one reference per launcher (declaration._per_launcher)
            table = ", ".join(f"{decl.quote(s.function)} = {decl.quote(decl.TODO)}" for s in launchers)
            lines.append(f"reference = {{ {table} }}  # per launcher, \"module:function\": torch, with {sig}")
        else:
            lines.append(f"reference = {decl.quote(decl.TODO)}  # \"module:function\": torch, with {sig}")
        lines.append("# outputs = [0]  # which return values the gate compares (default: every tensor returned); for a "
                     "launcher returning None, the written arguments that are its result: [\"out\"]")
        lines.append("# tolerance = { atol = 1e-5, rtol = 1e-5 }  # optional: replaces the derived tolerance")
        lines.append("# work = { flops = \"...\", bytes = \"...\" }  # optional: one call's, over its arguments "
                     "(X.numel, X.nbytes, X.shape[i]): rank by roofline headroom")
        lines.append("# sizes = { hidden = { of = [\"X.shape[-1]\", \"W.shape[0]\"], low = 1, high = 8192 } }  # "
                     "optional: a size production varies besides the token count, checked at low, high and between")
        seen = sorted({v[1] for x in op.launches for sig in x.signatures for _, v in sig
                       if v[0] == "tensor" and v[1] in decl.DTYPES})
        lines.append(f"# dtypes = [\"bfloat16\"]  # optional: float dtypes production runs besides the workload's "
                     f"({', '.join(seen) or 'none seen'}): every case is made in those too")
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
