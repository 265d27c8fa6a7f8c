"""Model providers: one Protocol, two official SDKs, one provider-neutral message format.

The session's message list is plain JSON that either provider can replay, and it is the transcript:

    {"role": "system" | "user", "content": str}
    {"role": "assistant", "content": str, "tool_calls": [{"id": str, "name": str, "arguments": dict | str}],
     "usage": {"input_tokens": int, "output_tokens": int, "usd": float, "estimated": bool,
               "cache_read_tokens": int, "cache_write_tokens": int (when a prompt cache was used)},
     "truncated": bool}
    {"role": "tool", "tool_call_id": str, "name": str, "content": str}

`arguments` is the parsed dict, or the raw text when the model sent malformed JSON (the loop answers that with an
error, the model tries again). Token counts are the API's own; cost is tokens x the price table (prices.yaml,
overridable with `agent.prices`). Retries with back-off on 429 / 5xx / timeouts are the SDKs' own (max_retries),
which honour the server's retry-after. A missing key, a refused key or an unreachable server is a UserError (exit 2).
"""
from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import yaml

from autokernel.errors import UserError

DEFAULT_MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-5"}
KEY_VARS = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
MAX_RETRIES = 4  # the SDKs back off 0.5 s, 1 s, 2 s, 4 s (or as retry-after says) on 408/409/429/5xx/timeouts
TIMEOUT_S = 600.0  # one streamed reply; the SDKs' own default
MALFORMED_RETRIES = 1  # a reply that does not parse is asked for once more, then the session ends (model_error)
LOCAL_KEY = "not-needed"  # OpenAI-compatible local servers (vLLM, SGLang, Ollama, llama.cpp) accept any key


class ModelError(Exception):
    """The API answered, but not with a usable turn: malformed, or still failing after the SDK's retries."""


class MalformedResponse(ModelError):
    """The reply did not parse as the API's wire format (asked again MALFORMED_RETRIES times before giving up)."""


class Model(Protocol):
    name: str  # "provider:model", recorded in the transcript

    def query(self, messages: list[dict], tools: list[dict]) -> dict:
        """The next assistant message (neutral format, with usage) for this conversation and these tools."""
        ...


@lru_cache(maxsize=1)
def _price_table() -> dict:
    return yaml.safe_load((Path(__file__).parent / "prices.yaml").read_text())


def price(provider: str, model: str, overrides: dict | None = None, local: bool = False) -> tuple[float, float, str]:
    """(USD per million input tokens, per million output tokens, where the row came from); longest prefix wins."""
    for source, table in (("policy agent.prices", overrides or {}), ("prices.yaml", _price_table()[provider])):
        best = max((k for k in table if model == k or model.startswith(k + "-")), key=len, default=None)
        if best is not None:
            inp, out = table[best]
            return float(inp), float(out), f"{source}: {best}"
    row = "local" if local else "unknown"
    inp, out = _price_table()[row]
    return float(inp), float(out), f"prices.yaml: {row} (no row for {model!r}; add one under agent.prices)"


def usage(input_tokens: int, output_tokens: int, prices: tuple[float, float, str], estimated: bool = False,
          cache_read: int = 0, cache_write: int = 0) -> dict:
    """input_tokens counts every prompt token; those read from or written to a prompt cache are billed at the
    table's cache multiples of the input price."""
    rate = _price_table()["cache"]
    plain = input_tokens - cache_read - cache_write
    usd = (prices[0] * (plain + rate["write"] * cache_write + rate["read"] * cache_read) + prices[1] * output_tokens)
    out = {"input_tokens": int(input_tokens), "output_tokens": int(output_tokens), "usd": round(usd / 1e6, 6),
           "estimated": estimated}
    if cache_read or cache_write:
        out.update(cache_read_tokens=int(cache_read), cache_write_tokens=int(cache_write))
    return out


def _key(provider: str, base_url: str | None) -> str:
    key = os.environ.get(KEY_VARS[provider])
    if key:
        return key
    if provider == "openai" and base_url:
        return LOCAL_KEY
    raise UserError(f"the {provider} agent needs an API key: set {KEY_VARS[provider]} in the environment "
                    f"(or run the offline search: --agent search)")


def _api_failure(sdk, e: Exception, who: str, where: str, model: str, retries: int) -> Exception:
    """An SDK exception as what the session does with it: UserError (fix and rerun) or ModelError (session ends)."""
    if isinstance(e, (sdk.AuthenticationError, sdk.PermissionDeniedError)):
        return UserError(f"{who}: {where} refused the API key (HTTP {e.status_code}): check {KEY_VARS[who]}")
    if isinstance(e, sdk.NotFoundError):
        return UserError(f"{who}: {where} has no model {model!r} (HTTP 404): set agent.model or --model")
    if isinstance(e, sdk.APIConnectionError):
        return UserError(f"{who}: cannot reach {where} ({type(e).__name__}: {e}) after {retries} retries: "
                         f"check the network, or --base-url")
    if isinstance(e, sdk.APIStatusError):
        return ModelError(f"{who}: HTTP {e.status_code} from {where} after {retries} retries: {e.message}")
    what = f"{type(e).__name__}: {e}" if str(e) else f"{type(e).__name__} (no complete message in the stream)"
    return MalformedResponse(f"{who}: malformed response from {where}: {what}")


def _asking_again(query):
    """Wrap a provider's query: a malformed reply is asked for again, up to MALFORMED_RETRIES times."""
    def wrapped(self, messages: list[dict], tools: list[dict]) -> dict:
        for _ in range(MALFORMED_RETRIES):
            try:
                return query(self, messages, tools)
            except MalformedResponse:
                pass
        return query(self, messages, tools)
    wrapped.__doc__ = query.__doc__
    return wrapped


class AnthropicModel:
    """Claude through the Messages API, streamed (client.messages.stream), with tool use."""

    def __init__(self, model: str | None = None, *, base_url: str | None = None, max_output_tokens: int = 8192,
                 prices: dict | None = None, max_retries: int = MAX_RETRIES, timeout_s: float = TIMEOUT_S):
        import anthropic
        self.sdk, self.model = anthropic, model or DEFAULT_MODELS["anthropic"]
        self.client = anthropic.Anthropic(api_key=_key("anthropic", base_url), base_url=base_url,
                                          max_retries=max_retries, timeout=timeout_s)
        self.where = base_url or "api.anthropic.com"
        self.name = f"anthropic:{self.model}"
        self.max_output_tokens = max_output_tokens
        self.prices = price("anthropic", self.model, prices)

    @_asking_again
    def query(self, messages: list[dict], tools: list[dict]) -> dict:
        system, msgs = to_anthropic(messages)
        specs = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                 for t in tools]
        # Prompt caching: tools + system, and the conversation up to this turn, are re-read by every later turn.
        cached = {"type": "ephemeral"}
        system_blocks = [{"type": "text", "text": system, "cache_control": cached}]
        if msgs:
            msgs[-1]["content"][-1] = {**msgs[-1]["content"][-1], "cache_control": cached}
        try:
            with self.client.messages.stream(model=self.model, max_tokens=self.max_output_tokens,
                                             system=system_blocks, messages=msgs, tools=specs) as stream:
                m = stream.get_final_message()
        except Exception as e:  # every failure becomes UserError or ModelError with the server named
            raise _api_failure(self.sdk, e, "anthropic", self.where, self.model, self.client.max_retries) from e
        u = m.usage
        read, write = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
        return {"role": "assistant",
                "content": "".join(b.text for b in m.content if b.type == "text"),
                "tool_calls": [{"id": b.id, "name": b.name, "arguments": b.input}
                               for b in m.content if b.type == "tool_use"],
                "usage": usage(u.input_tokens + read + write, u.output_tokens, self.prices, cache_read=read,
                               cache_write=write),
                "truncated": m.stop_reason == "max_tokens"}


def to_anthropic(messages: list[dict]) -> tuple[str, list[dict]]:
    """(system, messages): tool results ride in the next user turn, consecutive user turns merge."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    out: list[dict] = []
    for m in messages:
        if m["role"] == "assistant":
            blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
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


class OpenAIModel:
    """GPT through Chat Completions with tools, streamed (tool-call deltas); any OpenAI-compatible server by
    base_url (vLLM, SGLang, Ollama, llama.cpp server), where the model defaults to the server's first."""

    def __init__(self, model: str | None = None, *, base_url: str | None = None, max_output_tokens: int = 8192,
                 prices: dict | None = None, max_retries: int = MAX_RETRIES, timeout_s: float = TIMEOUT_S):
        import openai
        self.sdk, self.base_url = openai, base_url
        self.client = openai.OpenAI(api_key=_key("openai", base_url), base_url=base_url,
                                    max_retries=max_retries, timeout=timeout_s)
        self.where = base_url or "api.openai.com"
        self.model = model or (self._served_model() if base_url else DEFAULT_MODELS["openai"])
        self.name = f"openai:{self.model}"
        self.max_output_tokens = max_output_tokens
        self.prices = price("openai", self.model, prices, local=bool(base_url))

    def _served_model(self) -> str:
        try:
            ids = [m.id for m in self.client.models.list()]
        except Exception as e:
            raise _api_failure(self.sdk, e, "openai", self.where, "?", self.client.max_retries) from e
        if not ids:
            raise UserError(f"openai: {self.where} serves no model: start it with one, or pass --model")
        return ids[0]

    @_asking_again
    def query(self, messages: list[dict], tools: list[dict]) -> dict:
        limit = {"max_tokens" if self.base_url else "max_completion_tokens": self.max_output_tokens}
        specs = [{"type": "function", "function": t} for t in tools]
        text: list[str] = []
        calls: dict[int, dict] = {}
        use, finish, chunks = None, None, 0
        try:
            stream = self.client.chat.completions.create(
                model=self.model, messages=to_openai(messages), tools=specs, stream=True,
                stream_options={"include_usage": True}, **limit)
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
        except Exception as e:  # every failure becomes UserError or ModelError with the server named
            raise _api_failure(self.sdk, e, "openai", self.where, self.model, self.client.max_retries) from e
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


def _parse(arguments: str) -> dict | str:
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


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


def make(provider: str, model: str | None = None, base_url: str | None = None, **kw) -> Model:
    """The LLM provider by name (the offline search is made in search.py)."""
    if provider == "anthropic":
        return AnthropicModel(model, base_url=base_url, **kw)
    if provider == "openai":
        return OpenAIModel(model, base_url=base_url, **kw)
    raise UserError(f"unknown agent provider {provider!r}: use search, anthropic or openai")
