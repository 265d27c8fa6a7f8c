"""The host programs a CUDA benchmark job may start: Triton's compiler toolchain, known by real path.

On CUDA, Triton compiles inside the job (no cache outlives a job): `ptxas` for the kernel, and the C compiler for its
launcher stubs (the compiler driver runs cc1, as, collect2 and ld); the stubs' cache key runs `file -b` on the
interpreter (triton.runtime.build.platform_key calls platform.architecture()). Each was seen in a bench job on an
H200, and nothing else. Process creation is allowed there
(autokernel/sandbox/__init__.py, "+fork"), and the parent's process watcher (autokernel/bench/watch.py) sees those
programs. Any other process in a timed job is tampering (`bench.tampered`): a forked helper could do the work off
the clock (on another CUDA stream or context), or hog a core.

A program is trusted by the real path of its executable (/proc/<pid>/exe), never by its name: inside the sandbox
the only writable place is its private /tmp, and everything the host binds in (the system, the virtualenv) is
read-only at its host path. So a binary the candidate writes and calls `ptxas` runs from the job's /tmp and is not
one of these, whatever it is called; and a shell is never on the list (a script could run anything).
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from autokernel.bench.watch import Proc
from autokernel.sandbox.bwrap import job_path

COMPILER_PARTS = ("cc1", "as", "collect2", "ld")  # what the C compiler driver runs to build a shared library


def _ptxas() -> str | None:
    """TRITON_PTXAS_PATH (passed to the job) or the ptxas Triton ships, as Triton's knobs choose it."""
    try:
        import triton
    except ImportError:
        return None
    return os.environ.get("TRITON_PTXAS_PATH") or str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
                                                       / "ptxas")


def _compiler_programs() -> list[str]:
    """The C compiler a job's Triton finds (gcc, else clang, on the job's PATH: CC is not passed to jobs) and the
    programs it runs, as the compiler itself names them (-print-prog-name)."""
    path = job_path()
    cc = shutil.which("gcc", path=path) or shutil.which("clang", path=path)
    if cc is None:
        return []
    out = [cc]
    for part in COMPILER_PARTS:
        try:
            name = subprocess.run([cc, f"-print-prog-name={part}"], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        out.append(name if os.sep in name else (shutil.which(name, path=path) or ""))
    return out


@functools.lru_cache(maxsize=1)
def programs() -> frozenset[str]:
    """Real paths of the toolchain's executables on this host (only those that exist)."""
    found = [_ptxas(), *_compiler_programs(), shutil.which("file", path=job_path())]
    return frozenset(os.path.realpath(p) for p in found if p and os.path.isfile(p))


@functools.lru_cache(maxsize=1)
def cuda_env() -> dict[str, str]:
    """TRITON_LIBCUDA_PATH for CUDA jobs, found once here: Triton otherwise runs `/sbin/ldconfig -p` inside every job
    to find libcuda, and on some systems that is a shell script (a shell is not a trusted program)."""
    if os.environ.get("TRITON_LIBCUDA_PATH"):
        return {}  # passed through to the job as it is (autokernel/sandbox/bwrap.py ENV_PASSTHROUGH)
    try:
        from triton.backends.nvidia.driver import libcuda_dirs
        dirs = libcuda_dirs()
    except Exception:  # noqa: BLE001 -- no CUDA driver here: the job finds (or fails to find) it itself
        return {}
    return {"TRITON_LIBCUDA_PATH": dirs[0]} if dirs else {}


def may_fork(isolation: str, cuda: bool) -> bool:
    """Whether a job could create processes, from its isolation label (autokernel/sandbox/__init__.py): "+fork" where
    the seccomp filter allows it (CUDA), or a CUDA job with no seccomp filter at all (no bubblewrap on a GPU host:
    nothing denies process creation, and Triton must still compile). A CPU job never needs a process."""
    parts = isolation.split("+")
    return "fork" in parts or (cuda and "seccomp" not in parts)


def untrusted(procs: list[Proc], fork_allowed: bool) -> list[str]:
    """The names of the processes seen in a job that are tampering: all of them where the job may not create
    processes; else those whose executable is not in the toolchain, except a fork seen once, before its exec (a
    subprocess starting the compiler is, for a moment, a copy of the harness). That exception is the watcher's
    resolution, not a loophole: a process that lives less than two sampling intervals (~20-80 ms) can be missed
    altogether, and a CUDA context takes longer than that to create."""
    if fork_allowed:
        trusted = programs()
        procs = [p for p in procs if p.exe not in trusted and not (p.samples == 1 and p.fork_copy)]
    return list(dict.fromkeys(p.name for p in procs))
