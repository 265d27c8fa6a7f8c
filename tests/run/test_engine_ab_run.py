"""The engine tokens/s A/B in a delivered win (issue 23): run.py runs it after the confirming benchmark, within the
session's time left, and the PR body shows its figures, labelled, or says why there are none."""
import dataclasses
import io
import json
from pathlib import Path

import git
from delivery_doubles import ScriptedModel, StubEvaluator, measurement, turn, write_trace
from rich.console import Console

from autokernel import paths, run
from autokernel.bench import engine_ab
from autokernel.bench.stats import Interval
from autokernel.git import report
from autokernel.paths import INSTALLED_LAYOUT
from autokernel.policy import Policy

GATE = {"seed": 7, "isolation": "bwrap", "sha256": "ab" * 32, "stages": []}
AB = engine_ab.EngineAB("rmsnorm", "CPU / Triton-interpreter CPU time", 6, 16, 8,
                        [Interval(10.35, 10.24, 10.46), Interval(17.48, 17.47, 17.49)], Interval(1.689, 1.672, 1.707),
                        Interval(3.193, 3.188, 3.197), True, 0.95, {"prefill": 1, "decode": 1}, elapsed_s=118.4)


def _ctx(tmp_path: Path, max_wall_s: float, engine_ab_fn) -> run.Context:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "rmsnorm.py").write_text(INSTALLED_LAYOUT.kernel_file("rmsnorm").read_text())
    repo = git.Repo.init(tmp_path)  # the delivery stages over the checkout's base commit
    repo.index.add(["kernels/rmsnorm.py"])
    repo.index.commit("base", author=git.Actor("t", "t@example.com"), committer=git.Actor("t", "t@example.com"))
    llm = ScriptedModel([turn("", ("submit_candidate", {"source": "# faster\n"})),
                         turn("", ("finish", {"summary": "done"}))])
    pol = Policy()
    pol.git.commit = False  # staged: <op_dir>/delivery/pr.md is the body a commit would carry
    pol.agent.max_wall_s = max_wall_s
    return run.Context(paths.Layout(tmp_path), pol, pol.agent, llm, lambda op_dir, *a: StubEvaluator(op_dir),
                       Console(file=io.StringIO()), yes=True, engine_ab=engine_ab_fn)


def test_the_pr_body_shows_the_ab_labelled_as_interpreter_time():
    w = report.Win("rmsnorm", measurement(speedup=5.1), GATE, share=0.01, engine_ab=AB)
    body = report.body(w, "0" * 40)
    assert ("End-to-end tokens/s (the engine with vs without this kernel; Triton-interpreter CPU time of an engine "
            "whose every other op runs its torch reference, so the op weighs more there than in the profile and the "
            "figure can pass the Amdahl bound above: the interpreter's tokens/s, not GPU speed): decode **10.3 -> "
            "17.5 tokens/s**, x1.689 [1.672, 1.707]; prefill of 16 tokens x3.193 [3.188, 3.197]. Paired over 6 "
            "interleaved rounds in 118 s (A B, B A, ...; each arm a fresh sandboxed process), 95 % confidence "
            "intervals. Workload: the first e2e prompt's first 16 tokens, 8 greedy decode steps.") in body
    assert "not measured" not in body
    ev = json.loads(report.evidence(w, "0" * 40))["engine_ab"]
    assert ev["speedup"] == [1.689, 1.672, 1.707] and ev["decode_tokens_per_s"][1] == [17.48, 17.47, 17.49]


def test_a_phase_without_the_op_is_said_to_have_none_rather_than_a_ratio_of_noise():
    """The first real nightly's attention_decode A/B printed 'prefill of 16 tokens x0.970 [0.692, 1.051]': the op is
    never called in the prefill, so that ratio was the two processes' noise."""
    ab = dataclasses.replace(AB, op_calls={"prefill": 0, "decode": 30})
    body = report.body(report.Win("attention_decode", measurement(speedup=1.1), GATE, engine_ab=ab), "0" * 40)
    assert "decode **10.3 -> 17.5 tokens/s**, x1.689 [1.672, 1.707]; prefill of 16 tokens: the op is not called " \
           "there. Paired over 6" in body
    ab = dataclasses.replace(AB, op_calls={"prefill": 30, "decode": 0})  # attention: the prefill's op
    assert "): decode: the op is not called there; prefill of 16 tokens x3.193 [3.188, 3.197]. Paired" in \
        report.tokens_line(ab)


def test_the_pr_body_says_not_measured_with_the_reason():
    w = report.Win("rmsnorm", measurement(speedup=5.1), GATE, engine_ab=engine_ab.NotMeasured(
        "not enough budget left: needs ~92 s (6 rounds of 2 fresh engine processes), 20 s left"))
    body = report.body(w, "0" * 40)
    assert ("End-to-end tokens/s (the engine with vs without this kernel): **not measured**: not enough budget left: "
            "needs ~92 s (6 rounds of 2 fresh engine processes), 20 s left. The bound above") in body
    assert json.loads(report.evidence(w, "0" * 40))["engine_ab"] == {"not_measured": "not enough budget left: needs "
                                                                     "~92 s (6 rounds of 2 fresh engine processes), "
                                                                     "20 s left"}


def test_a_win_is_measured_end_to_end_within_the_sessions_time_left(tmp_path):
    calls = []

    def fake(op, incumbent, candidate, policy, job_root, *, kernels_dir, deadline, trace, weights):
        calls.append((op, Path(incumbent), candidate, deadline.left(), trace, weights))
        return AB
    ctx = _ctx(tmp_path, 500.0, fake)
    state, (o,) = run.pipeline(ctx, op="rmsnorm", resume=None, trace=write_trace(tmp_path / "trace-1"))
    assert o.status == "accepted", o
    ((op, incumbent, candidate, left, trace, weights),) = calls
    assert op == "rmsnorm" and incumbent == tmp_path / "kernels" / "rmsnorm.py" and candidate == b"# faster\n"
    assert 400 < left <= 500  # the session's deadline (agent.max_wall_s from its start), not an unlimited one
    assert trace["ops"]["rmsnorm"]["calls"] == 60  # the run's profile sizes the prediction
    assert weights is None  # the stub's e2e stage recorded none: the policy's
    assert "decode **10.3 -> 17.5 tokens/s**, x1.689 [1.672, 1.707]" in Path(o.pr_body).read_text()


def test_a_win_with_no_time_left_says_so_without_starting_an_engine(tmp_path):
    ctx = _ctx(tmp_path, 30.0, engine_ab.measure)  # the real A/B: its own budget check, no job started
    state, (o,) = run.pipeline(ctx, op="rmsnorm", resume=None, trace=write_trace(tmp_path / "trace-1"))
    body = Path(o.pr_body).read_text()
    assert "End-to-end tokens/s (the engine with vs without this kernel): **not measured**: not enough budget " \
           "left: needs ~" in body
    assert " s left of agent.max_wall_s 30." in body
    assert not (state.run_dir / "rmsnorm" / "engine-ab").exists()


def test_a_run_with_an_injected_evaluator_runs_no_engine_and_says_so(tmp_path):
    ctx = _ctx(tmp_path, 500.0, None)
    state, (o,) = run.pipeline(ctx, op="rmsnorm", resume=None, trace=write_trace(tmp_path / "trace-1"))
    assert "**not measured**: this run's evaluator is not the sandbox's (an injected one): no engine was run." in \
        Path(o.pr_body).read_text()
