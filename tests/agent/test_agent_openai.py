"""The OpenAI provider through the real `openai` SDK against a local server speaking Chat Completions (SSE chunks
with tool-call deltas), as api.openai.com and the OpenAI-compatible servers (vLLM, SGLang, Ollama, llama.cpp) do."""
import json
import time

import pytest
from agent_helpers import CHEAT, GOOD, StubEvaluator
from fake_llm_api import Call, FakeAPI, dropped, openai_turn, raw, stalled, status

from autokernel.agent.loop import Session
from autokernel.agent.providers import OpenAIModel, preflight, to_openai
from autokernel.errors import UserError
from autokernel.policy import Agent


def session(api, prompt, tmp_path, policy=None, model="gpt-test", **kw):
    m = OpenAIModel(model, base_url=api.base_url + "/v1", **kw)
    ev = StubEvaluator()
    result = Session("rmsnorm", m, ev, prompt, policy or Agent(), tmp_path).run()
    return result, ev, json.loads((tmp_path / "transcript.json").read_text()), m


def test_cheat_rejected_then_faster_kernel_accepted(tmp_path, rmsnorm_prompt, keys):
    script = [
        openai_turn("Trying the library.", [Call("submit_candidate", {"source": CHEAT})], 4000, 300),
        openai_turn("Now a real kernel.", [Call("submit_candidate", {"source": GOOD})], 4600, 1100),
        openai_turn("", [Call("finish", {"summary": "done"})], 6000, 20),
    ]
    with FakeAPI(script) as api:
        result, ev, t, m = session(api, rmsnorm_prompt, tmp_path, prices={"gpt-test": (1.25, 10.0)})
    assert result.status == "finished" and result.best.source == GOOD

    reqs = api.requests
    assert [r.path for r in reqs] == ["/v1/chat/completions"] * 3
    first = reqs[0].body
    assert first["stream"] is True and first["stream_options"] == {"include_usage": True}
    assert first["max_tokens"] == Agent().max_output_tokens  # base_url: the field every compatible server reads
    assert first["messages"][:2] == [{"role": "system", "content": rmsnorm_prompt.system},
                                     {"role": "user", "content": rmsnorm_prompt.task}]
    assert [t["function"]["name"] for t in first["tools"]] == [
        "read_kernel", "read_spec", "check_candidate", "submit_candidate", "finish"]
    second = reqs[1].body["messages"]
    assert second[2]["tool_calls"] == [{"id": "call_0", "type": "function", "function": {
        "name": "submit_candidate", "arguments": json.dumps({"source": CHEAT})}}]
    assert second[3]["role"] == "tool" and second[3]["tool_call_id"] == "call_0"
    assert json.loads(second[3]["content"])["reasons"][0]["code"] == "static.forbidden_import"

    # arguments streamed in pieces were reassembled; usage and cost come from the final usage chunk
    assistant = [m for m in t["messages"] if m["role"] == "assistant"]
    assert assistant[1]["tool_calls"][0]["arguments"] == {"source": GOOD}
    assert t["usage"]["input_tokens"] == 14600 and t["usage"]["output_tokens"] == 1420
    assert t["usage"]["usd"] == pytest.approx((14600 * 1.25 + 1420 * 10.0) / 1e6)
    assert not any(m["usage"]["estimated"] for m in assistant)


def test_local_server_dummy_key_and_served_model(tmp_path, rmsnorm_prompt, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeAPI([openai_turn("", [Call("finish", {})], usage=False)], models=("qwen2.5-coder-7b",)) as api:
        result, ev, t, m = session(api, rmsnorm_prompt, tmp_path, model=None)
    assert m.model == "qwen2.5-coder-7b" and t["model"] == "openai:qwen2.5-coder-7b"
    assert api.requests[0].path == "/v1/models"
    assert api.requests[1].headers["authorization"] == "Bearer not-needed"
    assert api.requests[1].body["model"] == "qwen2.5-coder-7b"
    # no usage chunk from this server: tokens estimated (~4 characters each) and marked so; local price is 0
    u = t["messages"][2]["usage"]
    assert u["estimated"] and u["input_tokens"] > 1000 and u["usd"] == 0.0


def test_malformed_tool_arguments_get_an_error_and_a_second_try(tmp_path, rmsnorm_prompt, keys):
    script = [openai_turn("", [Call("submit_candidate", '{"source": "import triton\\n')]),
              openai_turn("", [Call("submit_candidate", {"source": GOOD})]),
              openai_turn("", [Call("finish", {})])]
    with FakeAPI(script) as api:
        result, ev, t, m = session(api, rmsnorm_prompt, tmp_path)
    replay = api.requests[1].body["messages"]
    assert replay[2]["tool_calls"][0]["function"]["arguments"] == '{"source": "import triton\\n'  # sent back as-is
    assert replay[3]["content"].startswith("error: the arguments of submit_candidate are not a JSON object")
    assert result.status == "finished" and result.submitted == 1 and result.best.source == GOOD


def test_malformed_response_is_asked_again_then_ends_the_session(tmp_path, rmsnorm_prompt, keys):
    garbage = raw(b"data: {\"id\": \"x\", \"choices\": [{\"delta\": \n\n", "text/event-stream")
    with FakeAPI([garbage, openai_turn("", [Call("read_kernel", {})]), garbage, garbage]) as api:
        result, ev, t, m = session(api, rmsnorm_prompt, tmp_path)
    assert result.status == "model_error" and "openai: malformed response" in result.detail
    assert len(api.requests) == 4 and t["messages"][-1]["name"] == "read_kernel"


def test_429_and_503_then_success(tmp_path, rmsnorm_prompt, keys):
    script = [status(429, retry_after_ms=1500), status(503, retry_after_ms=1500),
              openai_turn("", [Call("finish", {"summary": "ok"})])]
    with FakeAPI(script) as api:
        result, ev, t, m = session(api, rmsnorm_prompt, tmp_path)
    assert result.status == "finished" and len(api.requests) == 3  # retried here (see providers._call)
    # each retry waited the server's retry-after (1.5 s), not the 0.5 s default back-off: a lower bound, which load
    # on the machine cannot break
    r = api.requests
    assert r[1].at - r[0].at >= 1.45 and r[2].at - r[1].at >= 1.45


def test_usd_budget_stops_mid_session(tmp_path, rmsnorm_prompt, keys):
    sources = [GOOD.replace("num_warps=8", f"num_warps={w}") for w in (1, 2, 4, 16)]
    script = [openai_turn("", [Call("submit_candidate", {"source": s})], 50_000, 5_000) for s in sources]
    policy = Agent(max_usd=0.25, max_tokens=10**7, target_fraction_of_peak=1.0)
    with FakeAPI(script) as api:
        result, ev, t, m = session(api, rmsnorm_prompt, tmp_path, policy, prices={"gpt-test": (2.0, 10.0)})
    # $0.15 a turn: the second turn passes the budget, the third is never asked for
    assert result.status == "limit" and result.detail == "usd budget spent: 0.3 of 0.25"
    assert len(api.requests) == 2 and t["usage"]["usd"] == pytest.approx(0.3)
    assert result.submitted == 2 and result.best is not None


def test_official_api_needs_a_key_and_uses_max_completion_tokens(tmp_path, rmsnorm_prompt, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(UserError, match="OPENAI_API_KEY"):
        OpenAIModel("gpt-5")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    m = OpenAIModel("gpt-5")
    assert m.base_url is None and m.prices[:2] == (1.25, 10.0)


def test_unknown_model_is_priced_high_unless_local(keys):
    assert OpenAIModel("some-new-model").prices[:2] == (15.0, 75.0)
    assert OpenAIModel("some-new-model", base_url="http://127.0.0.1:9/v1").prices[:2] == (0.0, 0.0)
    assert OpenAIModel("gpt-4o-mini-2024-07-18").prices[:2] == (0.15, 0.6)  # longest prefix wins over gpt-4o


def test_unreachable_server_is_a_user_error(keys):
    with pytest.raises(UserError, match="cannot reach http://127.0.0.1:9/v1"):
        OpenAIModel(None, base_url="http://127.0.0.1:9/v1", max_retries=0)  # asks the server for its models


def test_neutral_messages_convert_to_openai():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "name": "finish", "arguments": {}}]},
            {"role": "tool", "tool_call_id": "a", "name": "finish", "content": "ok"}]
    out = to_openai(msgs)
    assert out[2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "finish", "arguments": "{}"}}]}
    assert out[3] == {"role": "tool", "tool_call_id": "a", "content": "ok"}


# --- real servers break: dropped streams, stalls, cut-off replies, 5xx, bad settings ------------------------------


def test_a_stream_dropped_mid_reply_is_retried(tmp_path, rmsnorm_prompt, keys):
    submit = openai_turn("", [Call("submit_candidate", {"source": GOOD})])
    script = [dropped(submit, after_events=4), submit, openai_turn("", [Call("finish", {})])]
    with FakeAPI(script) as api:
        result, ev, t, m = session(api, rmsnorm_prompt, tmp_path)
    assert result.status == "finished" and result.best.source == GOOD and ev.calls == [GOOD]
    assert len(api.requests) == 3 and result.error is None


def test_a_server_that_keeps_dropping_streams_is_unavailable_not_unreachable(tmp_path, rmsnorm_prompt, keys):
    broken = dropped(openai_turn("", [Call("submit_candidate", {"source": GOOD})]), after_events=2)
    with FakeAPI([broken] * 3) as api:
        result, ev, t, m = session(api, rmsnorm_prompt, tmp_path, max_retries=2)
    assert result.status == "model_error" and len(api.requests) == 3
    assert "broke off 3 replies in a row" in result.error and "cannot reach" not in result.error


@pytest.mark.parametrize("ping_s", [None, 0.2], ids=["silent", "keep-alive"])
def test_a_stalled_stream_is_abandoned_at_the_wall_clock_deadline(tmp_path, rmsnorm_prompt, keys, ping_s):
    """A reply that stops (silently: the read timeout is the time left; or sending keep-alive comments, which no
    read timeout catches: the watchdog closes it) ends the session at agent.max_wall_s, not 30 s later."""
    script = [stalled(openai_turn("", [Call("submit_candidate", {"source": GOOD})]), stall_s=30, ping_s=ping_s)]
    t0 = time.monotonic()
    with FakeAPI(script) as api:
        result, ev, t, m = session(api, rmsnorm_prompt, tmp_path, Agent(max_wall_s=2.0))
    assert time.monotonic() - t0 < 20.0 and len(api.requests) == 1  # the stall is 30 s; slack for a loaded machine
    assert result.status == "limit" and result.detail.startswith("wall_s budget spent: "), result.detail
    spent_s = float(result.detail.removeprefix("wall_s budget spent: ").split()[0])  # on the real clock: a loaded
    assert 2.0 <= spent_s < 20.0 and " of 2 " in result.detail, result.detail  # machine may overrun 2 s, as above
    assert "during a model call" in result.detail and result.error is None and ev.calls == []


def test_a_reply_cut_at_the_output_limit_with_a_tool_call_gets_the_cut_off_reply(tmp_path, rmsnorm_prompt, keys):
    script = [openai_turn("", [Call("submit_candidate", '{"source": "import triton\\nimport tor')], finish="length"),
              openai_turn("", [Call("finish", {})])]
    with FakeAPI(script) as api:
        result, ev, t, m = session(api, rmsnorm_prompt, tmp_path)
    answer = api.requests[1].body["messages"][3]
    assert answer["role"] == "tool" and answer["content"].startswith("Your reply was cut off at the output-token")
    assert result.submitted == 0 and ev.calls == []


def test_persistent_server_errors_are_a_model_error_with_its_own_outcome(tmp_path, rmsnorm_prompt, keys):
    with FakeAPI([status(500, "boom")] * 3) as api:
        result, ev, t, m = session(api, rmsnorm_prompt, tmp_path, max_retries=2)
    assert result.status == "model_error" and len(api.requests) == 3
    assert result.error.startswith(f"openai: HTTP 500 from {api.base_url}/v1 after 2 retries: ")
    assert result.error.endswith("boom") and "\n" not in result.error  # one line for the run command to print
    assert t["error"] == result.error


def test_preflight_checks_key_and_base_url_without_a_session(monkeypatch, keys):
    preflight("search")
    with pytest.raises(UserError, match="unknown agent provider 'gemini'.*--agent"):
        preflight("gemini")
    with pytest.raises(UserError, match="--base-url 'localhost:8000' is not an http.s. URL"):
        preflight("openai", base_url="localhost:8000")
    t0 = time.monotonic()
    with pytest.raises(UserError, match="cannot reach http://127.0.0.1:9/v1.*--base-url"):
        preflight("openai", "m", base_url="http://127.0.0.1:9/v1")
    assert time.monotonic() - t0 < 5.0  # no retries, no back-off: a refused connection is an answer
    with FakeAPI([], models=()) as api:
        with pytest.raises(UserError, match="lists no model: start it with one, or pass --model"):
            preflight("openai", base_url=api.base_url + "/v1")
        preflight("openai", "some-model", base_url=api.base_url + "/v1")  # a model named: an empty list is fine
    refused = raw(json.dumps({"error": {"message": "bad key", "type": "invalid_request_error"}}).encode(), code=401)
    with FakeAPI([], models_reply=refused) as api:
        with pytest.raises(UserError, match="refused the API key .HTTP 401.: check OPENAI_API_KEY"):
            preflight("openai", "gpt-test", base_url=api.base_url + "/v1")
    with FakeAPI([], models_reply=status(404, "no such route", None)) as api:
        preflight("openai", "gpt-test", base_url=api.base_url + "/v1")  # not every server lists its models
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(UserError, match="set OPENAI_API_KEY"):
        preflight("openai", "gpt-5")
