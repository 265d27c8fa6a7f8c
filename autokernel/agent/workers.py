"""agent.workers: N independent model conversations on one op, sharing one evaluator (issue 13; KernelAgent's parallel
workers with early success).

Each worker is a plain Session (loop.py) with its own model (worker i: seed i for the offline search; an LLM samples
on its own and is told it is one of N), its own budgets and its own transcript (<op_dir>/worker-<i>/). They share a
SharedEvaluator, the evaluator every worker's Session sees:

  - one judgement per source across workers: a source another worker submitted is answered with that verdict
    (a duplicate: not counted, not ledgered again), waiting for it while it is still being judged;
  - the gate runs on a sandbox slot through an executor (gate_pool: one slot per GPU, pinned, or one per core;
    autokernel/sandbox/slots.py), several gates at once;
  - the benchmark runs one at a time (a lock): timings on the device never overlap;
  - early success (agent.early_success): once a worker has an accepted candidate, the others stop at their next
    turn.

The best accepted candidate over all workers wins; run.work_on confirms and delivers it by its one path. Threads are
enough here: the parent's work is waiting (model calls are I/O, candidate code runs in sandboxed subprocesses).
The executor is the one place gate jobs are dispatched: any concurrent.futures.Executor (RayCluster.pool: threads as
wide as a Ray cluster, autokernel/cluster.py) can take gate_pool's place.
"""
from __future__ import annotations

import json
import queue
import threading
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from autokernel.agent.evaluate import Evaluator, Feedback, Unbenched
from autokernel.agent.ledger import Ledger
from autokernel.agent.loop import Result, Session
from autokernel.agent.prompt import Prompt
from autokernel.agent.providers import Model
from autokernel.candidate import Candidate
from autokernel.deadline import Deadline
from autokernel.policy import Agent as AgentPolicy
from autokernel.policy import Sandbox as SandboxPolicy
from autokernel.sandbox.slots import Slot, default_slots, pinned

if TYPE_CHECKING:
    from autokernel.bench.measure import Measurement


class SlotPool(futures.Executor):
    """Runs each submitted job on a free slot, at most one job per slot; the job's sandboxed processes get the slot's
    environment (slots.pinned: CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS)."""

    def __init__(self, slots: Sequence[Slot]):
        self.slots: list[Slot] = list(slots)
        self.free: queue.Queue[Slot] = queue.Queue()
        for s in self.slots:
            self.free.put(s)
        self.pool = ThreadPoolExecutor(max_workers=len(self.slots), thread_name_prefix="autokernel-slot")

    def submit(self, fn, /, *args, **kw) -> Future:
        def one():
            slot = self.free.get()
            try:
                with pinned(slot):
                    return fn(*args, **kw)
            finally:
                self.free.put(slot)
        return self.pool.submit(one)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def gate_pool(sandbox_policy: SandboxPolicy) -> SlotPool:
    """Where gate jobs go by default: this machine's slots (policies.yaml sandbox.slots, else per GPU / per core)."""
    return SlotPool(default_slots(sandbox_policy))


def gate_job(evaluator: Evaluator, candidate: Candidate, deadline: Deadline) -> Feedback:
    """One gate, run on a slot: the time left is counted when the job starts, so a wait for a slot is not free."""
    if deadline.expired():
        raise TimeoutError(f"{candidate.sha256[:8]}: no time left for the gate (waited for a sandbox slot)")
    return evaluator.gate(candidate, deadline)


class SharedEvaluator:
    """The evaluator the workers share (see the module doc): each source judged once, its gate on the pool, its
    bench under the lock."""

    def __init__(self, inner: Evaluator, executor: futures.Executor):
        self.inner, self.executor = inner, executor
        self.bench_lock, self.lock = threading.Lock(), threading.Lock()
        self.evaluations: dict[str, Future] = {}
        self.winner: tuple[int, str] | None = None  # (worker, sha256) of the first accepted candidate
        self.abort: str | None = None  # a worker ended on an error: the others stop too

    def evaluate(self, worker: int, candidate: Candidate, deadline: Deadline = Deadline.none(),
                 gated: Feedback | None = None) -> Feedback:
        """`candidate` gated and benched, or only benched where `gated` is the gate's acceptance of it (a ledger's:
        loop.Session.evaluate); another worker's judgement of the same source is answered as a duplicate."""
        digest = candidate.sha256
        with self.lock:
            mine = digest not in self.evaluations
            fut = self.evaluations.setdefault(digest, Future())
        if not mine:  # another worker has it (done or in progress): one evaluation per source
            try:
                return replace(fut.result(), duplicate=True)
            except Unbenched as e:  # out of time after its gate: the worker that submitted it keeps it
                raise TimeoutError(str(e)) from None
        try:
            fb = self._evaluate(worker, candidate, deadline, gated)
        except BaseException as e:
            with self.lock:  # not judged after all (out of time, an environment error): a later submit may retry
                del self.evaluations[digest]
            fut.set_exception(e)
            raise
        fut.set_result(fb)
        return fb

    def _evaluate(self, worker: int, candidate: Candidate, deadline: Deadline, gated: Feedback | None) -> Feedback:
        fb = self.gate(candidate, deadline) if gated is None else gated
        if fb.verdict != "accepted":
            return fb
        return self.bench(worker, candidate, fb, deadline)

    def gate(self, candidate: Candidate, deadline: Deadline) -> Feedback:
        """The inner gate on a slot of the pool: several at once."""
        return self.executor.submit(gate_job, self.inner, candidate, deadline).result()

    def bench(self, worker: int, candidate: Candidate, fb: Feedback, deadline: Deadline) -> Feedback:
        with self.bench_lock:  # timings never overlap: one benchmark at a time on the device
            return self._won(worker, self.inner.bench(candidate, fb, deadline))

    def _won(self, worker: int, fb: Feedback) -> Feedback:
        if fb.accepted and self.winner is None:
            self.winner = (worker, fb.sha256)
        return fb

    def check(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> dict | None:
        """check_candidate's sandboxed look, on a slot like a gate (it runs candidate code too)."""
        return self.executor.submit(self.inner.check, candidate, deadline).result()

    def stop_early(self, worker: int, early_success: bool) -> Callable[[], str | None]:
        def why() -> str | None:
            if self.abort:
                return f"another worker on this op failed: {self.abort}"
            if early_success and self.winner and self.winner[0] != worker:
                return f"worker {self.winner[0]} has an accepted candidate ({self.winner[1][:8]}): early success"
            return None
        return why


class _Seat:
    """Worker i's view of the SharedEvaluator: the Session's Evaluator, its submissions tagged with who made them."""

    def __init__(self, shared: SharedEvaluator, worker: int):
        self.shared, self.worker = shared, worker

    def evaluate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        return self.shared.evaluate(self.worker, candidate, deadline)

    def gate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        return self.shared.gate(candidate, deadline)

    def bench(self, candidate: Candidate, feedback: Feedback, deadline: Deadline = Deadline.none()) -> Feedback:
        """A gate acceptance the ledger holds, benchmarked as a submission is: once across workers, under the lock."""
        return self.shared.evaluate(self.worker, candidate, deadline, gated=feedback)

    def check(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> dict | None:
        return self.shared.check(candidate, deadline)

    def confirm(self, candidate: Candidate) -> Measurement:
        return self.shared.inner.confirm(candidate)


def run(op: str, models: list[Model], evaluator: Evaluator, prompt: Prompt, settings: AgentPolicy, run_dir: Path, *,
        ledger: Ledger | None = None, executor: futures.Executor | None = None,
        sandbox: SandboxPolicy | None = None) -> tuple[Result, Session]:
    """len(models) Sessions at once on `op`; the combined Result, and the Session that found the best candidate
    (its messages hold the rationale the commit quotes), else worker 0's. `executor` takes the gate jobs; None: a
    pool of this machine's slots for `sandbox` (the run's sandbox policy, which the caller then names)."""
    own = executor is None
    if executor is None:
        if sandbox is None:
            raise ValueError("workers.run: with no executor, the caller names the sandbox policy of the slot pool")
        executor = gate_pool(sandbox)
    pool = executor
    shared, n = SharedEvaluator(evaluator, pool), len(models)
    sessions = [Session(op, m, _Seat(shared, i), replace(prompt, task=prompt.task + _nudge(i, n)), settings,
                        Path(run_dir) / f"worker-{i}", ledger=ledger,
                        stop_early=shared.stop_early(i, settings.early_success)) for i, m in enumerate(models)]

    def one(s: Session) -> Result:
        try:
            return s.run()
        except BaseException as e:
            shared.abort = f"{type(e).__name__}: {e}"
            raise

    try:
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="autokernel-worker") as threads:
            running = [threads.submit(one, s) for s in sessions]
        results = [f.result() for f in running]  # the first worker's exception (a UserError) is raised here
    finally:
        if own:
            pool.shutdown()
    return combine(op, results, sessions, Path(run_dir))


def _nudge(i: int, n: int) -> str:
    return (f"\n\nYou are worker {i + 1} of {n} on this op: the others explore at the same time. Pursue an idea of "
            "your own; a file another worker already submitted is answered from its verdict and not counted.")


def combine(op: str, results: list[Result], sessions: list[Session], run_dir: Path) -> tuple[Result, Session]:
    """One Result for the op: the best accepted candidate of any worker, usage and submissions summed, the first
    model error kept (an environment failure, reported even when another worker won). workers.json lists each."""
    wins = [(r.best.feedback.speedup or 0.0, i) for i, r in enumerate(results) if r.best]
    k = max(wins)[1] if wins else 0
    usage = {key: sum(r.usage[key] for r in results) for key in results[0].usage}
    detail = "; ".join(f"worker {i}: {r.status} ({r.detail})" for i, r in enumerate(results))
    error = next((f"worker {i}: {r.error}" for i, r in enumerate(results) if r.error), None)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "workers.json").write_text(json.dumps([
        {"worker": i, "model": s.model.name, "status": r.status, "detail": r.detail, "submitted": r.submitted,
         "best": r.best and r.best.feedback.sha256, "transcript": str(r.transcript)}
        for i, (r, s) in enumerate(zip(results, sessions))], indent=1) + "\n")
    best = results[k]
    return Result(op, best.status, detail, best.best, best.transcript, usage,
                  sum(r.submitted for r in results), error,
                  list({c.feedback.sha256: c for r in results for c in r.unbenched}.values()),
                  sum(r.replies for r in results),
                  list({d["commit"]: d for r in results for d in r.delivered}.values()),
                  sum(r.cut for r in results)), sessions[k]
