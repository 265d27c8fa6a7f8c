"""The numeric stage's chunks past the smoke jobs run on every sandbox slot at once (autokernel/gate/numeric.py,
run_chunks): the scheduler's promises, with a stand-in for the sandboxed job (no sandbox needed)."""
from __future__ import annotations

import threading
import time

import pytest

from autokernel.gate import numeric
from autokernel.gate.verdict import StageResult
from autokernel.policy import Policy
from autokernel.sandbox.slots import Slot, pinned

SLOTS = [Slot(0, {"OMP_NUM_THREADS": "1"}), Slot(1, {"OMP_NUM_THREADS": "1"})]


class FakeRunner:
    """runner.chunk(chunk, est, job): sleeps, records when each job ran and what else ran with it; fails `fail`. The
    jobs in `meet` wait for each other once started (a barrier, 10 s at most): if the scheduler runs them at once they
    overlap for certain, whatever the machine's load (two 50 ms sleeps alone need not); if it runs them one after
    another the barrier breaks and the run fails."""

    def __init__(self, fail=(), sleep=0.05, meet=()):
        self.fail, self.sleep, self.meet = set(fail), sleep, set(meet)
        self.barrier = threading.Barrier(len(self.meet), timeout=10) if self.meet else None
        self.lock = threading.Lock()
        self.leftover: list = []
        self.running: set[int] = set()
        self.log: list[tuple[int, frozenset]] = []  # (job, jobs running at its start)
        self.spans: dict[int, tuple[float, float]] = {}

    def chunk(self, chunk, est, job, soft_s=0.0, groups=()):
        with self.lock:
            self.log.append((job, frozenset(self.running)))
            self.running.add(job)
        if job in self.meet:
            self.barrier.wait()
        t = time.perf_counter()
        time.sleep(self.sleep * (3 if job in self.fail and job > 3 else 1))
        with self.lock:
            self.running.discard(job)
            self.spans[job] = (t, time.perf_counter())
        if job in self.fail:
            raise numeric._Stop(StageResult.fail("runtime", "runtime.exception", f"job {job}"), None)
        return []


def chunks(phases):
    """phases: [(n chunks, parallel)] -> what numeric._chunked yields."""
    return [numeric.Chunk([f"c{p}{k}"], 1.0, p, par) for p, (n, par) in enumerate(phases) for k in range(n)]


def test_parallel_chunks_overlap_and_a_phase_ends_before_the_next_starts():
    r = FakeRunner(meet={1, 2})  # the two smoke chunks (the first parallel phase) must run at once
    numeric.run_chunks(r, chunks([(1, False), (2, True), (4, True)]), SLOTS)
    assert sorted(j for j, _ in r.log) == list(range(7))
    assert any(others for _, others in r.log)  # two jobs ran at once
    assert all(len(others) <= 1 for _, others in r.log)  # never more than one per slot
    smoke_end = max(r.spans[j][1] for j in (1, 2))
    assert all(r.spans[j][0] >= smoke_end for j in range(3, 7))  # the rest waited for the smoke phase
    assert all(r.spans[j][0] >= r.spans[0][1] for j in range(1, 7))  # and everything for the first case


def test_the_failure_earliest_in_plan_order_is_raised_and_nothing_starts_after_it():
    r = FakeRunner(fail={4, 3})  # job 4 fails first in time (job 3 sleeps 3x): job 3's failure is reported
    with pytest.raises(numeric._Stop) as e:
        numeric.run_chunks(r, chunks([(1, False), (1, False), (8, True)]), SLOTS)
    assert e.value.runtime.detail == "job 3"
    assert max(j for j, _ in r.log) < 9  # no chunk started after the failures were seen


def test_serial_without_slots():
    r = FakeRunner()
    numeric.run_chunks(r, chunks([(1, False), (3, True)]), [])
    assert all(not others for _, others in r.log)


def test_a_gate_pinned_to_a_slot_does_not_fan_out():
    """A gate run by one of several agent workers (autokernel/agent/workers.py) already has its slot."""
    limits = Policy().sandbox.model_copy(update={"slots": 2})
    assert len(numeric._lanes(limits)) == 2
    with pinned(SLOTS[0]):
        assert numeric._lanes(limits) == []


def test_a_soft_deadline_leaves_cases_to_later_jobs_and_every_case_is_still_judged(tmp_path, monkeypatch):
    """The first job stops starting calls once one case is whole and its soft deadline has passed; the parent
    judges the whole cases and runs the others in later jobs: the same cases are judged as without a deadline."""
    import torch
    from gate_fixtures import QUICK_SHAPES, fixtures

    from autokernel.gate import thresholds
    from autokernel.ops import get
    fx = next(f for f in fixtures() if f.path.stem == "legit_block_warps")
    spec = get(fx.op)
    planned = numeric.plan(spec, QUICK_SHAPES[fx.op], [torch.float32], ["normal"], 3, 0,
                           thresholds.extract(fx.path.read_bytes()))
    (tmp_path / "rmsnorm.py").write_bytes(fx.path.read_bytes())
    monkeypatch.setattr(numeric, "FIRST_JOB_SOFT_S", 1e-6)
    runtime, num = numeric.run(spec, tmp_path / "rmsnorm.py", tmp_path, Policy().sandbox, 3, planned)
    assert runtime.passed and num is not None and num.passed, (runtime.detail, num and num.detail)
    assert num.metrics["cases"] == len(planned) and runtime.metrics["jobs"] >= 2


def test_a_job_that_stops_before_any_whole_case_is_incomplete(tmp_path):
    """The progress rule, parent side: a soft job that returns no whole case (whatever the child says) is
    runtime.incomplete, so a candidate cannot make the gate reschedule forever."""
    import torch

    from autokernel.ops import get
    spec = get("rmsnorm")
    planned = numeric.plan(spec, [{"M": 2, "N": 8}], [torch.float32], ["normal"], 3)

    class Stopped:
        ok, reason, detail, wall_s, isolation = True, None, "", 0.1, "test"
        data = {"failure": None, "calls": [], "ops": {}, "stopped": True}

    (tmp_path / "rmsnorm.py").write_text("")
    runtime, _ = numeric.run(spec, tmp_path / "rmsnorm.py", tmp_path, Policy().sandbox, 3, planned,
                             sandbox_run=lambda *a, **k: Stopped())
    assert not runtime.passed and runtime.reason == "runtime.incomplete", runtime
