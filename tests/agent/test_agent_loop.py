"""The loop with a scripted model: tools, budgets, early stop, the transcript after every step."""
import json

import pytest
from agent_helpers import CHEAT, GOOD, ScriptedModel, StubEvaluator, turn

from autokernel.agent.loop import Session
from autokernel.agent.providers import ModelError
from autokernel.errors import UserError
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
        def evaluate(self, op, source):
            fb = super().evaluate(op, source)
            fb.speedup = {1: 1.1, 2: 1.4, 4: 1.2}[int(source.split("num_warps=")[1][0])]
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
        def query(self, messages, tools):
            if len(messages) > 2:
                raise ModelError("openai: HTTP 500 from x after 4 retries: boom")
            return super().query(messages, tools)
    model = Broken([turn("a", ("submit_candidate", {"source": GOOD}))])
    result = Session("rmsnorm", model, StubEvaluator(), rmsnorm_prompt, Agent(), tmp_path).run()
    t = json.loads((tmp_path / "transcript.json").read_text())
    assert result.status == "model_error" and "HTTP 500" in result.detail and result.best is not None
    assert t["status"] == "model_error" and len(t["messages"]) == 4


def test_user_error_propagates_after_saving(tmp_path, rmsnorm_prompt):
    class NoKey(ScriptedModel):
        def query(self, messages, tools):
            raise UserError("anthropic: api.anthropic.com refused the API key (HTTP 401)")
    with pytest.raises(UserError):
        Session("rmsnorm", NoKey([]), StubEvaluator(), rmsnorm_prompt, Agent(), tmp_path).run()
    assert json.loads((tmp_path / "transcript.json").read_text())["status"] == "error"
