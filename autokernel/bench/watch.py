"""What the parent sees of a benchmark job from outside: its processes while it runs, its CPU time and wall time.

Seen from the trusted process, so nothing the candidate does in its job can forge it:
- **Processes.** A job is bubblewrap's launcher, bubblewrap's init in the new pid namespace, and the harness (or
  just the harness without bubblewrap). A sampler thread walks the parent's descendants (/proc/<pid>/task/*/children)
  every ~20-40 ms (jittered) while the job runs and records every other process it finds, with its state. The
  sandbox's seccomp filter already denies process creation to CPU jobs; this is the second line, and it covers
  CUDA jobs too, where process creation stays allowed for the compiler toolchain (autokernel/bench/toolchain.py).
- **CPU time.** The user+system time of every process of the job (all its threads), read from /proc/<pid>/stat at
  each sample (the last ~30 ms before the job ends are not seen; getrusage cannot be used: the sandbox kills the
  job's processes once the result has arrived, before anyone reaps them), set against the job's wall time.

Why this is enough against hog-and-SIGSTOP rigging (a candidate that starts busy processes to slow the incumbent and
stops them during its own turn): each file runs in its own job, jobs never overlap, and a job's processes die with
it (pid namespace and cgroup). A hog can only ever run inside the candidate's own job, slowing the candidate; and if
one exists at all, this watcher names it and the file is rejected (`bench.tampered`).
"""
from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field

# executables that belong to the sandbox itself, not to the job's work
LAUNCHERS = ("bwrap",)
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Proc:
    """One process of a job other than its harness, as the samples saw it."""
    name: str  # "comm (state) executable" at its last sample
    exe: str  # the real path of its executable at its last sample
    samples: int  # how many samples saw it
    fork_copy: bool  # at its first sample it ran its parent's executable: forked and not yet exec'd (or never)


@dataclass
class JobStats:
    wall_s: float = 0.0
    cpu_s: float = 0.0  # user + system of the whole job (reaped children), -1 where unknown
    samples: int = 0
    max_processes: int = 0  # the most processes of the job's own seen at once, launchers aside (1: the harness alone)
    extra: list[str] = field(default_factory=list)  # the distinct names of `procs`, in the order first seen
    procs: list[Proc] = field(default_factory=list)  # every other process seen, in the order first seen

    @property
    def cpu_per_wall(self) -> float | None:
        return self.cpu_s / self.wall_s if self.cpu_s >= 0 and self.wall_s > 0 else None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def _describe(pid: int) -> tuple[str, str, str, float] | None:
    """(executable's real path, comm, state letter, CPU seconds of all its threads) of a live process; None if gone.
    The path is as the process sees it; the sandbox binds host directories at their host paths."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    comm = stat[stat.find("(") + 1:stat.rfind(")")]
    rest = stat[stat.rfind(")") + 2:].split()  # field 3 (state) onwards: utime and stime are fields 14 and 15
    try:
        cpu = (int(rest[11]) + int(rest[12])) / _TICKS
    except (IndexError, ValueError):
        cpu = 0.0
    return exe, comm, rest[0] if rest else "?", cpu


def descendants(root: int) -> dict[int, int]:
    """{pid: parent pid} of every live descendant of `root`."""
    seen: dict[int, int] = {}
    todo = [root]
    while todo:
        parent = todo.pop()
        for c in _children(parent):
            if c not in seen:
                seen[c] = parent
                todo.append(c)
    return seen


def _thread_children(pid: int, tid: int) -> list[int]:
    """Processes started by thread `tid` of process `pid` (the kernel keeps children per thread)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


class Watch:
    """`with Watch() as w: sandbox.run(...)`; then w.stats. Processes that existed before the job are ignored.

    `thread_id` (threading.get_native_id() of the thread that runs the job): only processes that thread starts, and
    their descendants, are the job's. What autokernel.bench.rounds needs when two jobs run at once (lockstep): each
    watcher sees its own job, never the other one."""

    def __init__(self, interval_s: float = 0.03, thread_id: int | None = None):
        self.interval_s = interval_s
        self.stats = JobStats()
        self._stop = threading.Event()
        self._me = os.getpid()
        self._tid = thread_id
        self._before = set(descendants(self._me)) if thread_id is None else set()
        self._procs: dict[int, dict] = {}  # pid -> Proc fields, updated at each sample that sees it
        self._cpu: dict[int, float] = {}  # the last CPU time read of each process of the job

    def _sample(self) -> None:
        """Who is in the job now. Not counted: the launchers (bubblewrap), the job's root process (our direct child:
        the harness without bubblewrap, bubblewrap once it has exec'd) and a launcher's first child (the harness
        under bubblewrap). Counted: any process whose parent is a job process that is not a launcher (what the
        harness forked) and a launcher's second child (an orphan reparented to the namespace's init)."""
        tree = {pid: ppid for pid, ppid in self._tree().items() if pid not in self._before}
        described = {pid: d for pid in tree if (d := _describe(pid)) is not None}
        launchers = {pid for pid, d in described.items() if os.path.basename(d[0]) in LAUNCHERS}
        work = [pid for pid in sorted(described) if pid not in launchers and tree[pid] != self._me]
        firsts = {tree[pid]: pid for pid in reversed(work) if tree[pid] in launchers}  # lowest pid per launcher
        extra = [pid for pid in work if firsts.get(tree[pid]) != pid]
        self.stats.samples += 1
        self.stats.max_processes = max(self.stats.max_processes, len(extra) + 1 if tree else 0)
        for pid, d in described.items():
            if pid not in launchers:
                self._cpu[pid] = max(self._cpu.get(pid, 0.0), d[3])
        for pid in extra:
            exe, comm, state, _ = described[pid]
            p = self._procs.get(pid)
            if p is None:
                parent = described.get(tree[pid])
                p = self._procs[pid] = {"samples": 0, "fork_copy": parent is not None and parent[0] == exe}
            p.update(name=f"{comm} ({state}) {exe}", exe=exe, samples=p["samples"] + 1)

    def _tree(self) -> dict[int, int]:
        """{pid: parent pid} of the job's processes and, without a thread_id, of every other process we started."""
        if self._tid is None:
            return descendants(self._me)
        tree: dict[int, int] = {}
        for root in _thread_children(self._me, self._tid):
            tree[root] = self._me
            tree.update(descendants(root))
        return tree

    def pids(self) -> list[int]:
        """The job's live processes now (launchers included): what a lockstep conductor stops and continues."""
        return [pid for pid in self._tree() if pid not in self._before]

    def _loop(self) -> None:
        rng = random.Random()
        while not self._stop.wait(self.interval_s * rng.uniform(0.66, 1.33)):
            self._sample()

    def __enter__(self) -> "Watch":
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="autokernel-bench-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.stats.wall_s = time.perf_counter() - self._t0
        self.stats.cpu_s = sum(self._cpu.values()) if self.stats.samples else -1.0
        self.stats.procs = [Proc(**p) for p in self._procs.values()]
        self.stats.extra = list(dict.fromkeys(p.name for p in self.stats.procs))
