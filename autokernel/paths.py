"""Which checkout a command works on: one root for the kernels it reads, the run state it keeps, and the commits.

An autokernel layout is a directory with a `kernels/` folder of op files (`kernels/<op>.py`). The target is:
  - `--repo PATH` when given: PATH itself (or the top of the git work tree PATH is in) must have that layout, or the
    command stops with exit 2 — never a silent fall-back to another checkout;
  - otherwise the git work tree of the current directory when it has that layout (a clone of the engine you are
    tuning, where you run the command), and else the installed autokernel project.
Everything a run reads (the incumbent shown to the model, the signature the gate checks, the incumbent the bench
times, the engine's other kernels in the end-to-end check) and writes (sandbox/ run state, traces/, the commit)
comes from that one root.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autokernel.errors import UserError

PACKAGE = Path(__file__).resolve().parent  # autokernel/: the trusted package (its engine source, its sandbox harness)
INSTALLED = PACKAGE.parent  # the project autokernel runs from: its kernels/ package is what every sandbox job binds


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def kernels(self) -> Path:
        return self.root / "kernels"

    @property
    def sandbox(self) -> Path:
        return self.root / "sandbox"

    @property
    def traces(self) -> Path:
        return self.root / "traces"

    def kernel_file(self, op: str) -> Path:
        """kernels/<op>.py of this checkout; UserError (exit 2) when there is none."""
        path = self.kernels / f"{op}.py"
        if not path.is_file():
            raise UserError(f"{path}: no kernel file for op {op!r} in {self.root} (the agent rewrites kernels/<op>.py "
                            "of the target checkout; pass --repo a clone that has it)")
        return path


INSTALLED_LAYOUT = Layout(INSTALLED)  # the installed project's kernels/, sandbox/ and traces/: the default target


def is_layout(root: Path) -> bool:
    return (root / "kernels").is_dir() and any((root / "kernels").glob("*.py"))


def _work_tree(start: Path) -> Path | None:
    """The top of the git work tree containing `start` (a `.git` directory or file), or None."""
    for d in (start, *start.parents):
        if (d / ".git").exists():
            return d
    return None


def target(repo: str | Path | None = None) -> Layout:
    """The checkout to work on (see the module docstring)."""
    if repo is not None:
        given = Path(repo).expanduser()
        if not given.is_dir():
            raise UserError(f"--repo {repo}: no such directory")
        given = given.resolve()
        for root in dict.fromkeys([given, _work_tree(given)]):
            if root is not None and is_layout(root):
                return Layout(root)
        raise UserError(f"--repo {repo}: not an autokernel checkout (no kernels/<op>.py files); pass a clone of the "
                        "engine whose kernels/ autokernel rewrites")
    here = _work_tree(Path.cwd().resolve())
    return Layout(here) if here is not None and is_layout(here) else INSTALLED_LAYOUT
