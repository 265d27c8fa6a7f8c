"""The loop with a scripted model: tools, budgets, early stop, the transcript after every step; one wall-clock
deadline through model calls and evaluations; what the model is told after each submission."""
import json

import pytest
from agent_helpers import CHEAT, GOOD, ScriptedModel, StubEvaluator, WholeEvaluator, turn

from autokernel.agent.evaluate import from_verdict
from autokernel.agent.loop import Session
from autokernel.agent.providers import ModelError, ModelUnavailable
from autokernel.errors import UserError
from autokernel.gate.verdict import StageResult, Verdict
from autokernel.policy import Agent


def run(tmp_path, prompt, replies, policy=None, evaluator=None, on_query=None):
    model = ScriptedModel(replies, on_query)
    ev = evaluator or StubEvaluator()
    result = Session("rmsnorm", model, ev, prompt, policy or Agent(), tmp_path).run()
    return result, model, ev, json.loads((tmp_path / "transcript.json").read_text())


def test_cheat_rejected_then_real_kernel_accepted(tmp_path, rmsnorm_prompt):
    result, model, ev, t = run(tmp_path, rmsnorm_prompt, [
        turn("reading", ("read_kernel", {}), ("read_spec", {})),
        turn("library call", ("submit_candidate", {"source": CHEAT})),
        turn("real kernel", ("submit_candidate", {"source": GOOD})),
        turn("done", ("finish", {"summary": "num_warps=8"})),
    ])
    assert result.status == "finished" and result.detail == "num_warps=8"
    assert result.best.source == GOOD and result.best.feedback.accepted
    assert result.submitted == 2 and len(ev.calls) == 2
    # the read tools answer with the incumbent and the spec; the model saw the rejection before its next turn
    assert model.seen[1][-2]["content"] == rmsnorm_prompt.kernel
    assert model.seen[1][-1]["content"] == rmsnorm_prompt.spec
    rejection = json.loads(model.seen[2][-1]["content"])
    assert rejection["verdict"] == "rejected" and rejection["reasons"][0]["code"] == "static.forbidden_import"
    assert rejection["summary"].startswith("rejected by the gate: static.forbidden_import")
    # the transcript is the message list, with the outcome around it
    assert [m["role"] for m in t["messages"]] == ["system", "user", "assistant", "tool", "tool", "assistant", "tool",
                                                  "assistant", "tool", "assistant", "tool"]
    assert t["status"] == "finished" and t["submitted"] == 2
    assert t["best"]["sha256"] == result.best.feedback.sha256
    assert [c["verdict"] for c in t["candidates"]] == ["rejected", "accepted"]


def test_transcript_saved_after_every_step(tmp_path, rmsnorm_prompt):
    lengths = []

    def look(messages):
        saved = json.loads((tmp_path / "transcript.json").read_text())
        lengths.append(len(saved["messages"]))
        assert saved["messages"] == messages and saved["status"] == "running"

    replies = [turn("a", ("read_kernel", {})), turn("b", ("submit_candidate", {"source": GOOD})),
               turn("c", ("finish", {}))]
    lengths_expected = [4, 6]  # system, user, assistant, tool; then one more assistant + tool
    result, *_ = run(tmp_path, rmsnorm_prompt, replies, on_query=lambda m: look(m) if len(m) > 2 else None)
    assert lengths == lengths_expected and result.status == "finished"


@pytest.mark.parametrize("field,value,usage,expect", [
    ("max_iterations", 2, {}, "submissions budget spent: 2 of 2"),
    ("max_tokens", 2500, {"input_tokens": 1000, "output_tokens": 200}, "tokens budget spent: 3600 of 2500"),
    ("max_usd", 0.05, {"usd": 0.02}, "usd budget spent: 0.06 of 0.05"),
])
def test_budgets_stop_the_session_mid_way(tmp_path, rmsnorm_prompt, field, value, usage, expect):
    sources = [GOOD.replace("num_warps=8", f"num_warps={w}") for w in (1, 2, 4, 8, 16)]
    replies = [turn(f"try {i}", ("submit_candidate", {"source": s}), **usage) for i, s in enumerate(sources)]
    policy = Agent(**{field: value}, target_fraction_of_peak=1.0)
    result, model, ev, t = run(tmp_path, rmsnorm_prompt, replies, policy)
    assert result.status == "limit" and result.detail == expect
    assert len(model.replies) > 0  # stopped before the script ran out
    assert t["status"] == "limit" and t["detail"] == expect
    assert result.best is not None  # what was accepted before the limit is kept


def test_wall_clock_budget(tmp_path, rmsnorm_prompt):
    now = [0.0]

    def tick(messages):  # the second model call takes 11 s
        now[0] += 11.0 if len(messages) == 4 else 1.0
    model = ScriptedModel([turn("a", ("read_kernel", {})), turn("b", ("read_spec", {})),
                           turn("c", ("read_kernel", {}))], on_query=tick)
    result = Session("rmsnorm", model, StubEvaluator(), rmsnorm_prompt, Agent(max_wall_s=10), tmp_path,
                     clock=lambda: now[0]).run()
    assert result.status == "limit" and result.detail == "wall_s budget spent: 12 of 10"
    assert len(model.replies) == 1


def test_target_fraction_of_peak_stops_early(tmp_path, rmsnorm_prompt):
    replies = [turn("a", ("submit_candidate", {"source": GOOD})), turn("never asked", ("finish", {}))]
    result, model, *_ = run(tmp_path, rmsnorm_prompt, replies, Agent(target_fraction_of_peak=0.4),
                            evaluator=StubEvaluator(pct_of_peak=42.0))
    assert result.status == "target_reached" and "42.0 % of peak (target 40 %)" in result.detail
    assert len(model.replies) == 1


def test_malformed_calls_are_answered_and_the_model_tries_again(tmp_path, rmsnorm_prompt):
    replies = [
        turn("bad json", ("submit_candidate", '{"source": "unterminated')),
        turn("wrong tool", ("compile_and_run", {"cmd": "nvcc"})),
        turn("no source", ("submit_candidate", {"src": GOOD})),
        turn("just talking"),
        turn("cut off", truncated=True),
        turn("ok", ("submit_candidate", {"source": GOOD})),
        turn("bye", ("finish", {"summary": "s"})),
    ]
    result, model, ev, t = run(tmp_path, rmsnorm_prompt, replies)
    answers = [m["content"] for m in t["messages"][2:] if m["role"] in ("tool", "user")]
    assert answers[0].startswith("error: the arguments of submit_candidate are not a JSON object")
    assert answers[1].startswith("error: there is no tool 'compile_and_run'")
    assert answers[2].startswith("error: submit_candidate needs `source`")
    assert answers[3].startswith("Reply with a tool call")
    assert answers[4].startswith("Your reply was cut off")
    assert result.status == "finished" and result.submitted == 1 and len(ev.calls) == 1


def test_out_of_submissions_within_one_turn(tmp_path, rmsnorm_prompt):
    a, b = GOOD, GOOD.replace("num_warps=8", "num_warps=2")
    replies = [turn("two at once", ("submit_candidate", {"source": a}), ("submit_candidate", {"source": b}))]
    result, model, ev, t = run(tmp_path, rmsnorm_prompt, replies, Agent(max_iterations=1))
    assert t["messages"][-1]["content"].startswith("error: all 1 submissions are used")
    assert result.status == "limit" and len(ev.calls) == 1


def test_best_is_the_fastest_accepted(tmp_path, rmsnorm_prompt):
    class Ranked(StubEvaluator):
        def evaluate(self, candidate, deadline=None):
            fb = super().evaluate(candidate)
            fb.speedup = {1: 1.1, 2: 1.4, 4: 1.2}[int(candidate.text.split("num_warps=")[1][0])]
            return fb
    sources = [GOOD.replace("num_warps=8", f"num_warps={w}") for w in (1, 2, 4)]
    replies = [turn("", ("submit_candidate", {"source": s})) for s in sources] + [turn("", ("finish", {}))]
    result, *_ = run(tmp_path, rmsnorm_prompt, replies, Agent(target_fraction_of_peak=1.0), evaluator=Ranked())
    assert "num_warps=2" in result.best.source and result.best.feedback.speedup == 1.4


def test_no_accepted_candidate_means_no_best(tmp_path, rmsnorm_prompt):
    replies = [turn("", ("submit_candidate", {"source": CHEAT})), turn("", ("finish", {}))]
    result, *_ = run(tmp_path, rmsnorm_prompt, replies)
    assert result.best is None and result.status == "finished"


def test_model_error_ends_the_session_with_the_transcript_saved(tmp_path, rmsnorm_prompt):
    class Broken(ScriptedModel):
        def query(self, messages, tools, deadline=None):
            if len(messages) > 2:
                raise ModelError("openai: HTTP 500 from x after 4 retries: boom")
            return super().query(messages, tools, deadline)
    model = Broken([turn("a", ("submit_candidate", {"source": GOOD}))])
    result = Session("rmsnorm", model, StubEvaluator(), rmsnorm_prompt, Agent(), tmp_path).run()
    t = json.loads((tmp_path / "transcript.json").read_text())
    assert result.status == "model_error" and "HTTP 500" in result.detail and result.best is not None
    assert result.error == result.detail  # an outcome of its own: the run reports it, it is not "no improvement"
    assert t["status"] == "model_error" and t["error"] == result.error and len(t["messages"]) == 4


def test_a_clean_end_has_no_error(tmp_path, rmsnorm_prompt):
    result, *_ = run(tmp_path, rmsnorm_prompt, [turn("", ("submit_candidate", {"source": CHEAT})),
                                                turn("", ("finish", {}))])
    assert result.status == "finished" and result.best is None and result.error is None


def test_user_error_propagates_after_saving(tmp_path, rmsnorm_prompt):
    class NoKey(ScriptedModel):
        def query(self, messages, tools, deadline=None):
            raise UserError("anthropic: api.anthropic.com refused the API key (HTTP 401)")
    with pytest.raises(UserError):
        Session("rmsnorm", NoKey([]), StubEvaluator(), rmsnorm_prompt, Agent(), tmp_path).run()
    assert json.loads((tmp_path / "transcript.json").read_text())["status"] == "error"


def test_a_duplicate_submission_is_answered_from_memory_and_not_counted(tmp_path, rmsnorm_prompt):
    other = GOOD.replace("num_warps=8", "num_warps=2")
    replies = [turn("", ("submit_candidate", {"source": GOOD})), turn("", ("submit_candidate", {"source": GOOD})),
               turn("", ("submit_candidate", {"source": other})), turn("", ("finish", {}))]
    result, model, ev, t = run(tmp_path, rmsnorm_prompt, replies, Agent(max_iterations=2, target_fraction_of_peak=1))
    again = json.loads(model.seen[2][-1]["content"])
    assert again["duplicate"] is True and again["budget_left"]["submissions"] == 1
    assert json.loads(t["messages"][-1]["content"])["verdict"] == "accepted"  # the third was still evaluated
    assert result.submitted == 2 and ev.calls == [GOOD, other]
    assert result.status == "limit" and result.detail == "submissions budget spent: 2 of 2"


def test_a_cut_off_reply_runs_none_of_its_tool_calls(tmp_path, rmsnorm_prompt):
    """At the output limit the last tool call is incomplete: as raw text (OpenAI) or as a partial object that
    parses (a streaming parser's best guess): neither is run, both get the cut-off reply, no submission is spent."""
    replies = [turn("", ("submit_candidate", '{"source": "import triton\\nimport tor'), truncated=True),
               turn("", ("read_kernel", {}), ("submit_candidate", {"source": "import triton\n"}), truncated=True),
               turn("", ("finish", {}))]
    result, model, ev, t = run(tmp_path, rmsnorm_prompt, replies)
    answers = [m["content"] for m in t["messages"] if m["role"] == "tool"][:3]
    assert all(a.startswith("Your reply was cut off at the output-token limit") for a in answers)
    assert "not a JSON object" not in json.dumps(t["messages"]) and ev.calls == [] and result.submitted == 0


def test_every_static_finding_budget_slack_and_kl_reach_the_model(tmp_path, rmsnorm_prompt):
    """The feedback carries what the gate measured, built from real Verdicts through the real from_verdict."""
    from autokernel.gate import static
    from autokernel.paths import INSTALLED_LAYOUT
    bad = CHEAT.replace("import torch\n", "import torch\nimport os\n") + "\nX = eval('1')\n"
    findings = static.check_source(bad, "rmsnorm", INSTALLED_LAYOUT.kernels / "rmsnorm.py")
    assert not findings.passed and len(findings.metrics["findings"]) >= 2
    good_stages = [StageResult.ok("static"), StageResult.ok("runtime", isolation="bwrap"),
                   StageResult.ok("numeric", worst_error_ratio={"float32": 0.31, "bfloat16": 0.52}, cases=12),
                   StageResult.ok("e2e", kl_mean=1.1e-11, kl_p99=3e-11, kl_max=9e-11, top1=1.0, positions=48)]

    class FromVerdicts(WholeEvaluator):
        def evaluate(self, candidate, deadline=None):
            op, source = candidate.op, candidate.text
            stages = [findings] if source == bad else good_stages
            v = Verdict(op, "x.py", candidate.sha256, "rejected" if source == bad else "accepted", stages, 1234,
                        {"kind": "cpu-interpreter"}, 1.0)
            fb = from_verdict(v)
            if source != bad:
                fb.accepted, fb.speedup, fb.speedup_ci = True, 1.3, [1.2, 1.4]
            return fb
    replies = [turn("", ("submit_candidate", {"source": bad})), turn("", ("submit_candidate", {"source": GOOD})),
               turn("", ("finish", {}))]
    result, model, ev, t = run(tmp_path, rmsnorm_prompt, replies, evaluator=FromVerdicts())
    rejected, accepted = (json.loads(model.seen[i][-1]["content"]) for i in (1, 2))
    assert rejected["static_findings"] == findings.metrics["findings"]  # every one, not "(+3 more)"
    assert rejected["budget_left"]["submissions"] == 5 and 0 < rejected["budget_left"]["wall_s"] <= 600
    assert accepted["numeric_worst_error_over_tolerance"] == {"float32": 0.31, "bfloat16": 0.52}
    assert accepted["e2e_kl_nats"] == {"kl_mean": 1.1e-11, "kl_p99": 3e-11, "kl_max": 9e-11, "top1": 1.0}
    assert accepted["budget_left"]["submissions"] == 4
    assert "seed" not in accepted and "1234" not in model.seen[2][-1]["content"]  # a later file cannot key on it


class Clock:
    """A fake monotonic clock the tests advance."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_deadline_reaches_model_and_evaluator_and_an_overrun_ends_the_session(tmp_path, rmsnorm_prompt):
    clock = Clock()

    class Timed(StubEvaluator):
        def __init__(self):
            super().__init__()
            self.time_left = []

        def evaluate(self, candidate, deadline=None):
            self.time_left.append(deadline.left())
            clock.now += 95.0  # the evaluation overruns the 100 s budget
            return super().evaluate(candidate)

    def tick(messages):
        clock.now += 5.0  # each model call takes 5 s
    model = ScriptedModel([turn("", ("read_kernel", {})), turn("", ("submit_candidate", {"source": GOOD})),
                           turn("never asked", ("finish", {}))], on_query=tick)
    ev = Timed()
    result = Session("rmsnorm", model, ev, rmsnorm_prompt, Agent(max_wall_s=100), tmp_path, clock=clock).run()
    assert model.time_left == [100.0, 95.0] and ev.time_left == [90.0]
    assert result.status == "limit" and result.detail == "wall_s budget spent: 105 of 100"
    assert result.submitted == 1 and len(model.replies) == 1  # the verdict is kept; no model call after it


@pytest.mark.parametrize("where", ["model", "evaluator"])
def test_a_callee_that_runs_out_of_time_ends_the_session_as_spent_budget(tmp_path, rmsnorm_prompt, where):
    class Late(ScriptedModel):
        def query(self, messages, tools, deadline=None):
            if where == "model" and len(messages) > 2:
                raise TimeoutError("openai: no complete reply before the wall-clock budget ran out")
            return super().query(messages, tools, deadline)

    class LateEvaluator(StubEvaluator):
        def evaluate(self, candidate, deadline=None):
            raise TimeoutError("the gate's e2e stage did not fit the time left")
    model = Late([turn("", ("submit_candidate", {"source": GOOD})), turn("", ("finish", {}))])
    result = Session("rmsnorm", model, LateEvaluator() if where == "evaluator" else StubEvaluator(), rmsnorm_prompt,
                     Agent(), tmp_path).run()
    assert result.status == "limit" and result.detail.startswith("wall_s budget spent:")
    assert ("during an evaluation" if where == "evaluator" else "during a model call") in result.detail
    assert result.error is None


def test_model_unavailable_is_an_error_not_a_limit(tmp_path, rmsnorm_prompt):
    class Down(ScriptedModel):
        def query(self, messages, tools, deadline=None):
            raise ModelUnavailable("openai: HTTP 500 from http://x after 4 retries: boom")
    result = Session("rmsnorm", Down([]), StubEvaluator(), rmsnorm_prompt, Agent(), tmp_path).run()
    assert result.status == "model_error" and result.error.startswith("openai: HTTP 500") and result.best is None


def test_a_second_submission_in_the_turn_that_spent_the_budget_is_not_evaluated(tmp_path, rmsnorm_prompt):
    clock = Clock()

    class Slow(StubEvaluator):
        def evaluate(self, candidate, deadline=None):
            clock.now += 150.0
            return super().evaluate(candidate)
    other = GOOD.replace("num_warps=8", "num_warps=2")
    model = ScriptedModel([turn("", ("submit_candidate", {"source": GOOD}), ("submit_candidate", {"source": other}))])
    ev = Slow()
    result = Session("rmsnorm", model, ev, rmsnorm_prompt, Agent(max_wall_s=100), tmp_path, clock=clock).run()
    t = json.loads((tmp_path / "transcript.json").read_text())
    assert ev.calls == [GOOD] and t["messages"][-1]["content"].startswith("error: the wall-clock budget is spent")
    assert result.status == "limit" and result.submitted == 1
