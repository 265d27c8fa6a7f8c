"""Claude through the Messages API (the official anthropic SDK), in the neutral format of autokernel.agent.providers."""
from __future__ import annotations

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


class AnthropicModel(_Client):
    """Claude through the Messages API, streamed as raw events, with tool use."""

    def __init__(self, model: str | None = None, *, base_url: str | None = None, max_output_tokens: int = 8192,
                 prices: dict | None = None, max_retries: int = MAX_RETRIES, timeout_s: float = TIMEOUT_S,
                 probe: bool = False, thinking_budget_tokens: int | None = None):
        import anthropic
        self._setup("anthropic", anthropic, base_url, max_output_tokens, prices, max_retries, timeout_s)
        self.thinking_budget_tokens = thinking_budget_tokens  # None: extended thinking off (nothing sent)
        self._named(model or DEFAULT_MODELS["anthropic"])
        if probe:
            _probe(self)

    def query(self, messages: list[dict], tools: list[dict], deadline: Deadline = Deadline.none()) -> dict:
        system, msgs = to_anthropic(messages)
        specs = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                 for t in tools]
        # Prompt caching: tools + system, and the conversation up to this turn, are re-read by every later turn.
        cached = {"type": "ephemeral"}
        system_blocks = [{"type": "text", "text": system, "cache_control": cached}]
        if msgs:
            msgs[-1]["content"][-1] = {**msgs[-1]["content"][-1], "cache_control": cached}
        return _call(self, lambda timeout_s, turn: self._attempt(system_blocks, msgs, specs, timeout_s, turn),
                     deadline)

    def _attempt(self, system: list, msgs: list, specs: list, timeout_s: float, turn: _Turn) -> dict:
        extra = {}
        if self.thinking_budget_tokens:  # thinking gets its own room: max_tokens covers thinking + the reply
            extra = {"thinking": {"type": "enabled", "budget_tokens": self.thinking_budget_tokens}}
        stream = self.client.messages.create(
            model=self.model, max_tokens=self.max_output_tokens + (self.thinking_budget_tokens or 0), system=system,
            messages=msgs, tools=specs, stream=True, timeout=timeout_s, **extra)
        self.reached = True
        blocks: dict[int, dict] = {}
        start, out_tokens, stop, done = None, 0, None, False
        with turn.watch(stream.response):
            for ev in stream:
                if ev.type == "message_start":
                    start = ev.message.usage
                elif ev.type == "content_block_start":
                    b = ev.content_block
                    blocks[ev.index] = {"type": b.type, "id": getattr(b, "id", ""), "name": getattr(b, "name", ""),
                                        "text": getattr(b, "text", "") or "", "json": "",
                                        "input": getattr(b, "input", None),
                                        "thinking": getattr(b, "thinking", "") or "",
                                        "signature": getattr(b, "signature", "") or "",
                                        "data": getattr(b, "data", "") or ""}
                elif ev.type == "content_block_delta" and ev.delta.type == "thinking_delta":
                    blocks[ev.index]["thinking"] += ev.delta.thinking
                elif ev.type == "content_block_delta" and ev.delta.type == "signature_delta":
                    blocks[ev.index]["signature"] += ev.delta.signature
                elif ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                    blocks[ev.index]["text"] += ev.delta.text
                elif ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                    blocks[ev.index]["json"] += ev.delta.partial_json  # the raw text: parsed once, below
                elif ev.type == "message_delta":
                    stop, out_tokens = ev.delta.stop_reason, ev.usage.output_tokens
                elif ev.type == "message_stop":
                    done = True
        if start is None:
            raise ValueError("no message_start in the stream")
        if not done:
            raise _Dropped("the stream ended before message_stop")
        read, write = start.cache_read_input_tokens or 0, start.cache_creation_input_tokens or 0
        ordered = [blocks[i] for i in sorted(blocks)]
        return {"role": "assistant", "content": "".join(b["text"] for b in ordered if b["type"] == "text"),
                "tool_calls": [{"id": b["id"], "name": b["name"],
                                "arguments": _parse(b["json"]) if b["json"] or not b["input"] else b["input"]}
                               for b in ordered if b["type"] == "tool_use"],
                "usage": usage(start.input_tokens + read + write, out_tokens, self.prices, cache_read=read,
                               cache_write=write),
                "truncated": stop == "max_tokens", **_thinking(ordered)}


def _thinking(blocks: list[dict]) -> dict:
    """The turn's thinking blocks as the API must get them back with its tool results (signed; redacted ones as
    their opaque data), under "thinking" in the neutral message; {} when there were none."""
    kept = [{"type": "thinking", "thinking": b["thinking"], "signature": b["signature"]} if b["type"] == "thinking"
            else {"type": "redacted_thinking", "data": b["data"]}
            for b in blocks if b["type"] in ("thinking", "redacted_thinking")]
    return {"thinking": kept} if kept else {}


def to_anthropic(messages: list[dict]) -> tuple[str, list[dict]]:
    """(system, messages): tool results ride in the next user turn, consecutive user turns merge."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    out: list[dict] = []
    for m in messages:
        if m["role"] == "assistant":
            blocks = [dict(b) for b in m.get("thinking") or []]  # first, as the API requires with thinking on
            blocks += [{"type": "text", "text": m["content"]}] if m.get("content") else []
            blocks += [{"type": "tool_use", "id": c["id"], "name": c["name"],
                        "input": c["arguments"] if isinstance(c["arguments"], dict) else {"_raw": c["arguments"]}}
                       for c in m.get("tool_calls") or []]
            out.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "(no reply)"}]})
        elif m["role"] in ("user", "tool"):
            block = ({"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
                     if m["role"] == "tool" else {"type": "text", "text": m["content"]})
            if out and out[-1]["role"] == "user":
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
    return system, out
