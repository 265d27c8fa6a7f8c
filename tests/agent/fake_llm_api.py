"""A local stand-in for the Anthropic Messages and OpenAI Chat Completions HTTP APIs, for tests without a network.

Stdlib http.server in a thread on 127.0.0.1. The test scripts the replies: each request pops the next entry of
`script`, a `Reply` built by the helpers below (a streamed turn in the API's SSE wire format, an error status, or
raw bytes), optionally broken the way real servers break (`dropped`, `stalled`: a connection closed mid-reply, a
reply that stops for a while, with or without keep-alive comments). Requests are recorded (path, headers, JSON
body, arrival time) so tests can check what the SDKs actually sent, and when.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/event-stream"
    headers: dict = field(default_factory=dict)
    drop_after: int | None = None  # SSE events sent before the connection is closed mid-reply
    stall_after: int | None = None  # SSE events sent before the reply stops for stall_s seconds
    stall_s: float = 0.0
    ping_s: float | None = None  # while stalled, an SSE comment every ping_s seconds (servers' keep-alive)


def dropped(reply: Reply, after_events: int = 3) -> Reply:
    """The reply, cut off after `after_events` SSE events by a closed connection (no end of the chunked body)."""
    return replace(reply, drop_after=after_events)


def stalled(reply: Reply, stall_s: float, after_events: int = 2, ping_s: float | None = None) -> Reply:
    """The reply, stopping for `stall_s` seconds after `after_events` SSE events (keep-alive comments every
    `ping_s` seconds if given), then finishing if the client is still there."""
    return replace(reply, stall_after=after_events, stall_s=stall_s, ping_s=ping_s)


@dataclass
class Call:
    """A tool call the scripted model makes."""
    name: str
    arguments: dict | str  # a str is sent verbatim (malformed JSON tests)
    id: str = ""


def _sse(events: list[tuple[str | None, object]]) -> bytes:
    out = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        out.append((f"event: {name}\n" if name else "") + f"data: {text}\n\n")
    return "".join(out).encode()


def _chunks(s: str, n: int = 3) -> list[str]:
    """Split s into n pieces, so arguments arrive as several deltas as they do from the real APIs."""
    k = max(1, -(-len(s) // n))
    return [s[i:i + k] for i in range(0, len(s), k)] or [""]


def anthropic_turn(text: str = "", calls: list[Call] = (), input_tokens: int = 100, output_tokens: int = 50,
                   model: str = "claude-test", cache_read: int = 0, cache_write: int = 0,
                   stop_reason: str | None = None, thinking: str = "", signature: str = "sig-fake") -> Reply:
    """One assistant turn streamed as Anthropic Messages SSE events (message_start ... message_stop); `thinking`
    streams a signed extended-thinking block first (thinking_delta, then signature_delta)."""
    ev: list[tuple[str, object]] = [("message_start", {"type": "message_start", "message": {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1, "cache_read_input_tokens": cache_read,
                  "cache_creation_input_tokens": cache_write}}})]
    idx = 0
    if thinking:
        ev.append(("content_block_start", {"type": "content_block_start", "index": idx,
                                           "content_block": {"type": "thinking", "thinking": "", "signature": ""}}))
        for piece in _chunks(thinking):
            ev.append(("content_block_delta", {"type": "content_block_delta", "index": idx,
                                               "delta": {"type": "thinking_delta", "thinking": piece}}))
        ev.append(("content_block_delta", {"type": "content_block_delta", "index": idx,
                                           "delta": {"type": "signature_delta", "signature": signature}}))
        ev.append(("content_block_stop", {"type": "content_block_stop", "index": idx}))
        idx += 1
    if text:
        ev.append(("content_block_start", {"type": "content_block_start", "index": idx,
                                           "content_block": {"type": "text", "text": ""}}))
        for piece in _chunks(text):
            ev.append(("content_block_delta", {"type": "content_block_delta", "index": idx,
                                               "delta": {"type": "text_delta", "text": piece}}))
        ev.append(("content_block_stop", {"type": "content_block_stop", "index": idx}))
        idx += 1
    for i, c in enumerate(calls):
        ev.append(("content_block_start", {"type": "content_block_start", "index": idx, "content_block": {
            "type": "tool_use", "id": c.id or f"toolu_{i}", "name": c.name, "input": {}}}))
        args = c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)
        for piece in _chunks(args):
            ev.append(("content_block_delta", {"type": "content_block_delta", "index": idx,
                                               "delta": {"type": "input_json_delta", "partial_json": piece}}))
        ev.append(("content_block_stop", {"type": "content_block_stop", "index": idx}))
        idx += 1
    ev.append(("message_delta", {"type": "message_delta",
                                 "delta": {"stop_reason": stop_reason or ("tool_use" if calls else "end_turn"),
                                           "stop_sequence": None},
                                 "usage": {"output_tokens": output_tokens}}))
    ev.append(("message_stop", {"type": "message_stop"}))
    return Reply(body=_sse(ev))


def openai_turn(text: str = "", calls: list[Call] = (), prompt_tokens: int = 100, completion_tokens: int = 50,
                model: str = "gpt-test", usage: bool = True, finish: str | None = None) -> Reply:
    """One assistant turn streamed as Chat Completions chunks, tool-call arguments in deltas, usage last."""
    def chunk(delta=None, finish=None, usage_=None, choices=True):
        return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model,
                "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else [],
                **({"usage": usage_} if usage_ else {})}
    ev: list[tuple[None, object]] = [(None, chunk({"role": "assistant", "content": ""}))]
    for piece in (_chunks(text) if text else []):
        ev.append((None, chunk({"content": piece})))
    for i, c in enumerate(calls):
        ev.append((None, chunk({"tool_calls": [{"index": i, "id": c.id or f"call_{i}", "type": "function",
                                                 "function": {"name": c.name, "arguments": ""}}]})))
        args = c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)
        for piece in _chunks(args):
            ev.append((None, chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})))
    ev.append((None, chunk({}, finish or ("tool_calls" if calls else "stop"))))
    if usage:
        ev.append((None, chunk(choices=False, usage_={"prompt_tokens": prompt_tokens,
                                                       "completion_tokens": completion_tokens,
                                                       "total_tokens": prompt_tokens + completion_tokens})))
    ev.append((None, "[DONE]"))
    return Reply(body=_sse(ev))


def status(code: int, message: str = "slow down", retry_after_ms: int | None = 10) -> Reply:
    """An API error reply (429, 500, ...) in the shape both APIs use; retry-after-ms keeps SDK back-off short."""
    headers = {"retry-after-ms": str(retry_after_ms)} if retry_after_ms is not None else {}
    body = json.dumps({"type": "error", "error": {"type": "rate_limit_error" if code == 429 else "api_error",
                                                  "message": message}}).encode()
    return Reply(code, body, "application/json", headers)


def raw(body: bytes, content_type: str = "application/json", code: int = 200) -> Reply:
    return Reply(code, body, content_type)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: FakeAPI  # set by FakeAPI before the first request

    def handle_error(self, request, client_address):  # a client closing its keep-alive socket is not an error
        pass


class _Handler(BaseHTTPRequestHandler):
    """One request to the FakeAPI that owns the server: its script, its record of requests."""
    protocol_version = "HTTP/1.1"
    server: _Server

    @property
    def api(self) -> FakeAPI:
        return self.server.api

    def do_POST(self):  # http.server's naming
        n = int(self.headers.get("content-length") or 0)
        raw_body = self.rfile.read(n)
        with self.api._lock:
            try:
                body = json.loads(raw_body or b"{}")
            except ValueError:
                body = {"_raw": raw_body.decode(errors="replace")}
            self.api.requests.append(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            reply = self.api.script.pop(0) if self.api.script else status(500, "script exhausted", None)
        try:
            self.send(reply)
        except OSError:  # the client gave up (a deadline): nothing more to send
            self.close_connection = True

    def send(self, reply: Reply):
        broken = reply.drop_after is not None or reply.stall_after is not None
        self.send_response(reply.status)
        self.send_header("content-type", reply.content_type)
        self.send_header(*(("transfer-encoding", "chunked") if broken
                           else ("content-length", str(len(reply.body)))))
        for k, v in reply.headers.items():
            self.send_header(k, v)
        self.end_headers()
        if not broken:
            self.wfile.write(reply.body)
            return
        events = [e + b"\n\n" for e in reply.body.split(b"\n\n") if e.strip()]
        for i, event in enumerate(events):
            if i == reply.drop_after:  # the connection dies: no terminating chunk
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if i == reply.stall_after:
                self.stall(reply)
            self.chunk(event)
        self.chunk(b"")

    def stall(self, reply: Reply):
        end = time.monotonic() + reply.stall_s
        while not self.api.closing.is_set() and time.monotonic() < end:
            self.api.closing.wait(min(reply.ping_s or reply.stall_s, max(0.0, end - time.monotonic())))
            if reply.ping_s and time.monotonic() < end:
                self.chunk(b": ping\n\n")

    def chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):  # both APIs list the models a key may use
        self.api.requests.append(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, {}))
        if self.api.models_reply is not None:
            return self.send(self.api.models_reply)
        body = json.dumps({"object": "list", "has_more": False, "data": [
            {"id": m, "object": "model", "type": "model", "created": 0, "owned_by": "fake",
             "display_name": m, "created_at": "2025-01-01T00:00:00Z"} for m in self.api.models],
            "first_id": self.api.models[0] if self.api.models else None,
            "last_id": self.api.models[-1] if self.api.models else None}).encode()
        self.send(Reply(200, body, "application/json"))

    def log_message(self, *args):  # keep pytest output clean
        pass


@dataclass
class Request:
    path: str
    headers: dict  # names lower-cased
    body: dict
    at: float = field(default_factory=time.monotonic)


class FakeAPI:
    """`with FakeAPI(script) as api:` serves the replies in order on api.base_url; api.requests records the calls."""

    def __init__(self, script: list[Reply], models: tuple[str, ...] = ("fake-model",),
                 models_reply: Reply | None = None):
        """`models`: what GET .../models lists (in both APIs' shapes); `models_reply` replaces that answer."""
        self.script, self.models, self.models_reply = list(script), models, models_reply
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self.closing = threading.Event()  # releases stalled replies when the test ends
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.api = self
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeAPI":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
