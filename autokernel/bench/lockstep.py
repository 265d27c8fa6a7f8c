"""Lockstep: the jobs of one CPU round run over the same seconds, but never at the same moment.

Why: on a shared machine the CPU time of the same interpreter work is not constant. Other work on the machine
(another engineer's tests, memory-heavy model runs on the other core) evicts caches and takes memory bandwidth, and
measured on this project's 2-core machine the same rmsnorm call took 170 ms of CPU in one second and 500 ms a few
seconds later. Those episodes last seconds, as long as a job. With the jobs of a round one after the other, each
file's figure came from different seconds, and the round-to-round spread of an identical copy's ratio was ~10%:
a 1.2x win could not be told from noise in 6 rounds. Here the round's jobs (one fresh process per file, as before)
are all started, and the parent lets them take turns of SLICE_S: while one job runs, every other job of the round
is stopped (SIGSTOP to each of its processes; SIGCONT when its turn comes). Each file's timed calls are then spread
over the same seconds as the others', and an episode of contention falls on all of them alike.

Why this is fair, and safe against a hostile file:
- the verdict's clock on CPU is the process's CPU time (autokernel.bench.job), which does not advance while the
  process is stopped: a call cut by a turn is charged only for the time it ran;
- SIGSTOP cannot be caught, blocked or ignored, and stops every thread of a process: while the incumbent's job runs,
  nothing of a candidate's job runs at all, so it cannot slow the incumbent (no hog, no spinning thread). What it
  can leave behind is a cold cache at the start of the incumbent's turn, like any other process that ran on that
  core before; refilling caches costs at most a few ms against a 250 ms turn (~1%, under bench.min_speedup's 2%),
  and the incumbent's job does the same to the candidate's;
- a job cannot see or influence the turns: they are the parent's, by the wall clock, and every process the job
  has is stopped (the parent's watcher lists them from /proc, each job's from the thread that started it);
- process creation stays denied in CPU jobs, and any other process is still `bench.tampered` (autokernel.bench.watch).
The turns stretch each job's wall time (a job is stopped while the others run); autokernel.bench.rounds scales
the wall clock it keeps for the wait check by the share of its lifetime each job was not stopped.
CUDA jobs are not run in lockstep: stopping a process does not stop its GPU work, and jobs must never share a device.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Generic, TypeVar

from autokernel.bench.watch import JobStats, Watch

T = TypeVar("T")
SLICE_S = 0.25  # one turn; long against a cache refill (~ms), short against the episodes of contention (seconds)


class Job(threading.Thread, Generic[T]):
    """One sandboxed job, run in its own thread so that several can be alive at once; `fn()` runs the job (it
    calls sandbox.run), watched by a Watch scoped to this thread's child processes. job_dir: the job's directory,
    for the caller's record."""

    def __init__(self, fn: Callable[[], T], job_dir: Path | None = None):
        super().__init__(name="autokernel-bench-job", daemon=True)
        self._fn = fn
        self.job_dir = job_dir
        self.result: T | None = None  # what fn() returned, once it has
        self.error: BaseException | None = None
        self.stats = JobStats()
        self.stopped_s = 0.0  # how long the conductor kept this job stopped
        self._watch: Watch | None = None
        self._ready = threading.Event()

    def run(self) -> None:
        try:
            with Watch(thread_id=threading.get_native_id()) as w:
                self._watch = w
                self._ready.set()
                self.result = self._fn()
            self.stats = w.stats
        except BaseException as e:  # noqa: BLE001 -- re-raised by the caller, in its own thread
            self.error = e
        finally:
            self._ready.set()

    def pids(self) -> list[int]:
        return self._watch.pids() if self._watch is not None else []

    @property
    def running_share(self) -> float:
        """The share of the job's wall time it was not stopped by the conductor."""
        w = self.stats.wall_s
        return max(0.0, min(1.0, 1.0 - self.stopped_s / w)) if w > 0 else 1.0


def _signal(job: Job, sig: int) -> None:
    for pid in job.pids():
        try:
            os.kill(pid, sig)
        except OSError:  # gone already
            pass


def run_alone(job: Job) -> None:
    job.start()
    job.join()


def run_lockstep(jobs: list[Job], slice_s: float = SLICE_S) -> None:
    """Start every job, then give them turns of `slice_s` in list order until all have ended. Whatever happens,
    every job is continued at the end (a stopped job would otherwise wait for the sandbox's timeout)."""
    for j in jobs:
        j.start()
        j._ready.wait()
    turn = 0
    try:
        while True:
            alive = [j for j in jobs if j.is_alive()]
            if not alive:
                return
            me = alive[turn % len(alive)]
            others = [j for j in alive if j is not me]
            for j in others:  # stop the others first: never two of them running at once
                _signal(j, signal.SIGSTOP)
            _signal(me, signal.SIGCONT)
            t0 = time.monotonic()
            me.join(slice_s)
            for j in others:
                j.stopped_s += time.monotonic() - t0
            turn += 1
    finally:
        for j in jobs:
            _signal(j, signal.SIGCONT)
