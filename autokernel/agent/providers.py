"""Model providers: one Protocol, two official SDKs, one provider-neutral message format.

The session's message list is plain JSON that either provider can replay, and it is the transcript:

    {"role": "system" | "user", "content": str}
    {"role": "assistant", "content": str, "tool_calls": [{"id": str, "name": str, "arguments": dict | str}],
     "usage": {"input_tokens": int, "output_tokens": int, "usd": float, "estimated": bool,
               "cache_read_tokens": int, "cache_write_tokens": int (when a prompt cache was used)},
     "truncated": bool}
    {"role": "tool", "tool_call_id": str, "name": str, "content": str}

`arguments` is the parsed dict, or the raw text when the model sent malformed JSON (the loop answers that with an
error, the model tries again); both providers read the raw streamed events and parse the tool input themselves, so
the two APIs fail alike. Token counts are the API's own; cost is tokens x the price table (prices.yaml, overridable
with `agent.prices`).

Real servers drop streams mid-reply, stall, and answer 5xx; the SDKs retry only the request, never a stream that
broke after its headers. So each turn is one `_call`: attempts with the SDKs' own retries off, retried here on
408/409/429/5xx, connection errors, timeouts and dropped streams (back-off 0.5, 1, 2, 4 s, or the server's
retry-after), all inside the session's deadline: every attempt's timeout is the time left, and a watchdog closes a
stream still open at the deadline (OutOfTime: the loop ends the session as spent wall time). What the session does
with a failure: a missing or refused key, an unknown model or a server never reached is a UserError (exit 2, fix and
rerun); a server that keeps failing is ModelUnavailable, a reply that never parses MalformedResponse: both end the
session with `Result.error` set, never read as "no improvement".
"""
from __future__ import annotations

import json
import math
import os
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Callable, Protocol, TypeVar
from urllib.parse import urlparse

import yaml

from autokernel.errors import UserError

DEFAULT_MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-5"}
KEY_VARS = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
MAX_RETRIES = 4  # transient failures retried per turn, after 0.5, 1, 2, 4 s (or as retry-after says)
MAX_BACKOFF_S = 60.0  # the longest retry-after honoured; a longer one is a server that is not coming back soon
TIMEOUT_S = 600.0  # the longest silence accepted from a server (the SDKs' default); the deadline cuts in sooner
PREFLIGHT_TIMEOUT_S = 10.0  # one models.list to find a wrong URL or key before a run profiles for minutes
MALFORMED_RETRIES = 1  # a reply that does not parse is asked for once more, then the session ends (model_error)
LOCAL_KEY = "not-needed"  # OpenAI-compatible local servers (vLLM, SGLang, Ollama, llama.cpp) accept any key
RETRY_STATUS = frozenset({408, 409, 429})  # and every 5xx


class ModelError(Exception):
    """The API answered, but not with a usable turn: the session ends and Result.error says why."""


class MalformedResponse(ModelError):
    """The reply did not parse as the API's wire format (asked again MALFORMED_RETRIES times before giving up)."""


class ModelUnavailable(ModelError):
    """The server kept failing (HTTP 5xx/429, dropped or stalled streams) through every retry: an environment
    failure, not a verdict on any candidate."""


class OutOfTime(TimeoutError):
    """The session's wall-clock budget (agent.max_wall_s) ran out during a model call."""


class Model(Protocol):
    name: str  # "provider:model", recorded in the transcript

    @property
    def prices(self) -> tuple[float, float, str] | None:
        """price(): USD per million input and output tokens, and where the row came from; None: free (the search)."""
        ...

    def query(self, messages: list[dict], tools: list[dict], time_left_s: float | None = None) -> dict:
        """The next assistant message (neutral format, with usage) for this conversation and these tools, within
        time_left_s seconds (None: no deadline) or OutOfTime."""
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


def _check_url(base_url: str | None) -> None:
    if base_url is None:
        return
    u = urlparse(base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UserError(f"--base-url {base_url!r} is not an http(s) URL: give the server's API root, "
                        f"e.g. http://127.0.0.1:8000/v1 (or agent.base_url in policies.yaml)")


def preflight(provider: str, model: str | None = None, base_url: str | None = None, probe: bool = True
              ) -> str | None:
    """Check the provider, its API key and --base-url before anything slow (profiling): UserError (exit 2) naming the
    environment variable or flag to fix. With `probe`, one models.list (PREFLIGHT_TIMEOUT_S, no retry) finds a server
    that cannot be reached, refuses the key, or (--base-url without --model) serves no model; any other answer from
    the probe passes (not every compatible server lists its models). Returns the model the probe settled on (the
    server's first, for --base-url without --model): passed on as the model name, the run lists the models once."""
    if provider == "search":
        return None
    if provider not in KEY_VARS:
        raise UserError(f"unknown agent provider {provider!r}: use search, anthropic or openai (--agent)")
    _check_url(base_url)
    _key(provider, base_url)
    if probe:
        return make(provider, model, base_url, max_retries=0, timeout_s=PREFLIGHT_TIMEOUT_S, probe=True).model
    return model


# --- one turn: attempts, retries, the deadline --------------------------------------------------------------------


@lru_cache(maxsize=1)
def _transport_errors() -> tuple[type, ...]:
    """What the HTTP layer raises when a stream breaks after its headers (the SDKs do not always wrap it)."""
    found = []
    for name in ("httpx2", "httpx", "httpcore"):
        try:
            mod = __import__(name)
        except ImportError:
            continue
        found += [getattr(mod, n) for n in ("TransportError", "StreamError", "NetworkError", "ProtocolError",
                                             "TimeoutException") if isinstance(getattr(mod, n, None), type)]
    return tuple(found)


class _Dropped(Exception):
    """The stream ended before the API's end-of-reply marker (finish_reason / message_stop)."""


class _Deadline:
    """The session's deadline for one turn: `watch(response)` closes a stream still open when it passes."""

    def __init__(self, time_left_s: float | None):
        self.at = math.inf if time_left_s is None else time.monotonic() + max(0.0, time_left_s)
        self.fired = False

    def left(self) -> float:
        return self.at - time.monotonic()

    def passed(self) -> bool:
        return self.fired or self.left() <= 0

    @contextmanager
    def watch(self, response):
        if self.at == math.inf:
            yield
            return

        def fire():
            self.fired = True
            response.close()  # the reading thread's next (or current) read fails at once
        timer = threading.Timer(max(0.0, self.left()), fire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()


def _retry_after(e: Exception) -> float | None:
    headers = getattr(getattr(e, "response", None), "headers", None) or {}
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) * scale
        except (TypeError, ValueError):
            pass
    return None


def _classify(m, e: Exception, retries: int) -> tuple[str, Exception, float]:
    """(what to do: fatal | transient | malformed, the exception to raise if it is the last, seconds to wait)."""
    sdk, who, where = m.sdk, m.provider, m.where
    backoff = min(8.0, 0.5 * 2 ** retries)
    if isinstance(e, (sdk.AuthenticationError, sdk.PermissionDeniedError)):
        return "fatal", UserError(f"{who}: {where} refused the API key (HTTP {e.status_code}): check "
                                  f"{KEY_VARS[who]}"), 0
    if isinstance(e, sdk.NotFoundError):
        return "fatal", UserError(f"{who}: {where} has no model {m.model!r} (HTTP 404): set agent.model or "
                                  f"--model (or check --base-url)"), 0
    if isinstance(e, sdk.APIStatusError):
        msg = f"{who}: HTTP {e.status_code} from {where}"
        if e.status_code in RETRY_STATUS or e.status_code >= 500:
            wait = _retry_after(e)
            return "transient", ModelUnavailable(f"{msg} after {retries} retries: {e.message}"), (
                backoff if wait is None else wait)
        return "fatal", ModelError(f"{msg}: {e.message}"), 0
    if isinstance(e, (sdk.APIConnectionError, _Dropped, *_transport_errors())):
        what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if not m.reached:
            return "transient", UserError(f"{who}: cannot reach {where} ({what}) after {retries} retries: check "
                                          f"the network, or --base-url"), backoff
        return "transient", ModelUnavailable(f"{who}: {where} broke off {retries + 1} replies in a row (last: "
                                             f"{what})"), backoff
    what = f"{type(e).__name__}: {e}" if str(e) else f"{type(e).__name__} (no complete message in the stream)"
    return "malformed", MalformedResponse(f"{who}: malformed response from {where}: {what}"), 0


T = TypeVar("T")


def _call(m, attempt: Callable[[float, _Deadline], T], time_left_s: float | None) -> T:
    """One turn: `attempt(timeout_s, deadline)` until it returns, retrying transient failures (m.max_retries) and
    malformed replies (MALFORMED_RETRIES), never past the deadline (OutOfTime)."""
    deadline = _Deadline(time_left_s)
    retries = malformed = 0
    while True:
        if deadline.passed():
            raise OutOfTime(f"{m.provider}: no complete reply from {m.where} before the wall-clock budget ran out")
        try:
            return attempt(min(m.timeout_s, deadline.left()), deadline)
        except Exception as e:  # every failure is classified; none escapes unnamed
            if deadline.passed():
                raise OutOfTime(f"{m.provider}: {m.where} was still replying when the wall-clock budget ran "
                                f"out") from e
            kind, failure, wait = _classify(m, e, retries)
            if kind == "fatal" or (kind == "transient" and retries >= m.max_retries) or (
                    kind == "malformed" and malformed >= MALFORMED_RETRIES):
                raise failure from e
            if kind == "malformed":
                malformed += 1
                continue
            retries += 1
            if wait > MAX_BACKOFF_S:
                raise failure from e
            if wait >= deadline.left():
                raise OutOfTime(f"{m.provider}: {m.where} asked to retry in {wait:.3g} s, past the wall-clock "
                                f"budget") from e
            time.sleep(wait)


class _Client:
    """What both providers share: the SDK client with its own retries off (see _call), the server's name, the
    price row."""

    def _setup(self, provider: str, sdk, base_url: str | None, max_output_tokens: int,
               prices: dict | None, max_retries: int, timeout_s: float) -> None:
        _check_url(base_url)
        self.provider, self.sdk, self.base_url = provider, sdk, base_url
        self.max_retries, self.timeout_s, self.max_output_tokens = max_retries, timeout_s, max_output_tokens
        self.reached = False  # a reply (of any kind) came back from the server at least once
        self.where = base_url or f"api.{provider}.com"
        cls = sdk.Anthropic if provider == "anthropic" else sdk.OpenAI
        self.client = cls(api_key=_key(provider, base_url), base_url=base_url, max_retries=0, timeout=timeout_s)
        self._prices_override = prices

    def _named(self, model: str) -> None:
        # self.model is sent back to the server as it listed it; self.name is what is shown and recorded (a server's
        # model id may carry terminal escapes or GitHub syntax: autokernel.untrusted)
        from autokernel.untrusted import line
        self.model, self.name = model, f"{self.provider}:{line(model, 200)}"
        self.prices = price(self.provider, model, self._prices_override, local=bool(self.base_url))

    def _models(self) -> list[str] | None:
        """The ids the server lists, or None where it has no models endpoint (PREFLIGHT_TIMEOUT_S per request)."""
        def attempt(timeout_s, deadline):
            try:
                ids = [x.id for x in self.client.models.list(timeout=min(timeout_s, PREFLIGHT_TIMEOUT_S))]
            except self.sdk.NotFoundError:
                ids = None
            self.reached = True
            return ids
        return _call(self, attempt, None)


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

    def query(self, messages: list[dict], tools: list[dict], time_left_s: float | None = None) -> dict:
        system, msgs = to_anthropic(messages)
        specs = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                 for t in tools]
        # Prompt caching: tools + system, and the conversation up to this turn, are re-read by every later turn.
        cached = {"type": "ephemeral"}
        system_blocks = [{"type": "text", "text": system, "cache_control": cached}]
        if msgs:
            msgs[-1]["content"][-1] = {**msgs[-1]["content"][-1], "cache_control": cached}
        return _call(self, lambda timeout_s, deadline: self._attempt(system_blocks, msgs, specs, timeout_s, deadline),
                     time_left_s)

    def _attempt(self, system: list, msgs: list, specs: list, timeout_s: float, deadline: _Deadline) -> dict:
        extra = {}
        if self.thinking_budget_tokens:  # thinking gets its own room: max_tokens covers thinking + the reply
            extra = {"thinking": {"type": "enabled", "budget_tokens": self.thinking_budget_tokens}}
        stream = self.client.messages.create(
            model=self.model, max_tokens=self.max_output_tokens + (self.thinking_budget_tokens or 0), system=system,
            messages=msgs, tools=specs, stream=True, timeout=timeout_s, **extra)
        self.reached = True
        blocks: dict[int, dict] = {}
        start, out_tokens, stop, done = None, 0, None, False
        with deadline.watch(stream.response):
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


def _probe(m: _Client) -> None:
    """preflight's network half: the server answers and takes the key (a UserError if not)."""
    try:
        m._models()
    except (ModelError, TimeoutError):
        pass  # the server answered something: not every compatible server lists its models


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

    def query(self, messages: list[dict], tools: list[dict], time_left_s: float | None = None) -> dict:
        return _call(self, lambda timeout_s, deadline: self._attempt(messages, tools, timeout_s, deadline),
                     time_left_s)

    def _attempt(self, messages: list[dict], tools: list[dict], timeout_s: float, deadline: _Deadline) -> dict:
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
        with deadline.watch(stream.response):
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


def make(provider: str, model: str | None = None, base_url: str | None = None,
         **kw) -> AnthropicModel | OpenAIModel:
    """The LLM provider by name (the offline search is made in search.py)."""
    if provider == "anthropic":
        return AnthropicModel(model, base_url=base_url, **kw)
    if provider == "openai":
        return OpenAIModel(model, base_url=base_url, **kw)
    raise UserError(f"unknown agent provider {provider!r}: use search, anthropic or openai")
