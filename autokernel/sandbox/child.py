"""The trusted harness inside the sandbox, run as a file (`python -I -c "...run_path(child.py)" FD`, see run()).

It reads {nonce, entry, payload, job_dir} from stdin (never argv or the environment, which any process in the sandbox
can read from /proc), calls the entry, and writes exactly one frame, "<nonce>\\n<json>", to the inherited pipe FD.
The candidate's stdout/stderr go to a log file, never to that pipe, and the FD is not inherited by anything the
candidate spawns. The parent accepts the frame only if it is the only thing on the pipe and starts with the nonce.

What this stops: forging by output (prints, writes to fds or files, exiting early with a fake result) and by
replacing what the harness uses after the entry returns (json, os.write, this module's globals: main() binds its
encoder, writer and nonce as locals before the entry runs).

Residual risk, stated plainly: the candidate runs in this process, so code that introspects the harness (frames,
gc, ctypes) can read the nonce and write a frame of its own, or change the entry's result before it is returned.
Introspection is the static gate's ban list (SHORTCUTS.md #18); timings that are too good are caught by the
roofline and 10x checks in the parent (#22).
"""
from __future__ import annotations

import faulthandler
import importlib
import json
import os
import signal
import sys
import traceback
from pathlib import Path

SELF = "autokernel.sandbox.child"  # this file's module name (it runs as __main__)


def _last_line(e: BaseException) -> str:
    lines = traceback.format_exception_only(type(e), e)
    return (lines[-1] if lines else repr(e)).strip()[:2000]


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, MemoryError):
        return True
    msg = str(e).lower()  # torch: "DefaultCPUAllocator: can't allocate memory", "CUDA out of memory"
    return "can't allocate memory" in msg or "out of memory" in msg


def _call(entry: str, payload: dict, job_dir: Path) -> dict:
    try:
        mod, _, fn = entry.partition(":")
        # This file runs as __main__; importing it again by name would import the whole autokernel.sandbox package.
        module = sys.modules["__main__"] if mod == SELF else importlib.import_module(mod)
        data = getattr(module, fn)(payload, job_dir)
        if not isinstance(data, dict):
            return {"ok": False, "reason": "sandbox.error", "detail": f"{entry} returned {type(data).__name__}, "
                                                                      "not a dict"}
        json.dumps(data)
        return {"ok": True, "data": data}
    except BaseException as e:  # noqa: BLE001 -- SystemExit and KeyboardInterrupt from candidate code are failures too
        traceback.print_exc()
        return {"ok": False, "reason": "sandbox.oom" if _is_oom(e) else "sandbox.error", "detail": _last_line(e)}


def ping(payload: dict, job_dir: Path) -> dict:
    """A no-op entry (after importing payload["import"] modules): the sandbox's own start-up cost, measured by
    benchmarks/sandbox_overhead.py."""
    for name in payload.get("import", []):
        importlib.import_module(name)
    return {"pong": True}


def _json_encoder():
    """A C-level JSON encoder built now: json.dumps looks its helpers up in patchable module globals at call time
    (json._default_encoder, json.encoder.c_make_encoder), this one has none left to look up."""
    from _json import encode_basestring_ascii, make_encoder

    def default(o):
        raise TypeError(f"{type(o).__name__} is not JSON serializable")
    enc = make_encoder({}, default, encode_basestring_ascii, None, ": ", ", ", False, False, True)
    return lambda obj: "".join(enc(obj, 0))


def main() -> None:
    # Everything used after the entry returns is bound here, as locals: the candidate runs inside the entry and
    # could replace json.dumps, os.write or this module's globals, but not a running frame's locals (short of the
    # introspection the static gate bans).
    encode, write, exit_, fd = _json_encoder(), os.write, os._exit, int(sys.argv[1])
    os.set_inheritable(fd, False)
    msg = json.loads(sys.stdin.buffer.read())
    nonce = msg.pop("nonce").encode()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write raises OSError(EFBIG) instead of killing us
    faulthandler.enable()  # a segfault leaves its Python traceback in the log the parent quotes
    frame = _call(msg["entry"], msg["payload"], Path(msg["job_dir"]))
    try:
        body = encode(frame).encode()
    except (TypeError, ValueError, RecursionError) as e:
        body = encode({"ok": False, "reason": "sandbox.error", "detail": f"result is not JSON: {e}"}).encode()
    out = nonce + b"\n" + body
    while out:
        out = out[write(fd, out):]
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a full log (RLIMIT_FSIZE) must not cost the result already sent
        pass
    exit_(0)  # no atexit handlers or lingering threads of the candidate's


if __name__ == "__main__":
    main()
