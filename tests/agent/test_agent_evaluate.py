"""The real Evaluator's plumbing, with gate.verify and the benchmark replaced by fakes (both are tested in their own
packages): where candidates are written, gate before bench, bench only on acceptance, no second evaluation."""
import hashlib
import json
from pathlib import Path

import pytest
from agent_helpers import CHEAT, GOOD, INCUMBENT, KERNEL_FILE, sha256

import autokernel.bench.measure as bench_measure
from autokernel import gate, paths
from autokernel.agent.evaluate import Feedback, SandboxEvaluator, Unbenched, from_verdict, gate_record
from autokernel.bench.measure import FileResult, IncumbentFailed, Measurement, ShapeResult
from autokernel.bench.stats import Interval
from autokernel.candidate import Candidate
from autokernel.deadline import Deadline
from autokernel.errors import UserError
from autokernel.gate.verdict import StageResult, Verdict
from autokernel.policy import Policy

LAYOUT = paths.INSTALLED_LAYOUT  # the checkout these tests run in (the commands resolve theirs: paths.target)


def evaluator(run_dir, **kw) -> SandboxEvaluator:
    """A SandboxEvaluator on this checkout, under the built-in policy unless `policy` is given."""
    return SandboxEvaluator(run_dir, kw.pop("policy", Policy()), layout=kw.pop("layout", LAYOUT), **kw)


def verdict(op, path, accepted):
    stages = [StageResult.ok("static", "parsed")]
    stages.append(StageResult.ok("numeric", "126 cases") if accepted else
                  StageResult.fail("runtime", "runtime.torch_compute", "aten::rms_norm ran during the call"))
    source = Path(path).read_bytes()
    return Verdict(op, str(path), hashlib.sha256(source).hexdigest(), "accepted" if accepted else "rejected", stages,
                   seed=1, device={"kind": "cpu-interpreter", "timing_note": "interpreter"}, elapsed_s=0.1)


def shape(speedup, frac, calls=1):
    return ShapeResult({"M": 1, "N": 576}, "float32", calls, 20, Interval(2.0, 1.9, 2.1),
                       speedup and Interval(speedup, speedup - 0.1, speedup + 0.1), 1.0, 1.0, frac)


def measurement(status="ok", accepted=True, reason=None):
    inc = FileResult("kernels/rmsnorm.py", "incumbent", "ok", shapes=[shape(None, 0.10)])
    cand = FileResult("c.py", "candidate", status, "" if status == "ok" else "wrong on repetition 7",
                      shapes=[shape(1.5, 0.15)] if status == "ok" else [],
                      speedup=Interval(1.5, 1.4, 1.6) if status == "ok" else None, accepted=accepted, reason=reason)
    return Measurement("rmsnorm", "CPU / Triton interpreter", {}, None, {}, [inc, cand], [], "subprocess")


@pytest.fixture
def fakes(monkeypatch):
    calls = {"verify": [], "bench": []}

    def fake_verify(op, path, *, shapes=None, seed=None, policy=None, run_dir=None, **kw):
        calls["verify"].append({"op": op, "path": Path(path), "run_dir": Path(run_dir), "shapes": shapes, **kw})
        return verdict(op, path, "torch.nn.functional" not in Path(path).read_text())

    def fake_measure(op, candidates, cases, policy, job_root, incumbent=None):
        calls["bench"].append({"candidates": candidates, "cases": cases, "job_root": Path(job_root),
                               "incumbent": incumbent})
        return calls.get("measurement") or measurement()

    monkeypatch.setattr(gate, "verify", fake_verify)
    monkeypatch.setattr(bench_measure, "measure", fake_measure)
    return calls


def test_candidate_written_under_its_sha_then_gate_then_bench(tmp_path, fakes):
    ev = evaluator(tmp_path, verify_kwargs={"dists": ["normal"]})
    fb = ev.evaluate(Candidate.of("rmsnorm", GOOD))
    job = tmp_path / sha256(GOOD)[:8]
    assert (job / "rmsnorm.py").read_text() == GOOD
    assert fakes["verify"][0]["path"] == job / "rmsnorm.py" and fakes["verify"][0]["run_dir"] == job
    assert fakes["verify"][0]["dists"] == ["normal"] and fakes["verify"][0]["shapes"] is None
    assert fakes["bench"][0]["candidates"] == [job / "rmsnorm.py"] and fakes["bench"][0]["job_root"] == job
    assert [c["shape"] for c in fakes["bench"][0]["cases"]] == [{"M": 1, "N": 576}, {"M": 4, "N": 576},
                                                               {"M": 96, "N": 576}]
    assert fb.verdict == "accepted" and fb.accepted and fb.speedup == 1.5 and fb.speedup_ci == [1.4, 1.6]
    assert fb.pct_of_peak == pytest.approx(15.0) and fb.incumbent_pct_of_peak == pytest.approx(10.0)
    assert fb.per_shape[0]["speedup"] == 1.5 and fb.note == "CPU / Triton interpreter"
    assert json.loads((job / "feedback.json").read_text())["summary"] == fb.summary
    assert fb.summary == "passed the gate; speedup 1.500x [1.400, 1.600], 15.00 % of peak: accepted"


def test_the_target_checkout_gives_the_incumbent_and_the_signature(tmp_path, fakes):
    """--repo is one checkout: the gate checks the launcher against the target's kernels/<op>.py, and the bench
    times that file as the incumbent (and so does the confirming benchmark)."""
    target = tmp_path / "engine"
    (target / "kernels").mkdir(parents=True)
    (target / "kernels" / "rmsnorm.py").write_text(INCUMBENT + "# the target's own\n")
    ev = evaluator(tmp_path / "run", layout=paths.Layout(target))
    ev.evaluate(Candidate.of("rmsnorm", GOOD))
    assert fakes["verify"][0]["kernels_dir"] == target / "kernels"
    assert fakes["bench"][0]["incumbent"] == target / "kernels" / "rmsnorm.py"
    m = ev.confirm(Candidate.of("rmsnorm", GOOD))
    assert m.files[-1].accepted and fakes["bench"][1]["incumbent"] == target / "kernels" / "rmsnorm.py"
    assert fakes["bench"][1]["candidates"][0].read_text() == GOOD


def test_gate_record_keeps_the_trusted_facts(tmp_path):
    path = tmp_path / "rmsnorm.py"
    path.write_text(GOOD)
    v = verdict("rmsnorm", path, True)
    v.stages.append(StageResult.ok("e2e", "KL ok", kl_mean=1e-9, positions=40, isolation="bwrap+cgroup"))
    v.stages[1].metrics["isolation"] = "bwrap+cgroup"
    g = gate_record(from_verdict(v))
    assert g["seed"] == 1 and g["isolation"] == "bwrap+cgroup" and g["sha256"] == sha256(GOOD)
    assert g["stages"][-1]["metrics"]["kl_mean"] == 1e-9 and [s["name"] for s in g["stages"]] == [
        "static", "numeric", "e2e"]


def test_rejected_by_the_gate_is_never_benchmarked(tmp_path, fakes):
    fb = evaluator(tmp_path).evaluate(Candidate.of("rmsnorm", CHEAT))
    assert fb.verdict == "rejected" and not fb.accepted and fakes["bench"] == []
    assert fb.reasons == [{"stage": "runtime", "code": "runtime.torch_compute",
                           "detail": "aten::rms_norm ran during the call"}]
    assert fb.summary == "rejected by the gate: runtime.torch_compute: aten::rms_norm ran during the call"


def test_same_source_is_not_evaluated_again(tmp_path, fakes):
    ev = evaluator(tmp_path)
    first, again = ev.evaluate(Candidate.of("rmsnorm", GOOD)), ev.evaluate(Candidate.of("rmsnorm", GOOD))
    assert len(fakes["verify"]) == 1 and len(fakes["bench"]) == 1
    assert again.duplicate and not first.duplicate and again.sha256 == first.sha256


def test_no_win_and_failures_during_timing(tmp_path, fakes):
    fakes["measurement"] = measurement(accepted=False, reason="bench.no_win")
    fb = evaluator(tmp_path).evaluate(Candidate.of("rmsnorm", GOOD))
    assert fb.verdict == "accepted" and not fb.accepted and fb.reasons[-1]["code"] == "bench.no_win"
    assert fb.summary.endswith(": no significant win")
    fakes["measurement"] = measurement(status="numeric.mismatch", accepted=False, reason="numeric.mismatch")
    fb = evaluator(tmp_path / "2").evaluate(Candidate.of("rmsnorm", GOOD))
    assert fb.verdict == "rejected" and fb.reasons[-1] == {"stage": "bench", "code": "numeric.mismatch",
                                                           "detail": "wrong on repetition 7"}


def test_incumbent_that_cannot_be_timed_is_a_user_error(tmp_path, fakes, monkeypatch):
    def broken(*a, **k):
        raise IncumbentFailed("kernels/rmsnorm.py could not be timed: sandbox.crash: killed")
    monkeypatch.setattr(bench_measure, "measure", broken)
    with pytest.raises(UserError, match="could not be timed"):
        evaluator(tmp_path).evaluate(Candidate.of("rmsnorm", GOOD))


def test_traced_shapes_go_to_gate_and_bench(tmp_path, fakes):
    trace = tmp_path / "summary.json"
    trace.write_text(json.dumps({"ops": {"rmsnorm": {"shapes": [{"shape": {"M": 7, "N": 576}, "calls": 40}]}}}))
    evaluator(tmp_path, trace=trace).evaluate(Candidate.of("rmsnorm", GOOD))
    assert fakes["verify"][0]["shapes"] == [{"M": 7, "N": 576}]
    assert fakes["bench"][0]["cases"] == [{"shape": {"M": 7, "N": 576}, "calls": 40, "dtype": "float32"}]


def test_feedback_from_a_real_verdict_is_json(tmp_path):
    path = tmp_path / "rmsnorm.py"
    path.write_text(CHEAT)
    fb = from_verdict(verdict("rmsnorm", path, False))
    assert isinstance(fb, Feedback) and fb.device == "cpu-interpreter"
    text = json.loads(fb.to_text())
    assert list(text)[0] == "summary" and "stages" not in text and text["reasons"][0]["code"] == "runtime.torch_compute"
    assert fb.brief() == {"sha256": fb.sha256, "verdict": "rejected", "reason": "runtime.torch_compute",
                          "accepted": False, "speedup": None, "pct_of_peak": None}


class Clock:
    """A fake monotonic clock the stubbed stages advance by what they 'take'."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def timed(monkeypatch):
    """gate.verify and the bench stubbed; each records the policy it got and advances the clock by its cost."""
    clock, seen = Clock(), {"verify": [], "bench": [], "gate_s": 5.0, "verdict": None}

    def fake_verify(op, path, *, policy=None, **kw):
        seen["verify"].append(policy)
        clock.t += seen["gate_s"]
        return seen["verdict"] or verdict(op, path, True)

    def fake_measure(op, candidates, cases, policy, job_root, incumbent=None):
        seen["bench"].append(policy)
        return measurement()

    monkeypatch.setattr(gate, "verify", fake_verify)
    monkeypatch.setattr(bench_measure, "measure", fake_measure)
    return clock, seen


def test_time_left_caps_the_gate_and_the_bench(tmp_path, timed):
    clock, seen = timed
    fb = evaluator(tmp_path).evaluate(Candidate.of("rmsnorm", GOOD), Deadline.after(40.0, clock))
    assert fb.accepted
    (gp,), (bp,) = seen["verify"], seen["bench"]
    assert gp.sandbox.timeout_s == 40.0  # policy default 300: capped at the time left
    assert bp.sandbox.timeout_s == 35.0 and bp.bench.max_time_s == 30.0  # 5 s went to the gate; 30 s is the cap
    fb2 = evaluator(tmp_path / "b").evaluate(Candidate.of("rmsnorm", GOOD + "\n"), Deadline.after(25.0, clock))
    assert fb2.accepted and seen["bench"][-1].bench.max_time_s == 20.0
    evaluator(tmp_path / "c").evaluate(Candidate.of("rmsnorm", GOOD + "\n\n"))  # no deadline: policy as is
    assert seen["verify"][-1].sandbox.timeout_s == 300.0 and seen["bench"][-1].bench.max_time_s == 30.0


def test_a_bench_that_cannot_fit_is_not_started(tmp_path, timed):
    clock, seen = timed
    seen["gate_s"] = 10.0  # 15 - 10 = 5 s left, under the 6 rounds x 2 files x 1 s a bench needs at least
    with pytest.raises(TimeoutError, match="benchmark needs at least"):
        evaluator(tmp_path).evaluate(Candidate.of("rmsnorm", GOOD), Deadline.after(15.0, clock))
    assert len(seen["verify"]) == 1 and seen["bench"] == []


def test_no_time_left_runs_nothing(tmp_path, timed):
    clock, seen = timed
    with pytest.raises(TimeoutError):
        evaluator(tmp_path).evaluate(Candidate.of("rmsnorm", GOOD), Deadline.after(0.0, clock))
    seen["gate_s"] = 50.0  # the gate itself overran the deadline: no bench, a timeout
    with pytest.raises(Unbenched, match="no time left for its benchmark") as e:
        evaluator(tmp_path).evaluate(Candidate.of("rmsnorm", GOOD), Deadline.after(20.0, clock))
    assert len(seen["verify"]) == 1 and seen["bench"] == []
    assert e.value.feedback.verdict == "accepted" and e.value.feedback.sha256 == sha256(GOOD)


def test_a_timeout_under_the_capped_limit_is_the_clock_not_a_rejection(tmp_path, timed):
    clock, seen = timed
    path = tmp_path / "x.py"
    path.write_text(GOOD)
    seen["verdict"] = Verdict("rmsnorm", str(path), sha256(GOOD), "rejected",
                              [StageResult.ok("static", "parsed"),
                               StageResult.fail("numeric", "sandbox.timeout", "killed after 20 s")], seed=1,
                              device={"kind": "cpu-interpreter"}, elapsed_s=20.0)
    with pytest.raises(TimeoutError, match="deadline-capped"):
        evaluator(tmp_path).evaluate(Candidate.of("rmsnorm", GOOD), Deadline.after(20.0, clock))
    fb = evaluator(tmp_path / "b").evaluate(Candidate.of("rmsnorm", GOOD))  # uncapped: the candidate's own
    assert fb.verdict == "rejected" and fb.reasons[0]["code"] == "sandbox.timeout"


def test_the_loop_ends_as_spent_budget_when_the_evaluator_times_out(tmp_path, timed):
    from agent_helpers import ScriptedModel, turn

    from autokernel.agent.loop import Session
    from autokernel.agent.prompt import build
    from autokernel.policy import Agent
    clock, seen = timed
    seen["gate_s"] = 100.0
    policy = Agent(max_wall_s=50.0)
    model = ScriptedModel([turn("", ("submit_candidate", {"source": GOOD}))])
    prompt = build("rmsnorm", policy, kernel_file=KERNEL_FILE)
    ev = evaluator(tmp_path)
    s = Session("rmsnorm", model, ev, prompt, policy, tmp_path / "run", clock=clock)
    r = s.run()
    assert r.status == "limit" and "during an evaluation" in r.detail and r.submitted == 1
    assert seen["verify"][0].sandbox.timeout_s == 50.0 and seen["bench"] == []
    (kept,) = r.unbenched  # the gate's verdict is kept for `autokernel run --resume`, not thrown away
    assert kept.source == GOOD and kept.feedback.verdict == "accepted" and kept.feedback.speedup is None


def test_a_bench_timeout_under_the_capped_limit_keeps_the_gate_verdict(tmp_path, timed, monkeypatch):
    clock, seen = timed
    monkeypatch.setattr(bench_measure, "measure", lambda *a, **kw: measurement("sandbox.timeout", False,
                                                                                "sandbox.timeout"))
    with pytest.raises(Unbenched, match="deadline-capped") as e:
        evaluator(tmp_path).evaluate(Candidate.of("rmsnorm", GOOD), Deadline.after(40.0, clock))
    assert e.value.feedback.verdict == "accepted" and e.value.feedback.reasons == []  # the gate's, untouched
    fb = evaluator(tmp_path / "b").evaluate(Candidate.of("rmsnorm", GOOD))  # uncapped: the candidate's own
    assert fb.verdict == "rejected" and fb.reasons[-1]["code"] == "sandbox.timeout"
