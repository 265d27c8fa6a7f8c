"""GPT through Chat Completions (the official openai SDK), or any OpenAI-compatible server, in the neutral
format of autokernel.agent.providers."""
from __future__ import annotations

import json

from autokernel.agent.providers.common import (
    DEFAULT_MODELS,
    MAX_RETRIES,
    TIMEOUT_S,
    _call,
    _Client,
    _Dropped,
    _parse,
    _probe,
    _Turn,
    usage,
)
from autokernel.deadline import Deadline
from autokernel.errors import UserError


class OpenAIModel(_Client):
    """GPT through Chat Completions with tools, streamed (tool-call deltas); any OpenAI-compatible server by
    base_url (vLLM, SGLang, Ollama, llama.cpp server), where the model defaults to the server's first."""

    def __init__(self, model: str | None = None, *, base_url: str | None = None, max_output_tokens: int = 8192,
                 prices: dict | None = None, max_retries: int = MAX_RETRIES, timeout_s: float = TIMEOUT_S,
                 probe: bool = False, reasoning_effort: str | None = None, reasoning_room_tokens: int = 0):
        import openai
        self._setup("openai", openai, base_url, max_output_tokens, prices, max_retries, timeout_s)
        self.reasoning_effort = reasoning_effort  # None: not sent
        self.reasoning_room_tokens = reasoning_room_tokens if reasoning_effort else 0
        if model is None and base_url:
            ids = self._models()
            if not ids:
                raise UserError(f"openai: {self.where} lists no model: start it with one, or pass --model")
            model = ids[0]
        self._named(model or DEFAULT_MODELS["openai"])
        if probe and not self.reached:
            _probe(self)

    def query(self, messages: list[dict], tools: list[dict], deadline: Deadline = Deadline.none()) -> dict:
        return _call(self, lambda timeout_s, turn: self._attempt(messages, tools, timeout_s, turn), deadline)

    def _attempt(self, messages: list[dict], tools: list[dict], timeout_s: float, turn: _Turn) -> dict:
        limit: dict[str, int | str] = {"max_tokens" if self.base_url else "max_completion_tokens":
                 self.max_output_tokens + self.reasoning_room_tokens}  # reasoning tokens count against it
        if self.reasoning_effort:
            limit["reasoning_effort"] = self.reasoning_effort
        specs = [{"type": "function", "function": t} for t in tools]
        text: list[str] = []
        calls: dict[int, dict] = {}
        use, finish, chunks = None, None, 0
        stream = self.client.chat.completions.create(
            model=self.model, messages=to_openai(messages), tools=specs, stream=True,
            stream_options={"include_usage": True}, timeout=timeout_s, **limit)
        self.reached = True
        with turn.watch(stream.response):
            for chunk in stream:
                chunks += 1
                use = chunk.usage or use
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
                    text.append(choice.delta.content or "")
                    for d in choice.delta.tool_calls or []:
                        c = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                        c["id"] = d.id or c["id"]
                        if d.function:
                            c["name"] += d.function.name or ""
                            c["arguments"] += d.function.arguments or ""
        if not chunks:
            raise ValueError("an empty stream")
        if finish is None:
            raise _Dropped("the stream ended before a finish_reason")
        tool_calls = [{"id": c["id"] or f"call_{i}", "name": c["name"], "arguments": _parse(c["arguments"])}
                      for i, c in sorted(calls.items())]
        if use is not None:
            u = usage(use.prompt_tokens, use.completion_tokens, self.prices)
        else:  # some local servers stream no usage: ~4 characters a token, marked as an estimate
            sent = len(json.dumps(messages)) + len(json.dumps(tools))
            got = len("".join(text)) + sum(len(c["arguments"]) for c in calls.values())
            u = usage(sent // 4, got // 4, self.prices, estimated=True)
        return {"role": "assistant", "content": "".join(text), "tool_calls": tool_calls, "usage": u,
                "truncated": finish == "length"}


def to_openai(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        if m["role"] == "assistant":
            msg = {"role": "assistant", "content": m.get("content") or None}
            if m.get("tool_calls"):
                msg["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                    "name": c["name"], "arguments": c["arguments"] if isinstance(c["arguments"], str)
                    else json.dumps(c["arguments"])}} for c in m["tool_calls"]]
            out.append(msg)
        elif m["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": m["content"]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out
