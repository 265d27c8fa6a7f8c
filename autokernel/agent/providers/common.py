"""What both providers share: the Model Protocol and its errors, the price table, the API key and URL checks,
one turn (`_call`) and the SDK client (`_Client`).

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
import os
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Callable, Protocol, TypeVar
from urllib.parse import urlparse

import yaml

from autokernel.deadline import Deadline
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

    @property
    def model(self) -> str | None:
        """The model id sent to the server (a server's first listed one when none was named); None: no server."""
        ...

    def query(self, messages: list[dict], tools: list[dict], deadline: Deadline = Deadline.none()) -> dict:
        """The next assistant message (neutral format, with usage) for this conversation and these tools, by
        `deadline` or OutOfTime."""
        ...


@lru_cache(maxsize=1)
def _price_table() -> dict:
    return yaml.safe_load((Path(__file__).parents[1] / "prices.yaml").read_text())  # agent/prices.yaml


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


class _Turn:
    """One turn under the session's deadline: `watch(response)` closes a stream still open when it passes."""

    def __init__(self, deadline: Deadline):
        self.deadline, self.fired = deadline, False

    def left(self) -> float:
        return self.deadline.left()

    def passed(self) -> bool:
        return self.fired or self.deadline.expired()

    @contextmanager
    def watch(self, response):
        if self.deadline.at is None:
            yield
            return

        def fire():
            self.fired = True
            response.close()  # the reading thread's next (or current) read fails at once
        timer = threading.Timer(self.left(), fire)
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


def _call(m, attempt: Callable[[float, _Turn], T], deadline: Deadline) -> T:
    """One turn: `attempt(timeout_s, turn)` until it returns, retrying transient failures (m.max_retries) and
    malformed replies (MALFORMED_RETRIES), never past the deadline (OutOfTime)."""
    turn = _Turn(deadline)
    retries = malformed = 0
    while True:
        if turn.passed():
            raise OutOfTime(f"{m.provider}: no complete reply from {m.where} before the wall-clock budget ran out")
        try:
            return attempt(min(m.timeout_s, turn.left()), turn)
        except Exception as e:  # every failure is classified; none escapes unnamed
            if turn.passed():
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
            if wait >= turn.left():
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
        def attempt(timeout_s, turn):
            try:
                ids = [x.id for x in self.client.models.list(timeout=min(timeout_s, PREFLIGHT_TIMEOUT_S))]
            except self.sdk.NotFoundError:
                ids = None
            self.reached = True
            return ids
        return _call(self, attempt, Deadline.none())


def _probe(m: _Client) -> None:
    """preflight's network half: the server answers and takes the key (a UserError if not)."""
    try:
        m._models()
    except (ModelError, TimeoutError):
        pass  # the server answered something: not every compatible server lists its models


def _parse(arguments: str) -> dict | str:
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return arguments
    return parsed if isinstance(parsed, dict) else arguments
