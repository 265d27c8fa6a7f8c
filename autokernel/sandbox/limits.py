"""Resource limits for one sandboxed job: rlimits set in the child just before exec, plus a cgroup where one can be
made.

Why both: RLIMIT_AS and RLIMIT_CPU are per process, and RLIMIT_NPROC counts per real uid and never binds root (the
kernel exempts uid 0), so rlimits alone do not contain a fork bomb. A pids cgroup does, for any uid, and a memory
cgroup bounds the whole job rather than each process. Cgroups need write access to a hierarchy (root, or a delegated
subtree); where none can be made, a non-root user still gets RLIMIT_NPROC, and root gets a warning (see
`process_limit`).
"""
from __future__ import annotations

import itertools
import os
import resource
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from autokernel.sandbox.orphans import remove_cgroup, sweep_once

if TYPE_CHECKING:
    from autokernel.policy import Sandbox

CGROUP_ROOT = Path("/sys/fs/cgroup")
_counter = itertools.count()
MB = 1 << 20


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for cgroup v2) -> this process's cgroup path, from /proc/self/cgroup."""
    out = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    except OSError:
        pass
    return out


def _v1_dir(controller: str, own: dict[str, str]) -> Path | None:
    """A writable directory of the v1 `controller` hierarchy under which a job's cgroup can be made."""
    base = CGROUP_ROOT / controller
    if not (base / "cgroup.procs").exists():
        return None
    for rel in (own.get(controller, "/"), "/"):
        d = base / rel.lstrip("/")
        if d.is_dir() and os.access(d, os.W_OK):
            return d
    return None


def _v2_dir(own: dict[str, str], wanted: tuple[str, ...]) -> Path | None:
    """A cgroup v2 directory whose children get `wanted` controllers: our own (if delegated) or the root (as root)."""
    for base in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        if (base / "cgroup.controllers").exists():
            break
    else:
        return None
    for rel in (own.get("", "/"), "/"):
        d = base / rel.lstrip("/")
        ctl = d / "cgroup.subtree_control"
        try:
            enabled = ctl.read_text().split()
            missing = [c for c in wanted if c not in enabled]
            if missing:  # fails with EBUSY where d holds processes itself (the no-internal-process rule)
                ctl.write_text(" ".join("+" + c for c in missing))
            return d
        except OSError:
            continue
    return None


def _parents(own: dict[str, str]) -> Iterator[Path]:
    """Where job cgroups are made (v1 pids and memory, v2 under our own or the root), for the orphan sweep: a
    generator, so that it is read only on the one sweep a process makes."""
    yield from (d for c in ("pids", "memory") if (d := _v1_dir(c, own)))
    yield from (CGROUP_ROOT / own.get("", "/").lstrip("/"), CGROUP_ROOT)


@dataclass
class Cgroup:
    """One job's cgroup(s): a pids limit (fork bombs) and a memory limit (the whole job, every process in it)."""
    dirs: list[Path] = field(default_factory=list)
    version: int = 1

    @classmethod
    def create(cls, max_tasks: int, memory_bytes: int | None) -> "Cgroup | None":
        own = _own_cgroups()
        name = f"autokernel-{os.getpid()}-{next(_counter)}"
        sweep_once("autokernel", _parents(own), remove_cgroup)  # empty cgroups of autokernel processes now gone
        cg = None
        try:
            pids = _v1_dir("pids", own)
            if pids is not None:
                cg = cls([], 1)
                d = pids / name
                d.mkdir()
                cg.dirs.append(d)
                (d / "pids.max").write_text(str(max_tasks))
                mem = _v1_dir("memory", own) if memory_bytes else None
                if mem is not None:
                    try:
                        (mem / name).mkdir()
                        cg.dirs.append(mem / name)
                        (mem / name / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    except OSError:
                        pass
                return cg
            base = (_v2_dir(own, ("pids", "memory")) if memory_bytes else None) or _v2_dir(own, ("pids",))
            if base is not None:
                d = base / name
                d.mkdir()
                cg = cls([d], 2)
                (d / "pids.max").write_text(str(max_tasks))
                if memory_bytes and (d / "memory.max").exists():
                    (d / "memory.max").write_text(str(memory_bytes))
                return cg
        except OSError:
            if cg is not None:
                cg.remove()
        return None

    def attach(self, pid: int) -> None:
        """Move `pid` in; everything it forks afterwards stays in (called in the child before exec)."""
        for d in self.dirs:
            with open(d / "cgroup.procs", "w") as f:
                f.write(str(pid))

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in self.dirs:
            try:
                out |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return out

    def kill(self) -> None:
        """SIGKILL everything left in the job, including processes that left the process group or session."""
        if self.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
            try:
                (self.dirs[0] / "cgroup.kill").write_text("1")
                return
            except OSError:
                pass
        for _ in range(100):  # pids.max bounds how many can be re-forked while we sweep
            pids = self.pids()
            if not pids:
                return
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)

    def oom_killed(self) -> bool:
        """Did the kernel's OOM killer act inside this job (memory cgroup limit reached)?"""
        for d in self.dirs:
            for fname in ("memory.oom_control", "memory.events"):
                try:
                    for line in (d / fname).read_text().splitlines():
                        k, _, v = line.partition(" ")
                        if k == "oom_kill" and int(v) > 0:
                            return True
                except (OSError, ValueError):
                    pass
        return False

    def remove(self) -> None:
        self.kill()
        for d in self.dirs:
            for _ in range(50):  # rmdir is refused (EBUSY) until the last task is reaped
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def _tasks_of_uid(uid: int) -> int:
    """Threads now owned by `uid` (RLIMIT_NPROC counts threads of the real uid, not of one process tree)."""
    n = 0
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            status = (p / "status").read_text()
        except OSError:
            continue
        uid_line = next((x for x in status.splitlines() if x.startswith("Uid:")), "")
        if uid_line.split()[1:2] == [str(uid)]:
            n += int(next((x for x in status.splitlines() if x.startswith("Threads:")), "Threads: 1").split()[1])
    return n


def process_limit(cgroup: Cgroup | None) -> str:
    """How a fork bomb is contained in this job: 'cgroup', 'nproc' (rlimit, non-root only) or 'none'."""
    if cgroup is not None:
        return "cgroup"
    return "nproc" if os.getuid() != 0 else "none"


def preexec(limits: Sandbox, cgroup: Cgroup | None, rlimit_as: bool):
    """The function Popen runs in the child between fork and exec: cgroup first, then rlimits, nothing else.

    Everything is computed here in the parent so that the child only makes system calls (preexec_fn runs after fork
    in a possibly multi-threaded parent; allocation and locks there are best avoided).
    """
    nproc = None
    if cgroup is None and os.getuid() != 0:
        nproc = _tasks_of_uid(os.getuid()) + limits.max_processes
    mem = limits.memory_mb * MB
    cpu = limits.cpu_s
    fsize = limits.file_size_mb * MB

    def fn() -> None:
        if cgroup is not None:
            cgroup.attach(os.getpid())
        if rlimit_as:
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))  # SIGXCPU at the soft limit, SIGKILL 5 s later
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    return fn
