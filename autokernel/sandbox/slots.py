"""Run several sandboxed jobs at once: one slot per GPU (pinned with CUDA_VISIBLE_DEVICES), else one per core.

Each job gets its own Triton cache inside its own private scratch directory (run() sets TRITON_CACHE_DIR there), never
one per slot: a writable cache shared by consecutive jobs would let one candidate plant compiled kernels (for the
incumbent's kernel, say) that the next job loads.

`with pinned(slot):` makes every sandboxed job started in that thread (a whole gate: autokernel/agent/workers.py)
run with the slot's environment, without threading an argument through the gate's stages.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import queue
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from autokernel.policy import Sandbox


@dataclass(frozen=True)
class Slot:
    index: int
    env: dict  # environment overrides for jobs in this slot (device pin, threads)


_PINNED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("autokernel_slot_env", default=None)


@contextlib.contextmanager
def pinned(slot: Slot):
    """Jobs sandbox.run starts in this thread (and its context) get the slot's env (device pin, threads)."""
    token = _PINNED.set(dict(slot.env))
    try:
        yield slot
    finally:
        _PINNED.reset(token)


def pinned_env() -> dict:
    """The env of the slot this thread is pinned to ({} when none): what sandbox.run lays under its own `env`."""
    return dict(_PINNED.get() or {})


def _visible_gpus() -> list[str]:
    try:
        import torch
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 -- no usable torch/CUDA means CPU slots
        n = 0
    if n == 0:
        return []
    ids = [x for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    return ids[:n] if len(ids) >= n else [str(i) for i in range(n)]


def default_slots(limits: Sandbox) -> list[Slot]:
    """policies.yaml sandbox.slots, or one per GPU, or one per core (each then gets cores // slots threads)."""
    gpus = _visible_gpus()
    cores = os.cpu_count() or 1
    n = limits.slots or len(gpus) or cores
    threads = str(max(1, cores // n))
    if gpus:
        return [Slot(i, {"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)], "OMP_NUM_THREADS": threads}) for i in range(n)]
    return [Slot(i, {"OMP_NUM_THREADS": threads}) for i in range(n)]


def run_many(jobs: Sequence[tuple], limits: Sandbox, *, run: Callable, slots: Sequence[Slot] | None = None,
             pythonpath: Sequence[Path] = ()) -> list:
    """Run (entry, payload, job_dir[, inputs]) jobs on free slots, at most one job per slot at a time; results in
    job order. `run`: the package's autokernel.sandbox.run (passed in by autokernel.sandbox.run_many; this module
    does not import its package back)."""
    slots = list(slots or default_slots(limits))
    free: queue.Queue[Slot] = queue.Queue()
    for s in slots:
        free.put(s)

    def one(job: tuple):
        entry, payload, job_dir, *rest = job
        slot = free.get()
        try:
            return run(entry, payload, job_dir, limits, inputs=rest[0] if rest else None, pythonpath=pythonpath,
                       env=slot.env)
        finally:
            free.put(slot)

    with ThreadPoolExecutor(max_workers=len(slots)) as pool:
        return list(pool.map(one, jobs))
