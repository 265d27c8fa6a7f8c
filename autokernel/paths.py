"""Which checkout a command works on: one root for the kernels it reads, the run state it keeps, and the commits;
and the one way a file of it is read.

An autokernel layout is a directory with a `kernels/` folder of op files (`kernels/<op>.py`). The target is:
  - `--repo PATH` when given: PATH itself (or the top of the git work tree PATH is in) must have that layout, or the
    command stops with exit 2 — never a silent fall-back to another checkout;
  - otherwise the git work tree of the current directory when it has that layout (a clone of the engine you are
    tuning, where you run the command), and else the installed autokernel project, whose run state then goes to the
    user's cache directory (`user_cache()`), never into the installed package.
Everything a run reads (the incumbent shown to the model, the signature the gate checks, the incumbent the bench
times, the engine's other kernels in the end-to-end check, policies.yaml) and writes (sandbox/ run state, traces/,
the commit) comes from that one root. The commands (autokernel/cli/) resolve it once and hand the layout, or the
paths it names, to the library functions. A new run directory is named one way, run_name (<UTC stamp>-<tags>-
<hex>): sandbox/<kind>-<name> of the layout (Layout.run_dir), or user_cache()/<kind>/<name> for a declared target's.

The checkout is untrusted input (docs/design.md, trust rule 6): every file autokernel reads from it goes through
`read_bytes` / `read_text`, which accept only a regular file inside the checkout (a symlink to ~/.env, a FIFO, a
device are refused with exit 2, naming the path, never what it points to or holds), and its sandbox/ and traces/
must be directories of its own, not symlinks out of it.
"""
from __future__ import annotations

import ast
import os
import secrets
import stat
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from autokernel.errors import UserError

PACKAGE = Path(__file__).resolve().parent  # autokernel/: the trusted package (its engine source, its sandbox harness)
INSTALLED = PACKAGE.parent  # the project autokernel runs from: its kernels/ package is what every sandbox job binds
MAX_FILE_BYTES = 16 << 20  # the largest file read from a checkout (kernel files are ~10 KB; policies.yaml <1 KB)


def user_config() -> Path | None:
    """The user's own policy file, trusted because no checkout carries it: $AUTOKERNEL_CONFIG when set (an empty
    value: none), else $XDG_CONFIG_HOME/autokernel/policies.yaml (~/.config/autokernel/policies.yaml)."""
    given = os.environ.get("AUTOKERNEL_CONFIG")
    if given is not None:
        return Path(given).expanduser() if given else None
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "autokernel" / "policies.yaml"


def user_cache() -> Path:
    """Run state when there is no checkout: $XDG_CACHE_HOME/autokernel (~/.cache/autokernel)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "autokernel"


def run_name(*tags: str) -> str:
    """The one naming scheme of a new run directory: <YYYYmmdd-HHMMSS, UTC>-<tags>-<4 hex digits> (sorted by time;
    the digits keep two runs of the same second apart). Layout.run_dir in a checkout; the targets' runs, kept in the
    user's cache directory, use it under user_cache() / <kind>."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return "-".join([stamp, *tags, secrets.token_hex(2)])


def regular_inside(path: str | Path, root: str | Path) -> Path:
    """`path`, resolved, when it is a regular file inside `root`; else UserError (exit 2) naming `path` only."""
    path, top = Path(path), Path(root).resolve()
    if not os.path.lexists(path):
        raise UserError(f"{path}: no such file")
    real = path.resolve()
    if not real.is_relative_to(top):
        raise UserError(f"{path}: refused: it resolves to a file outside the checkout {top} (a symlink out of it); "
                        "autokernel reads only regular files inside the checkout")
    if not real.is_file():
        raise UserError(f"{path}: refused: not a regular file (autokernel reads only regular files of the checkout)")
    return real


def read_bytes(path: str | Path, root: str | Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a file of the checkout at `root` (see regular_inside), opened without following a link and
    without blocking (a FIFO swapped in is refused, not waited on), at most `limit` bytes."""
    real = regular_inside(path, root)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{path}: refused: not a regular file (autokernel reads only regular files of the "
                            "checkout)")
        if st.st_size > limit:
            raise UserError(f"{path}: refused: {st.st_size} bytes, over the {limit} bytes autokernel reads from a "
                            "checkout file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UserError(f"{path}: refused: over the {limit} bytes autokernel reads from a checkout file")
    return data


def read_text(path: str | Path, root: str | Path, limit: int = MAX_FILE_BYTES) -> str:
    """read_bytes() as UTF-8 text; a file that is not UTF-8 is bad input, named but never quoted."""
    try:
        return read_bytes(path, root, limit).decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte offset {e.start})") from None


def write_outputs(out: str | Path, files: dict[str, str], roots: tuple[Path, ...] = ()) -> None:
    """Write `files` (name -> text) into the directory `out` (made if missing) without following a link the checkout
    may have planted: a nightly's default --out is inside the checkout, whose committed `autokernel-nightly/pr.md`
    could be a link to ~/.bashrc. Below the current directory and below each of `roots` (the checkout), no part of
    `out` may be a symbolic link, and each file is opened with O_NOFOLLOW as a regular file: else UserError (exit 2)
    naming the path. A directory the user names outside them is theirs to point where they like."""
    path = Path(os.path.abspath(out))
    bases = [Path.cwd().resolve(), *(Path(os.path.abspath(r)) for r in roots)]
    for base in bases:
        if not path.is_relative_to(base):
            continue
        part = base
        for name in path.relative_to(base).parts:
            part = part / name
            if part.is_symlink():
                raise UserError(f"{part}: refused: a symbolic link where autokernel writes its report (--out); "
                                "remove it or choose another --out")
            if not part.exists():
                part.mkdir()
    path.mkdir(parents=True, exist_ok=True)
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for name, text in files.items():
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644,
                             dir_fd=dfd)
            except OSError as e:
                raise UserError(f"{path / name}: refused: cannot write the report there ({e.strerror}: a symbolic "
                                "link or not a file); remove it or choose another --out") from None
            with os.fdopen(fd, "w") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise UserError(f"{path / name}: refused: not a regular file; remove it or choose another --out")
                f.truncate(0)
                f.write(text)
    finally:
        os.close(dfd)


_PARSE_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec"):
    """ast.parse under a lock: CPython 3.11's parser is not thread-safe ("AST constructor recursion depth mismatch"
    when two threads parse at once, as parallel verifies do), and the gate is called from worker threads. The one
    parser of the project: every ast.parse goes through it (the static stage, coverage, thresholds, the search, a
    target's imports and work counts), since an unlocked parse in one thread breaks a locked one in another."""
    with _PARSE_LOCK:
        return ast.parse(source, filename, mode)


def read_python(path: str | Path, root: str | Path) -> str:
    """read_text() of a Python file (an incumbent kernel), which must parse: one that does not is bad input (exit 2)
    naming the file and the line number, never its text (the file may be a symlinked env file)."""
    text = read_text(path, root)
    try:
        parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
        raise UserError(f"{path}: does not parse as Python{where}: fix or restore it (git checkout -- {path}); "
                        "autokernel compares candidates against it") from None
    return text


def checkout_of(kernel_file: str | Path) -> Path:
    """The checkout a kernels/<op>.py path belongs to (its directory's parent): the root its reads are held to."""
    return Path(kernel_file).absolute().parent.parent


@dataclass(frozen=True)
class Layout:
    root: Path
    state: Path | None = None  # where sandbox/ and traces/ go; None: the checkout itself

    @property
    def kernels(self) -> Path:
        return self.root / "kernels"

    @property
    def sandbox(self) -> Path:
        return self._state_dir("sandbox")

    @property
    def traces(self) -> Path:
        return self._state_dir("traces")

    @property
    def policy_file(self) -> Path:
        """The checkout's own policies.yaml (untrusted: autokernel.policy.for_checkout)."""
        return self.root / "policies.yaml"

    def _state_dir(self, name: str) -> Path:
        """<state>/<name>: in a checkout, a directory of its own, never a symlink that would send writes (run
        directories, the ledger) somewhere else."""
        base = self.state if self.state is not None else self.root
        d = base / name
        if self.state is None and (d.is_symlink() or d.exists() and not d.resolve().is_relative_to(
                Path(base).resolve())):
            raise UserError(f"{d}: refused: the checkout's {name}/ is a symlink; autokernel writes its run state "
                            "only into a directory of the checkout itself (remove the link)")
        if d.exists() and not d.is_dir():
            raise UserError(f"{d}: refused: the checkout's {name} is a file, not a directory; autokernel writes its "
                            "run state into a directory there (move the file)")
        return d

    def run_dir(self, kind: str, *tags: str) -> Path:
        """A new run directory's path, sandbox/<kind>-<run_name(tags)> (verify, agent, run); not yet created."""
        return self.sandbox / f"{kind}-{run_name(*tags)}"

    def kernel_file(self, op: str) -> Path:
        """kernels/<op>.py of this checkout: a regular file inside it; UserError (exit 2) when there is none."""
        path = self.kernels / f"{op}.py"
        if not os.path.lexists(path):
            raise UserError(f"{path}: no kernel file for op {op!r} in {self.root} (the agent rewrites kernels/<op>.py "
                            "of the target checkout; pass --repo a clone that has it)")
        regular_inside(path, self.root)
        return path

    def read_kernel(self, op: str) -> str:
        """The text of kernels/<op>.py (kernel_file's checks, then read_python's: it must parse)."""
        return read_python(self.kernel_file(op), self.root)

    @property
    def foreign(self) -> bool:
        """A checkout other than the installed project: its kernels/ are someone else's code (trust rule 6), so its
        jobs need full isolation like a target's (sandbox.preflight untrusted_author)."""
        return self.root.resolve() != INSTALLED.resolve()

    def checked_kernels(self) -> Path:
        """kernels/, once every kernels/*.py in it is a regular file inside the checkout (the gate's end-to-end
        stage and a Ray cluster read them all); UserError (exit 2) naming the first that is not."""
        for f in sorted(self.kernels.glob("*.py")):
            regular_inside(f, self.root)
        return self.kernels


INSTALLED_LAYOUT = Layout(INSTALLED)  # the installed project's kernels/ (what the sandbox binds)


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
    if here is not None and is_layout(here):
        return Layout(here)
    return Layout(INSTALLED, state=user_cache())  # no checkout here: the installed kernels, state in the user's cache
