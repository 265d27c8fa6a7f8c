"""agent.workers (autokernel/agent/workers.py) through the one orchestration path (run.pipeline -> work_on ->
agent.command.start -> workers.run -> the real git delivery, on a temporary clone).

The evaluator is a double of the whole Evaluator protocol (gate() and bench() apart): its verdicts are fixed
data, while what is under test is real: the fan-out over slots, the benchmark lock, one judgement per source across
workers, the ledger and the commit. Its gate waits on a barrier that the three first submissions must reach
together, so gates that were not run in parallel fail the test (BrokenBarrierError), and its bench notes how many
benchmarks overlap, so a missing lock fails it too."""
import io
import threading
import time
from pathlib import Path

import git
import pytest
import sandbox_entries
from agent_helpers import CHEAT, GOOD, KERNEL_FILE, PLANTED, ScriptedModel, sha256, turn
from delivery_doubles import measurement, write_trace
from rich.console import Console

from autokernel import paths, run
from autokernel.agent import workers
from autokernel.agent.evaluate import Feedback
from autokernel.agent.ledger import Ledger
from autokernel.candidate import Candidate
from autokernel.deadline import Deadline
from autokernel.policy import Policy
from autokernel.sandbox.slots import Slot, pinned_env

ROOT = Path(__file__).parents[2]
SPEEDUP = {sha256(PLANTED): 0.6, sha256(GOOD): 1.5}  # the planted-slow kernel loses, the num_warps=8 one wins


class StagedStub:
    """Gate: rejects torch.nn.functional (static.forbidden_import, as the real static stage does), passes the rest.
    Bench: SPEEDUP's figure, accepted above 1.02. `barrier` parties must be in gate() at once."""

    def __init__(self, op_dir: Path, barrier: int = 0):
        self.op_dir, self.lock = Path(op_dir), threading.Lock()
        self.barrier = threading.Barrier(barrier, timeout=60) if barrier else None
        self.gated, self.benched, self.confirmed, self.slot_env = [], [], [], []
        self.active = self.max_active = 0

    def gate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        op, digest = candidate.op, candidate.sha256
        with self.lock:
            self.gated.append(digest)
            self.slot_env.append(pinned_env())
        if self.barrier is not None and len(self.gated) <= self.barrier.parties:
            self.barrier.wait()  # BrokenBarrierError (the test fails) unless the first gates run in parallel
        if "torch.nn.functional" in candidate.text:
            return Feedback(op, digest, "rejected", reasons=[{
                "stage": "static", "code": "static.forbidden_import", "detail": "import torch.nn.functional"}])
        return Feedback(op, digest, "accepted", device="cpu-interpreter", seed=7, isolation="stub",
                        path=str(self.op_dir / digest[:8] / f"{op}.py"))

    def bench(self, candidate: Candidate, fb: Feedback, deadline: Deadline = Deadline.none()) -> Feedback:
        with self.lock:
            self.benched.append(fb.sha256)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        time.sleep(0.2)  # long enough that two unlocked benchmarks would overlap
        with self.lock:
            self.active -= 1
        s = SPEEDUP[fb.sha256]
        fb.speedup, fb.speedup_ci, fb.accepted = s, [s - 0.05, s + 0.05], s - 0.05 > 1.02
        if not fb.accepted:
            fb.reasons.append({"stage": "bench", "code": "bench.no_win", "detail": f"{s}x"})
        return fb

    def evaluate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        fb = self.gate(candidate)
        return self.bench(candidate, fb) if fb.verdict == "accepted" else fb

    def check(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> dict | None:
        return None

    def confirm(self, candidate: Candidate):
        self.confirmed.append(candidate.sha256)
        return measurement(candidate.op, speedup=1.5)


def scripts() -> list[ScriptedModel]:
    """Worker 0 cheats; worker 1 submits a slower kernel and then worker 0's cheat (one evaluation for both);
    worker 2 submits the win."""
    models = [ScriptedModel([turn("", ("submit_candidate", {"source": CHEAT})), turn("", ("finish", {}))]),
              ScriptedModel([turn("", ("submit_candidate", {"source": PLANTED})),
                             turn("", ("submit_candidate", {"source": CHEAT})), turn("", ("finish", {}))]),
              ScriptedModel([turn("the num_warps=8 variant", ("submit_candidate", {"source": GOOD})),
                             turn("", ("finish", {"summary": "num_warps=8"}))])]
    for i, m in enumerate(models):
        m.name = f"scripted-{i}"
    return models


@pytest.fixture
def clone(tmp_path):
    return Path(git.Repo.clone_from(ROOT, tmp_path / "clone").working_tree_dir)


def pipeline(wd: Path, trace: Path, evaluators: list, barrier: int, policy: Policy):
    def make(op_dir, *a):
        evaluators.append(StagedStub(op_dir, barrier))
        return evaluators[-1]

    pool = workers.SlotPool([Slot(i, {"AUTOKERNEL_SLOT": str(i)}) for i in range(3)])
    ctx = run.Context(paths.Layout(wd), policy, policy.agent, scripts(), make, Console(file=io.StringIO()),
                      yes=True, executor=pool)
    try:
        return run.pipeline(ctx, op="rmsnorm", resume=None, trace=trace)
    finally:
        pool.shutdown()


def test_three_workers_commit_the_one_win_and_a_second_run_skips_the_judged(clone, tmp_path):
    policy = Policy.model_validate({"agent": {"workers": 3, "early_success": False}})
    evaluators: list[StagedStub] = []
    state, (out,) = pipeline(clone, write_trace(tmp_path / "t1"), evaluators, 3, policy)
    ev = evaluators[0]
    assert sorted(ev.gated) == sorted({sha256(CHEAT), sha256(PLANTED), sha256(GOOD)})  # the cheat once, not twice
    assert sorted(e["AUTOKERNEL_SLOT"] for e in ev.slot_env) == ["0", "1", "2"]  # each gate pinned to its own slot
    assert sorted(ev.benched) == sorted([sha256(PLANTED), sha256(GOOD)]) and ev.max_active == 1
    assert ev.confirmed == [sha256(GOOD)]
    assert out.status == "committed", out.detail
    repo = git.Repo(clone)
    assert repo.commit(out.sha).tree["kernels/rmsnorm.py"].data_stream.read().decode() == GOOD
    assert "scripted-2" in repo.commit(out.sha).message  # the winning worker's model is the provenance
    assert repo.active_branch.name == "main" and not repo.is_dirty()
    ledger = Ledger.of(paths.Layout(clone)).entries("rmsnorm")
    assert sorted(e["sha256"] for e in ledger) == sorted(ev.gated)  # every candidate, each once
    assert {e["sha256"]: e["reason"] for e in ledger}[sha256(CHEAT)] == "static.forbidden_import"
    assert all((state.run_dir / "rmsnorm" / f"worker-{i}" / "transcript.json").is_file() for i in range(3))

    _, (again,) = pipeline(clone, write_trace(tmp_path / "t2"), evaluators, 0, policy)
    # The rejected cheat and the slower kernel are answered from the ledger; the accepted source is answered from
    # the branch that already carries it over this base (issue 23: no duplicate work or PRs): nothing is judged.
    assert evaluators[1].gated == [], evaluators[1].gated
    assert again.status == "already_delivered" and again.sha == out.sha


def test_early_success_stops_the_other_workers_at_their_next_turn(tmp_path):
    """Worker 1's first reply waits until worker 0's win is benchmarked; its next turn is then never asked for."""
    from autokernel.agent import prompt as prompt_mod
    won = threading.Event()

    class Waits(ScriptedModel):
        def query(self, messages, tools, deadline=None):
            assert won.wait(30)
            return super().query(messages, tools, deadline)

    ev = StagedStub(tmp_path)
    bench = ev.bench
    ev.bench = lambda *a, **k: (fb := bench(*a, **k), won.set() if fb.accepted else None)[0]
    winner = ScriptedModel([turn("", ("submit_candidate", {"source": GOOD})), turn("", ("finish", {}))])
    other = Waits([turn("", ("submit_candidate", {"source": PLANTED})),
                   turn("", ("submit_candidate", {"source": CHEAT})), turn("", ("finish", {}))])
    settings = Policy.model_validate({"agent": {"workers": 2}}).agent
    pool = workers.SlotPool([Slot(0, {}), Slot(1, {})])
    try:
        prompt = prompt_mod.build("rmsnorm", settings, kernel_file=KERNEL_FILE)
        result, session = workers.run("rmsnorm", [winner, other], ev, prompt, settings, tmp_path / "op", executor=pool)
    finally:
        pool.shutdown()
    assert result.best.feedback.sha256 == sha256(GOOD) and session.model is winner
    assert len(other.replies) == 2 and sha256(CHEAT) not in ev.gated  # stopped before its second turn
    assert "worker 1: early_success (worker 0 has an accepted candidate" in result.detail


def test_gate_jobs_wait_for_a_free_slot_and_see_its_env():
    """At most one job per slot: with one slot, two jobs never overlap, and each sees the slot's env."""
    pool = workers.SlotPool([Slot(0, {"X": "only"})])
    active, peak, lock = [0], [0], threading.Lock()

    def job():
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.1)
        with lock:
            active[0] -= 1
        return pinned_env()

    try:
        envs = [f.result() for f in [pool.submit(job), pool.submit(job)]]
    finally:
        pool.shutdown()
    assert envs == [{"X": "only"}] * 2 and peak[0] == 1 and pinned_env() == {}


def test_two_workers_submitting_the_same_source_at_once_cost_one_evaluation(tmp_path):
    """Both first turns submit the planted kernel while neither verdict exists yet (no ledger line to answer from):
    the second waits for the first one's judgement and is answered as a duplicate, not counted."""
    from autokernel.agent import prompt as prompt_mod
    ev = StagedStub(tmp_path)
    gate = ev.gate
    ev.gate = lambda *a, **k: (time.sleep(0.3), gate(*a, **k))[1]  # both submissions are in flight together
    models = [ScriptedModel([turn("", ("submit_candidate", {"source": PLANTED})), turn("", ("finish", {}))])
              for _ in range(2)]
    settings = Policy.model_validate({"agent": {"workers": 2}}).agent
    pool = workers.SlotPool([Slot(0, {}), Slot(1, {})])
    try:
        prompt = prompt_mod.build("rmsnorm", settings, kernel_file=KERNEL_FILE)
        result, _ = workers.run("rmsnorm", models, ev, prompt, settings, tmp_path / "op", executor=pool)
    finally:
        pool.shutdown()
    assert ev.gated == [sha256(PLANTED)] and result.submitted == 1


def test_a_sandboxed_job_started_in_a_pinned_thread_gets_the_slots_env(tmp_path):
    """The pin reaches the sandboxed process itself (sandbox.run lays the slot's env under its own `env`): how a
    whole gate, several sandbox jobs deep, runs on one GPU without an argument threaded through its stages."""
    from autokernel import sandbox
    from autokernel.sandbox.slots import pinned
    src = b"import os\ndef main(job_dir):\n    return os.environ.get('OMP_NUM_THREADS')\n"

    def job(name):
        return sandbox.run(sandbox_entries.call_candidate, {"candidate": "c.py"}, tmp_path / name,
                           Policy().sandbox, inputs={"c.py": src}, pythonpath=[ROOT / "tests" / "sandbox"])

    with pinned(Slot(0, {"OMP_NUM_THREADS": "3"})):
        r = job("pinned")
    assert r.ok and r.data == {"result": "3"}, r
    r = job("free")
    assert r.ok and r.data["result"] != "3", r
