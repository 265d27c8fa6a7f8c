"""The parent's side of a job's two pipes: the result frame (capped, nonce-checked, loaded weights-only) and the
child's stdout/stderr (drained with a cap, written by the parent itself into its own evidence directory).

Nothing here opens a path the candidate could have written: both streams arrive through pipes the parent created.
"""
from __future__ import annotations

import hmac
import io
import os
import select
import stat
import subprocess
import time

MAX_RESULT_BYTES = 1 << 30  # a numeric chunk's outputs (inputs are capped at 256 MB per chunk, three calls each)
LOG_KEEP_BYTES = 1 << 20  # the tail of the child's output that is kept; the rest is counted and dropped
LEN_BYTES = 8


def drain(fd: int, chunks: list) -> None:
    """Read the result pipe to EOF; past MAX_RESULT_BYTES keep reading (so the writer never blocks) but keep
    nothing (chunks becomes [None])."""
    n = 0
    while True:
        try:
            b = os.read(fd, 1 << 16)
        except OSError:
            return
        if not b:
            return
        n += len(b)
        if n > MAX_RESULT_BYTES:
            chunks[:] = [None]
        else:
            chunks.append(b)


def parse_frame(chunks: list, nonce: bytes) -> tuple[dict | None, str]:
    """The harness's frame, or (None, why not); (None, "") when nothing was sent. Anything but exactly one
    well-formed frame is tampering. The body is loaded with torch.load(weights_only=True): tensors and plain data,
    never code."""
    if None in chunks:
        return None, f"result larger than {MAX_RESULT_BYTES >> 20} MB"
    raw = b"".join(chunks)
    if not raw:
        return None, ""
    head = len(nonce) + LEN_BYTES
    if len(raw) < head or not hmac.compare_digest(raw[:len(nonce)], nonce):
        return None, "result channel tampered: data that is not the harness's frame"
    if int.from_bytes(raw[len(nonce):head], "big") != len(raw) - head:
        return None, "result channel tampered: more than one frame, or a truncated one"
    import torch
    try:
        frame = torch.load(io.BytesIO(raw[head:]), weights_only=True)
    except Exception as e:  # noqa: BLE001 -- whatever the bytes are, they are not a frame
        return None, f"result channel tampered: unreadable frame ({type(e).__name__})"
    if not isinstance(frame, dict) or not isinstance(frame.get("ok"), bool):
        return None, "result channel tampered: malformed frame"
    return frame, ""


def load_blob(blob: object) -> object:
    """A torch.save blob a job returned inside its frame (outputs, logits, captured calls), loaded weights-only, with
    no tensor larger than the bytes that carry it: a view whose elements overlap (a stride-0 expand of one element
    to (rows, 2**40)) arrives in a few bytes and made the parent allocate 211 TB at its first `.double()`. Raises
    ValueError naming what is wrong; the caller turns it into its own failure."""
    import torch
    if not isinstance(blob, (bytes, bytearray)):
        raise ValueError(f"not a blob ({type(blob).__name__})")
    try:
        value = torch.load(io.BytesIO(blob), weights_only=True)
    except Exception as e:  # noqa: BLE001 -- whatever the bytes are, they do not load
        raise ValueError(f"unreadable ({type(e).__name__})") from None
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack += list(v.values())
        elif isinstance(v, (list, tuple)):
            stack += list(v)
        elif isinstance(v, torch.Tensor) and v.numel() * v.element_size() > v.untyped_storage().nbytes():
            raise ValueError(f"a tensor of shape {tuple(v.shape)} over {v.untyped_storage().nbytes()} bytes of "
                             "storage (elements that overlap: an expanded view)")
    return value


class LogTail:
    """The last LOG_KEEP_BYTES of the child's stdout+stderr, and how much was dropped before them."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.dropped = 0

    def drain(self, f) -> None:
        while True:
            try:
                b = f.read1(1 << 16)
            except (OSError, ValueError):
                return
            if not b:
                return
            self.buf += b
            extra = len(self.buf) - LOG_KEEP_BYTES
            if extra > 0:
                del self.buf[:extra]
                self.dropped += extra

    def lines(self, n: int = 8192) -> list[str]:
        text = bytes(self.buf[-n:]).decode(errors="replace")
        return [ln.strip() for ln in text.splitlines() if ln.strip()]


def write_log(path, entry: str, isolation: str, rc: int | None, log: LogTail) -> None:
    """Append the job's output to the parent's own log file. O_NOFOLLOW and a regular-file check: even a planted
    symlink (possible only without bubblewrap, where nothing is contained anyway) is never written through."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        head = (f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {entry} isolation={isolation} exit={rc}"
                + (f" ({log.dropped} earlier bytes dropped)" if log.dropped else "") + " ====\n")
        os.write(fd, head.encode() + bytes(log.buf) + b"\n")
    except OSError:
        pass
    finally:
        os.close(fd)


def wait_exit(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for the child's exit; False on timeout. A pidfd wakes us at the exit itself (Popen.wait(timeout) polls
    with sleeps of up to 50 ms, a fifth of a no-op job's whole cost)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)
    if not ready:
        return False
    proc.wait()
    return True
