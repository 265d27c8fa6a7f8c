"""The Anthropic provider through the real `anthropic` SDK against a local server speaking the Messages API (SSE)."""
import json
import time

import pytest
from agent_helpers import CHEAT, GOOD, StubEvaluator
from fake_llm_api import Call, FakeAPI, anthropic_turn, dropped, raw, stalled, status

from autokernel.agent.loop import Session
from autokernel.agent.providers import AnthropicModel, preflight, to_anthropic
from autokernel.errors import UserError
from autokernel.policy import Agent

PRICES = {"claude-test": (3.0, 15.0)}  # USD per million input / output tokens


def session(api, prompt, tmp_path, policy=None, **kw):
    model = AnthropicModel("claude-test", base_url=api.base_url, prices=PRICES, **kw)
    ev = StubEvaluator()
    result = Session("rmsnorm", model, ev, prompt, policy or Agent(), tmp_path).run()
    return result, ev, json.loads((tmp_path / "transcript.json").read_text())


def test_cheat_rejected_then_faster_kernel_accepted(tmp_path, rmsnorm_prompt, keys):
    script = [
        anthropic_turn("Reading the kernel.", [Call("read_kernel", {})], 3000, 40),
        anthropic_turn("The library has rms_norm.", [Call("submit_candidate", {"source": CHEAT})], 4000, 300),
        anthropic_turn("Rejected; a real kernel with more warps.", [Call("submit_candidate", {"source": GOOD})],
                       4500, 1200),
        anthropic_turn("", [Call("finish", {"summary": "num_warps=8 wins"})], 6000, 30),
    ]
    with FakeAPI(script) as api:
        result, ev, t = session(api, rmsnorm_prompt, tmp_path)
    assert result.status == "finished" and result.detail == "num_warps=8 wins"
    assert result.best.source == GOOD and result.best.feedback.accepted

    # what the SDK sent: streamed Messages calls with the system prompt and the four tools
    reqs = api.requests
    assert [r.path for r in reqs] == ["/v1/messages"] * 4
    first = reqs[0].body
    cache = {"type": "ephemeral"}  # tools + system, and the conversation so far, are marked for prompt caching
    assert first["stream"] is True and first["model"] == "claude-test"
    assert first["system"] == [{"type": "text", "text": rmsnorm_prompt.system, "cache_control": cache}]
    assert [t["name"] for t in first["tools"]] == [
        "read_kernel", "read_spec", "check_candidate", "submit_candidate", "finish"]
    assert first["tools"][2]["input_schema"]["required"] == ["source"]
    assert first["messages"] == [{"role": "user", "content": [{"type": "text", "text": rmsnorm_prompt.task,
                                                               "cache_control": cache}]}]
    # the rejection reached the model as the tool_result of its tool_use, in the next user turn
    third = reqs[2].body["messages"]
    assert third[-2]["role"] == "assistant" and third[-2]["content"][1] == {
        "type": "tool_use", "id": "toolu_0", "name": "submit_candidate", "input": {"source": CHEAT}}
    result_block = third[-1]["content"][0]
    assert result_block["type"] == "tool_result" and result_block["tool_use_id"] == "toolu_0"
    assert json.loads(result_block["content"])["reasons"][0]["code"] == "static.forbidden_import"

    # the transcript: neutral messages, per-turn usage from the API, cost from the price table
    assistant = [m for m in t["messages"] if m["role"] == "assistant"]
    assert [m["usage"]["input_tokens"] for m in assistant] == [3000, 4000, 4500, 6000]
    assert [m["usage"]["output_tokens"] for m in assistant] == [40, 300, 1200, 30]
    assert assistant[1]["tool_calls"] == [{"id": "toolu_0", "name": "submit_candidate", "arguments": {"source": CHEAT}}]
    assert t["usage"]["input_tokens"] == 17500 and t["usage"]["output_tokens"] == 1570
    assert t["usage"]["usd"] == pytest.approx((17500 * 3.0 + 1570 * 15.0) / 1e6)  # $0.07605
    assert t["usage"]["price_per_mtok"][:2] == [3.0, 15.0]
    assert t["model"] == "anthropic:claude-test"


def test_prompt_cache_tokens_are_counted_and_priced(tmp_path, rmsnorm_prompt, keys):
    script = [anthropic_turn("", [Call("read_kernel", {})], input_tokens=200, output_tokens=100, cache_write=5000),
              anthropic_turn("", [Call("finish", {})], input_tokens=900, output_tokens=100, cache_read=5200)]
    with FakeAPI(script) as api:
        result, ev, t = session(api, rmsnorm_prompt, tmp_path)
    first, second = (m["usage"] for m in t["messages"] if m["role"] == "assistant")
    assert first["input_tokens"] == 5200 and first["cache_write_tokens"] == 5000
    assert second["input_tokens"] == 6100 and second["cache_read_tokens"] == 5200
    # $3 / $15 per million; cache writes at 1.25x the input price, reads at 0.1x
    assert first["usd"] == pytest.approx((200 * 3 + 5000 * 3 * 1.25 + 100 * 15) / 1e6)
    assert second["usd"] == pytest.approx((900 * 3 + 5200 * 3 * 0.1 + 100 * 15) / 1e6)
    assert t["usage"]["input_tokens"] == 11300 and t["usage"]["usd"] == pytest.approx(first["usd"] + second["usd"])


def test_429_then_success(tmp_path, rmsnorm_prompt, keys):
    script = [status(429, "rate limited", retry_after_ms=1500),
              anthropic_turn("", [Call("submit_candidate", {"source": GOOD})]),
              status(529, "overloaded", retry_after_ms=1500),
              anthropic_turn("", [Call("finish", {"summary": "ok"})])]
    with FakeAPI(script) as api:
        result, ev, t = session(api, rmsnorm_prompt, tmp_path)
    assert result.status == "finished" and result.best is not None
    assert len(api.requests) == 4
    # each retry waited the server's retry-after (1.5 s), not the 0.5 s default back-off: a lower bound, which load
    # on the machine cannot break (an upper bound on a gap is a timed test)
    r = api.requests
    assert r[1].at - r[0].at >= 1.45 and r[3].at - r[2].at >= 1.45


def test_malformed_response_is_asked_again_then_ends_the_session(tmp_path, rmsnorm_prompt, keys):
    garbage = raw(b"data: {this is not json\n\n", "text/event-stream")
    script = [garbage, anthropic_turn("", [Call("submit_candidate", {"source": GOOD})]),  # once: asked again
              garbage, garbage]  # twice in a row: the session ends, the accepted candidate kept
    with FakeAPI(script) as api:
        result, ev, t = session(api, rmsnorm_prompt, tmp_path)
    assert result.status == "model_error" and "malformed response from http://127.0.0.1" in result.detail
    assert result.best is not None and result.best.source == GOOD
    assert len(api.requests) == 4 and t["status"] == "model_error"


def test_server_error_after_retries_is_a_model_error(tmp_path, rmsnorm_prompt, keys):
    with FakeAPI([status(500, "boom")] * 3) as api:
        result, ev, t = session(api, rmsnorm_prompt, tmp_path, max_retries=2)
    assert result.status == "model_error" and "HTTP 500" in result.detail and "after 2 retries" in result.detail
    assert len(api.requests) == 3 and result.error == result.detail and t["error"] == result.error


def test_token_budget_stops_mid_session(tmp_path, rmsnorm_prompt, keys):
    turns = [anthropic_turn("", [Call("submit_candidate", {"source": GOOD.replace("num_warps=8", f"num_warps={w}")})],
                            6000, 1000) for w in (1, 2, 4, 16)]
    with FakeAPI(turns) as api:
        result, ev, t = session(api, rmsnorm_prompt, tmp_path,
                                policy=Agent(max_tokens=12_000, target_fraction_of_peak=1.0))
    assert result.status == "limit" and result.detail == "tokens budget spent: 14000 of 12000"
    assert len(api.requests) == 2 and len(ev.calls) == 2
    assert t["usage"]["usd"] == pytest.approx((12000 * 3.0 + 2000 * 15.0) / 1e6)


def test_usd_budget_stops_mid_session(tmp_path, rmsnorm_prompt, keys):
    turns = [anthropic_turn("", [Call("read_kernel", {})], 100_000, 2_000) for _ in range(4)]  # $0.33 a turn
    with FakeAPI(turns) as api:
        result, ev, t = session(api, rmsnorm_prompt, tmp_path, policy=Agent(max_usd=0.5, max_tokens=10**7))
    assert result.status == "limit" and result.detail.startswith("usd budget spent: 0.66 of 0.5")
    assert len(api.requests) == 2


def test_no_key_is_a_user_error(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(UserError, match="ANTHROPIC_API_KEY"):
        AnthropicModel("claude-test")


def test_refused_key_is_a_user_error(rmsnorm_prompt, keys):
    unauthorized = raw(json.dumps({"type": "error", "error": {"type": "authentication_error",
                                                              "message": "invalid x-api-key"}}).encode(), code=401)
    with FakeAPI([unauthorized]) as api:
        with pytest.raises(UserError, match="refused the API key .HTTP 401.: check ANTHROPIC_API_KEY"):
            AnthropicModel("claude-test", base_url=api.base_url).query([{"role": "user", "content": "hi"}], [])


def test_unreachable_server_is_a_user_error(keys):
    model = AnthropicModel("claude-test", base_url="http://127.0.0.1:9", max_retries=0)
    with pytest.raises(UserError, match="cannot reach http://127.0.0.1:9"):
        model.query([{"role": "user", "content": "hi"}], [])


def test_neutral_messages_convert_to_anthropic():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "a", "name": "read_kernel", "arguments": {}},
                {"id": "b", "name": "submit_candidate", "arguments": '{"source": "trunc'}]},
            {"role": "tool", "tool_call_id": "a", "name": "read_kernel", "content": "K"},
            {"role": "tool", "tool_call_id": "b", "name": "submit_candidate", "content": "error"},
            {"role": "user", "content": "Reply with a tool call"}]
    system, out = to_anthropic(msgs)
    assert system == "S"
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert out[1]["content"][1]["input"] == {"_raw": '{"source": "trunc'}  # malformed JSON replayed as-is
    assert [b["type"] for b in out[2]["content"]] == ["tool_result", "tool_result", "text"]


# --- real servers break: dropped streams, stalls, cut-off replies, malformed tool input, bad settings -------------


def test_a_stream_dropped_mid_reply_is_retried(tmp_path, rmsnorm_prompt, keys):
    submit = anthropic_turn("Trying more warps.", [Call("submit_candidate", {"source": GOOD})])
    script = [dropped(submit, after_events=5), submit, anthropic_turn("", [Call("finish", {})])]
    with FakeAPI(script) as api:
        result, ev, t = session(api, rmsnorm_prompt, tmp_path)
    assert result.status == "finished" and result.best.source == GOOD and ev.calls == [GOOD]
    assert len(api.requests) == 3 and result.error is None


@pytest.mark.parametrize("ping_s", [None, 0.2], ids=["silent", "keep-alive"])
def test_a_stalled_stream_is_abandoned_at_the_wall_clock_deadline(tmp_path, rmsnorm_prompt, keys, ping_s):
    script = [stalled(anthropic_turn("", [Call("submit_candidate", {"source": GOOD})]), stall_s=30, ping_s=ping_s,
                      after_events=3)]
    t0 = time.monotonic()
    with FakeAPI(script) as api:
        result, ev, t = session(api, rmsnorm_prompt, tmp_path, policy=Agent(max_wall_s=2.0))
    assert time.monotonic() - t0 < 20.0 and len(api.requests) == 1  # the stall is 30 s; slack for a loaded machine
    assert result.status == "limit" and "during a model call" in result.detail and result.error is None


def test_tool_input_that_is_not_json_keeps_its_text_and_gets_the_openai_error(tmp_path, rmsnorm_prompt, keys):
    """The SDK's partial-JSON parser made '{"source": "import triton\\n' into {} ("needs source"); the raw text is
    kept, answered as OpenAI's is, replayed as sent, and the model's next try is evaluated."""
    bad = '{"source": "import triton\\n'
    script = [anthropic_turn("", [Call("submit_candidate", bad)]),
              anthropic_turn("", [Call("submit_candidate", {"source": GOOD})]),
              anthropic_turn("", [Call("finish", {})])]
    with FakeAPI(script) as api:
        result, ev, t = session(api, rmsnorm_prompt, tmp_path)
    assistant = [m for m in t["messages"] if m["role"] == "assistant"]
    assert assistant[0]["tool_calls"][0]["arguments"] == bad
    answer = api.requests[1].body["messages"][-1]["content"][0]
    assert answer["type"] == "tool_result"
    assert answer["content"].startswith("error: the arguments of submit_candidate are not a JSON object")
    assert api.requests[1].body["messages"][-2]["content"][0]["input"] == {"_raw": bad}
    assert result.status == "finished" and result.submitted == 1 and ev.calls == [GOOD]


def test_a_reply_cut_at_the_output_limit_with_a_tool_call_gets_the_cut_off_reply(tmp_path, rmsnorm_prompt, keys):
    script = [anthropic_turn("", [Call("submit_candidate", '{"source": "import triton\\nimport tor')],
                             stop_reason="max_tokens"),
              anthropic_turn("", [Call("finish", {})])]
    with FakeAPI(script) as api:
        result, ev, t = session(api, rmsnorm_prompt, tmp_path)
    answer = api.requests[1].body["messages"][-1]["content"][0]
    assert answer["content"].startswith("Your reply was cut off at the output-token limit")
    assert result.submitted == 0 and ev.calls == []


def test_preflight_checks_key_and_base_url(monkeypatch, keys):
    with FakeAPI([]) as api:
        preflight("anthropic", "claude-test", base_url=api.base_url)
        assert api.requests[0].path.startswith("/v1/models")
        h = api.requests[0].headers
        assert "sk-ant-test" in (h.get("x-api-key") or h.get("authorization") or "")  # the key was sent
    refused = raw(json.dumps({"type": "error", "error": {"type": "authentication_error",
                                                         "message": "invalid x-api-key"}}).encode(), code=401)
    with FakeAPI([], models_reply=refused) as api:
        with pytest.raises(UserError, match="refused the API key .HTTP 401.: check ANTHROPIC_API_KEY"):
            preflight("anthropic", "claude-test", base_url=api.base_url)
    with pytest.raises(UserError, match="cannot reach http://127.0.0.1:9"):
        preflight("anthropic", base_url="http://127.0.0.1:9")
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(UserError, match="set ANTHROPIC_API_KEY"):
        preflight("anthropic", base_url="http://127.0.0.1:9")  # the key is checked first, with no request
