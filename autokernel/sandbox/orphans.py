"""What a killed autokernel process leaves behind, removed by the next one: directories named <prefix>-<pid>-...
whose pid is gone. Three kinds, each swept once per process before its first directory is made: the sandbox's input
and scratch directories (autokernel-in-, autokernel-job-; autokernel.sandbox.runner), its job cgroups
(autokernel-<pid>-<n>; autokernel.sandbox.limits) and a Ray worker's job directories (autokernel-cluster-;
autokernel.cluster). Standard library only: the sandboxed harness imports this package.
"""
from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Callable, Iterable

_swept: set[str] = set()  # the prefixes this process has swept
_lock = threading.Lock()


def remove_tree(d: Path) -> None:
    """A directory tree: never through a symlink (rmtree does not follow those inside it)."""
    if not d.is_symlink():
        shutil.rmtree(d, ignore_errors=True)


def remove_cgroup(d: Path) -> None:
    """An empty cgroup; one that still holds a process stays (rmdir fails)."""
    try:
        d.rmdir()
    except OSError:
        pass


def sweep_once(prefix: str, parents: Iterable[Path], remove: Callable[[Path], None] = remove_tree) -> None:
    """Remove each `<prefix>-<pid>-*` in `parents` whose pid is gone, with `remove`; once per process and prefix
    (later calls return at once, without iterating `parents`: a generator there costs nothing after the first)."""
    with _lock:
        if prefix in _swept:
            return
        _swept.add(prefix)
    for parent in parents:
        for d in parent.glob(f"{prefix}-*-*"):
            pid = d.name[len(prefix) + 1:].split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                remove(d)
