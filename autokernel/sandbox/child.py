"""The trusted harness inside the sandbox, run as a file (`python -I -B -c "...run_path(child.py)" FD`, see run()).

It reads {nonce, entry, payload, inputs} from stdin (never argv or the environment, which any process in the sandbox
can read from /proc), imports the entry's module, binds `torch.save`, calls entry(payload, inputs) and writes exactly
one frame to the inherited pipe FD: nonce, 8-byte length, then the torch.save bytes of {"ok", "data" | "reason",
"detail"}. The parent loads it with torch.load(weights_only=True): tensors, numbers, strings and containers only,
nothing that runs code. The candidate's stdout/stderr go to a different pipe, never to this one, and the FD is not
inherited by anything the candidate executes.

What the nonce and the early binding stop: forging by output (prints, writes to fds, exiting early with a fake frame)
and by replacing what the harness uses after the entry returns (torch.save, os.write, this module's globals: main()
binds them as locals before the entry runs).

What they do NOT stop, stated plainly: the candidate runs in this process, so code that introspects the harness
(frames, gc, ctypes) can read the nonce and the FD from main()'s locals and write a frame of its own, or change the
entry's result before it is returned. That is why the frame carries only RAW data (outputs, timings, observations)
and every judgement is made in the parent from data it generated itself: a forged frame can at most report raw data
the candidate could have produced anyway, and the static grammar (autokernel/gate/static.py) keeps introspection out
of candidate files in the first place.
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
MAX_DEPTH = 32  # nesting of the returned data


def _last_line(e: BaseException) -> str:
    lines = traceback.format_exception_only(type(e), e)
    return (lines[-1] if lines else repr(e)).strip()[:2000]


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, MemoryError):
        return True
    msg = str(e).lower()  # torch: "DefaultCPUAllocator: can't allocate memory", "CUDA out of memory"
    return "can't allocate memory" in msg or "out of memory" in msg


def _plain(obj, tensor_type, depth: int = 0) -> str | None:
    """None if `obj` is made only of what the parent's weights_only load accepts, else where it is not."""
    if depth > MAX_DEPTH:
        return "nested too deeply"
    if obj is None or type(obj) in (bool, int, float, str, bytes) or type(obj) is tensor_type:
        return None
    if type(obj) in (list, tuple):
        return next((w for w in (_plain(x, tensor_type, depth + 1) for x in obj) if w), None)
    if type(obj) is dict:
        for k, v in obj.items():
            if type(k) not in (str, int):
                return f"a {type(k).__name__} key"
            w = _plain(v, tensor_type, depth + 1)
            if w:
                return w
        return None
    return f"a {type(obj).__module__}.{type(obj).__qualname__}"


def _fail(reason: str, detail: str) -> dict:
    return {"ok": False, "reason": reason, "detail": detail}


def _describe(e: BaseException, last_line=_last_line) -> str:
    try:
        return last_line(e)
    except BaseException:  # noqa: BLE001 -- the candidate broke traceback's helpers (linecache, io...)
        return type(e).__name__


def _call(fn, entry: str, payload: dict, inputs: Path, tensor_type, *, fail=_fail, plain=_plain, is_oom=_is_oom,
          describe=_describe, print_exc=traceback.print_exc) -> dict:
    """Call the entry. The helpers are bound as defaults when this module loads, before any candidate code: the
    candidate runs inside fn() and may replace this module's globals, which the failure path below would look up."""
    try:
        data = fn(payload, inputs)
        if type(data) is not dict:
            return fail("sandbox.error", f"{entry} returned {type(data).__name__}, not a dict")
        why = plain(data, tensor_type)
        if why:
            return fail("sandbox.error", f"{entry} returned {why}: only tensors, numbers, strings and containers "
                                         "cross the channel")
        return {"ok": True, "data": data}
    except BaseException as e:  # noqa: BLE001 -- SystemExit and KeyboardInterrupt from candidate code are failures too
        try:
            print_exc()
        except BaseException:  # noqa: BLE001 -- a traceback the candidate made unprintable still has a last line
            pass
        return fail("sandbox.oom" if is_oom(e) else "sandbox.error", describe(e))


def ping(payload: dict, inputs: Path) -> dict:
    """A no-op entry (after importing payload["import"] modules): the sandbox's own start-up cost, measured by
    benchmarks/sandbox_overhead.py."""
    for name in payload.get("import", []):
        importlib.import_module(name)
    return {"pong": True}


def _entry(entry: str):
    """The entry's function; its (trusted) module is imported before any candidate code runs."""
    mod, _, fn = entry.partition(":")
    # This file runs as __main__; importing it again by name would import the whole autokernel.sandbox package.
    module = sys.modules["__main__"] if mod == SELF else importlib.import_module(mod)
    return getattr(module, fn)


def main() -> None:
    # Everything used after the entry returns is bound here, as locals, before any candidate code runs (see the module
    # docstring for what this does and does not stop).
    write, exit_, fd, fail, describe = os.write, os._exit, int(sys.argv[1]), _fail, _describe
    os.set_inheritable(fd, False)
    msg = json.loads(sys.stdin.buffer.read())
    nonce = msg.pop("nonce").encode()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write raises OSError(EFBIG) instead of killing us
    faulthandler.enable()  # a segfault leaves its Python traceback in the log the parent quotes
    import io

    import torch
    save, buffer, tensor_type = torch.save, io.BytesIO, torch.Tensor
    save({"ok": True, "data": {"t": torch.zeros(1)}}, buffer())  # torch.save's lazy imports happen now, not later
    try:
        fn = _entry(msg["entry"])
    except BaseException as e:  # noqa: BLE001 -- a broken entry is the harness's failure, reported as one
        frame = fail("sandbox.error", f"entry {msg['entry']}: {describe(e)}")
    else:
        frame = _call(fn, msg["entry"], msg["payload"], Path(msg["inputs"]), tensor_type)
    buf = buffer()
    try:
        save(frame, buf)
    except Exception as e:  # noqa: BLE001 -- e.g. a tensor whose storage cannot be serialised
        buf = buffer()
        save(fail("sandbox.error", f"result could not be serialised: {describe(e)}"), buf)
    body = buf.getvalue()
    out = nonce + len(body).to_bytes(8, "big") + body
    while out:
        out = out[write(fd, out):]
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    exit_(0)  # no atexit handlers or lingering threads of the candidate's


if __name__ == "__main__":
    main()
