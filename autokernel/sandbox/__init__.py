"""Run untrusted candidate code in an isolated process and bring back what the trusted harness computed.

CONTRACT (other packages code against this; the implementation may grow, the signature stays):

    run(entry, payload, job_dir, limits) -> SandboxResult

- `entry` is "module:function" of TRUSTED code (e.g. "autokernel.gate.child:numeric"). In the child process the
  function is called as fn(payload: dict, job_dir: Path) -> dict (JSON-able). It may import candidate files named
  in the payload and write tensors with torch.save into job_dir; the parent reads them back with
  torch.load(weights_only=True).
- `job_dir` (sandbox/<run>/<candidate>/...) is the only writable place besides a private /tmp.
- Isolation: bubblewrap when present (no network namespace, read-only system + project, env scrubbed to an
  allowlist, rlimits, wall-clock timeout killing the process group); otherwise a plain subprocess with the same
  limits and a loud warning; limits.isolation == "required" refuses without bubblewrap.
- Failures are values, never exceptions: SandboxResult.ok False with reason one of
  sandbox.timeout | sandbox.oom | sandbox.crash | sandbox.error (entry raised: detail = last traceback line) |
  sandbox.no_isolation.
"""
from __future__ import annotations

import hmac
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from autokernel.sandbox import bwrap
from autokernel.sandbox.limits import Cgroup, preexec, process_limit

if TYPE_CHECKING:  # the harness imports this package: keep pydantic out of its start-up
    from autokernel.policy import Sandbox

REASONS = ("sandbox.timeout", "sandbox.oom", "sandbox.crash", "sandbox.error", "sandbox.no_isolation")
LOG_NAME = "sandbox.log"  # the child's stdout and stderr (untrusted: the candidate can write it too)
MAX_RESULT_BYTES = 256 << 20
_warned = False


@dataclass
class SandboxResult:
    ok: bool
    reason: str | None  # one of REASONS when not ok
    detail: str  # one line for people and for the agent
    data: dict = field(default_factory=dict)  # what the entry returned (only when ok)
    job_dir: Path = Path(".")
    wall_s: float = 0.0
    isolation: str = ""  # "bwrap" or "subprocess", "+" how processes are limited: cgroup | nproc | none


def _warn(why: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        bar = "!" * 100
        sys.stderr.write(f"{bar}\nWARNING: candidate code runs WITHOUT isolation ({why}).\n"
                         "It can read your files and network and see other processes. Install bubblewrap "
                         "(apt-get install bubblewrap), or set sandbox.isolation: required in policies.yaml to "
                         f"refuse.\n{bar}\n")


def _signal_of(rc: int, isolated: bool) -> int | None:
    if rc < 0:
        return -rc
    if isolated and rc > 128:  # bwrap reports its child's death by signal N as exit status 128 + N
        return rc - 128
    return None


def _log_tail(job_dir: Path, n: int = 8192) -> list[str]:
    try:
        with open(job_dir / LOG_NAME, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []


def _crash_detail(sig: int, job_dir: Path) -> str:
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    lines = _log_tail(job_dir)
    fatal = next((ln for ln in reversed(lines) if ln.startswith("Fatal Python error")), "")
    where = ""
    if fatal:  # faulthandler prints the innermost frame first, after a "Current thread" header
        after = lines[len(lines) - 1 - lines[::-1].index(fatal):]
        where = next((ln for ln in after if ln.startswith("File ")), "")
    return "; ".join(x for x in (f"killed by {name}", fatal, where) if x)


def _parse(raw: bytes, nonce: bytes) -> tuple[dict | None, str]:
    """The harness's frame, or (None, why not). Anything but exactly one well-formed frame is tampering."""
    if not raw:
        return None, ""
    head, sep, body = raw.partition(b"\n")
    if not sep or not hmac.compare_digest(head, nonce):
        return None, "result channel tampered: data that is not the harness's frame"
    try:
        frame = json.loads(body)
    except ValueError:
        return None, "result channel tampered: more than one frame, or not JSON"
    if not isinstance(frame, dict) or "ok" not in frame:
        return None, "result channel tampered: malformed frame"
    return frame, ""


def run(entry: str, payload: dict, job_dir: Path, limits: Sandbox, *, pythonpath: Sequence[Path] = (),
        ro_paths: Sequence[Path] = (), rw_paths: Sequence[Path] = (),
        env: dict[str, str] | None = None) -> SandboxResult:
    """Run TRUSTED `entry` ("module:function") on `payload` in a fresh sandboxed process; see the module docstring.

    Keyword arguments (all optional): `pythonpath` directories to import from (bound read-only), `ro_paths` more
    read-only paths, `rw_paths` more writable paths (a slot's Triton cache), `env` overrides of the allowlisted
    environment (a slot's CUDA_VISIBLE_DEVICES, TRITON_CACHE_DIR, OMP_NUM_THREADS).
    """
    job_dir = Path(job_dir).resolve()
    job_dir.mkdir(parents=True, exist_ok=True)
    pythonpath = [Path(p).resolve() for p in pythonpath]
    why = "sandbox.isolation is 'none'" if limits.isolation == "none" else bwrap.usable()
    if why and limits.isolation == "required":
        return SandboxResult(False, "sandbox.no_isolation", f"{why}; policies.yaml sandbox.isolation is 'required' "
                             "(install bubblewrap, or set it to 'auto')", job_dir=job_dir, isolation="none")
    isolated = why is None
    if not isolated:
        _warn(why)
    gpu = bool(bwrap.gpu_nodes())
    child_env = bwrap.env(job_dir, pythonpath, env)
    cmd = _harness_cmd([bwrap.PROJECT, *pythonpath])
    cgroup = Cgroup.create(limits.max_processes, limits.memory_mb << 20)
    isolation = ("bwrap" if isolated else "subprocess") + "+" + process_limit(cgroup)
    rfd, wfd = os.pipe()
    nonce = secrets.token_hex(16).encode()
    t0 = time.perf_counter()
    try:
        if isolated:
            cmd = bwrap.argv(job_dir, [*pythonpath, *map(Path, ro_paths)], list(map(Path, rw_paths)), gpu) + cmd
        with open(job_dir / LOG_NAME, "ab") as log:
            try:
                proc = subprocess.Popen(cmd + [str(wfd)], stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                        pass_fds=(wfd,), env=child_env, cwd=job_dir, start_new_session=True,
                                        preexec_fn=preexec(limits, cgroup, rlimit_as=not gpu))
            except (OSError, subprocess.SubprocessError) as e:
                return SandboxResult(False, "sandbox.error", f"could not start the sandbox: {e}", job_dir=job_dir,
                                     isolation=isolation)
        os.close(wfd)
        wfd = -1
        chunks: list[bytes] = []
        reader = threading.Thread(target=_drain, args=(rfd, chunks), daemon=True)
        reader.start()
        msg = json.dumps({"nonce": nonce.decode(), "entry": entry, "payload": payload, "job_dir": str(job_dir)})
        threading.Thread(target=_feed, args=(proc, msg.encode()), daemon=True).start()
        timed_out = not _wait(proc, limits.timeout_s)
        if timed_out:
            _kill(proc, cgroup)
            proc.wait()
        if cgroup is not None:
            cgroup.kill()  # stragglers that left the process group (setsid) die with the job
        reader.join(timeout=5)
        wall_s = time.perf_counter() - t0
        frame, tampered = _parse(b"".join(chunks), nonce)
        oom = cgroup is not None and cgroup.oom_killed()
    finally:
        for fd in (rfd, wfd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        if cgroup is not None:
            cgroup.remove()

    def res(ok: bool, reason: str | None, detail: str, data: dict | None = None) -> SandboxResult:
        return SandboxResult(ok, reason, detail, data or {}, job_dir, wall_s, isolation)

    if timed_out:
        return res(False, "sandbox.timeout", f"no result within {limits.timeout_s:g} s; the job was killed")
    if tampered:
        return res(False, "sandbox.error", tampered)
    if frame is not None:
        if frame["ok"]:
            return res(True, None, "", frame.get("data") or {})
        reason, detail = frame.get("reason", "sandbox.error"), str(frame.get("detail", ""))
        if reason == "sandbox.oom":
            detail += f" (limit {limits.memory_mb} MB)"
        return res(False, reason if reason in REASONS else "sandbox.error", detail)
    sig = _signal_of(proc.returncode, isolated)
    if oom:
        return res(False, "sandbox.oom", f"killed by the kernel at the memory limit ({limits.memory_mb} MB)")
    if sig == signal.SIGXCPU:
        return res(False, "sandbox.timeout", f"CPU-time limit ({limits.cpu_s} s) reached")
    if sig is not None:
        return res(False, "sandbox.crash", _crash_detail(sig, job_dir))
    tail = _log_tail(job_dir)
    return res(False, "sandbox.error", f"the harness exited with status {proc.returncode} and no result"
               + (f": {tail[-1][:300]}" if tail else ""))


def _drain(fd: int, chunks: list[bytes]) -> None:
    """Read the channel to EOF; past MAX_RESULT_BYTES keep reading (so the writer never blocks) but keep nothing."""
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
            chunks[:] = [b"oversized result"]
        else:
            chunks.append(b)


def _harness_cmd(paths: list[Path]) -> list[str]:
    """`python -I` runs the harness file itself: no PYTHON* variables, and neither the working directory (the
    writable job_dir, where an earlier candidate could have left a json.py) nor user site-packages on sys.path; and
    not `-m`, which would import this package (pydantic and all) into every job's start-up."""
    boot = (f"import runpy, sys; sys.path[:0] = {[str(p) for p in paths]!r}; "
            f"runpy.run_path({str(Path(__file__).with_name('child.py'))!r}, run_name='__main__')")
    return [sys.executable, "-I", "-c", boot]


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
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


def _feed(proc: subprocess.Popen, msg: bytes) -> None:
    try:
        proc.stdin.write(msg)
        proc.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


def _kill(proc: subprocess.Popen, cgroup: Cgroup | None) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if cgroup is not None:
        cgroup.kill()


from autokernel.sandbox.slots import default_slots, run_many  # noqa: E402  (re-exported: the parallel helper)

__all__ = ["REASONS", "SandboxResult", "default_slots", "run", "run_many"]
