"""Reasoning settings reach the wire only when set (agent.thinking_budget_tokens, agent.reasoning_effort), with
output room for the reply on top of the reasoning; Anthropic's signed thinking blocks go back with the tool results.
Policy -> command.make_model -> the real SDK -> the local fake server, whose recorded request bodies are checked."""
from agent_helpers import GOOD, StubEvaluator
from fake_llm_api import Call, FakeAPI, anthropic_turn, openai_turn

from autokernel.agent.command import make_model
from autokernel.agent.loop import Session
from autokernel.policy import Agent


def run(api, prompt, tmp_path, **settings):
    policy = Agent(base_url=api.base_url, **settings)
    result = Session("rmsnorm", make_model(policy), StubEvaluator(), prompt, policy, tmp_path).run()
    return result, [r.body for r in api.requests if r.path.endswith(("/messages", "/completions"))]


def test_anthropic_thinking_is_sent_with_room_and_returned_signed(tmp_path, rmsnorm_prompt, keys):
    script = [anthropic_turn("A wider block.", [Call("submit_candidate", {"source": GOOD})], thinking="Rows are "
                             "576 wide, so one block holds a row.", signature="sig-123"),
              anthropic_turn("", [Call("finish", {"summary": "done"})])]
    with FakeAPI(script) as api:
        result, (first, second) = run(api, rmsnorm_prompt, tmp_path, provider="anthropic", model="claude-test",
                                      thinking_budget_tokens=4096, max_output_tokens=8192)
    assert result.status == "finished" and result.best is not None
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert first["max_tokens"] == 8192 + 4096  # the reply keeps its full room after thinking
    assistant = next(m for m in second["messages"] if m["role"] == "assistant")
    assert assistant["content"][0] == {"type": "thinking", "thinking": "Rows are 576 wide, so one block holds a row.",
                                       "signature": "sig-123"}
    assert assistant["content"][1] == {"type": "text", "text": "A wider block."}


def test_anthropic_without_thinking_sends_none(tmp_path, rmsnorm_prompt, keys):
    with FakeAPI([anthropic_turn("", [Call("finish", {"summary": "done"})])]) as api:
        _, (first,) = run(api, rmsnorm_prompt, tmp_path, provider="anthropic", model="claude-test")
    assert "thinking" not in first and first["max_tokens"] == Agent().max_output_tokens


def test_openai_reasoning_effort_is_sent_with_room(tmp_path, rmsnorm_prompt, keys):
    with FakeAPI([openai_turn("", [Call("finish", {"summary": "done"})])]) as api:
        _, (first,) = run(api, rmsnorm_prompt, tmp_path, provider="openai", model="gpt-test",
                          reasoning_effort="high", reasoning_room_tokens=20000, max_output_tokens=8000)
    assert first["reasoning_effort"] == "high"
    assert first["max_tokens"] == 28000  # a base_url server: max_tokens; reasoning counts against it


def test_openai_without_reasoning_effort_sends_none(tmp_path, rmsnorm_prompt, keys):
    with FakeAPI([openai_turn("", [Call("finish", {"summary": "done"})])]) as api:
        _, (first,) = run(api, rmsnorm_prompt, tmp_path, provider="openai", model="gpt-test")
    assert "reasoning_effort" not in first and first["max_tokens"] == Agent().max_output_tokens
