"""Model providers: one Protocol, two official SDKs, one provider-neutral message format. One module each:
common.py (the Protocol, errors, prices, one turn with its retries and deadline), anthropic.py, openai.py; here,
choosing one by name (make) and checking it before a run (preflight).

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
"""
from __future__ import annotations

from autokernel.agent.providers.anthropic import AnthropicModel, to_anthropic
from autokernel.agent.providers.common import (
    DEFAULT_MODELS,
    KEY_VARS,
    PREFLIGHT_TIMEOUT_S,
    MalformedResponse,
    Model,
    ModelError,
    ModelUnavailable,
    OutOfTime,
    _check_url,
    _key,
    price,
    usage,
)
from autokernel.agent.providers.openai import OpenAIModel, to_openai
from autokernel.errors import UserError

__all__ = ["DEFAULT_MODELS", "KEY_VARS", "AnthropicModel", "MalformedResponse", "Model", "ModelError",
           "ModelUnavailable", "OpenAIModel", "OutOfTime", "make", "preflight", "price", "to_anthropic",
           "to_openai", "usage"]


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


def make(provider: str, model: str | None = None, base_url: str | None = None,
         **kw) -> AnthropicModel | OpenAIModel:
    """The LLM provider by name (the offline search is made in search.py)."""
    if provider == "anthropic":
        return AnthropicModel(model, base_url=base_url, **kw)
    if provider == "openai":
        return OpenAIModel(model, base_url=base_url, **kw)
    raise UserError(f"unknown agent provider {provider!r}: use search, anthropic or openai")
