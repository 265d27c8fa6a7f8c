"""One sandboxed job, start to verdict: plan its isolation (bubblewrap, cgroup, seccomp) or refuse, start the harness
(autokernel/sandbox/child.py) with the payload, supervise it to its end or its timeout, and judge how it ended. The
contract, the rules that keep the parent safe from what it runs, and the public names: autokernel/sandbox/__init__.py.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from autokernel.paths import INSTALLED, user_config
from autokernel.sandbox import bwrap, seccomp
from autokernel.sandbox.channel import LogTail, drain, parse_frame, wait_exit, write_log
from autokernel.sandbox.limits import MB, Cgroup, preexec, process_limit
from autokernel.sandbox.orphans import sweep_once
from autokernel.sandbox.slots import pinned_env

if TYPE_CHECKING:  # the harness imports this package: keep pydantic out of its start-up
    from autokernel.policy import Sandbox

REASONS = ("sandbox.timeout", "sandbox.oom", "sandbox.crash", "sandbox.error", "sandbox.no_isolation")
LOG_NAME = "sandbox.log"  # the child's stdout and stderr, written by the parent into job_dir
FULL = ("bwrap", "cgroup", "seccomp")
_warned: set[str] = set()


@dataclass
class SandboxResult:
    ok: bool
    reason: str | None  # one of REASONS when not ok
    detail: str  # one line for people and for the agent
    data: dict = field(default_factory=dict)  # what the entry returned (only when ok)
    job_dir: Path = Path(".")
    wall_s: float = 0.0
    isolation: str = ""  # "bwrap" or "subprocess", "+" cgroup | nproc | none, "+seccomp" when filtered


@dataclass
class _Plan:
    """How one job is isolated: decided in the parent before anything starts."""
    bwrap: bool
    cgroup: Cgroup | None
    seccomp: bool
    fork: bool  # process creation allowed inside (CUDA compiles; see Sandbox.fork)
    missing: list[str]

    def label(self) -> str:
        parts = ["bwrap" if self.bwrap else "subprocess", process_limit(self.cgroup)]
        if self.seccomp:
            parts.append("seccomp")
        if self.seccomp and self.fork:
            parts.append("fork")
        return "+".join(parts)


def _allow_fork(limits: Sandbox, gpu: bool) -> bool:
    """Sandbox.fork: 'auto' allows process creation only where NVIDIA devices are (Triton runs ptxas to compile)."""
    return limits.fork == "allow" or (limits.fork == "auto" and gpu)


def _plan(limits: Sandbox, gpu: bool) -> _Plan:
    missing = []
    why = f"sandbox.isolation is 'none' ({_chosen(limits)})" if limits.isolation == "none" else bwrap.usable()
    if why:
        missing.append(why)
    sec_why = None if why else seccomp.unavailable()
    if sec_why:
        missing.append(sec_why)
    cgroup = Cgroup.create(limits.max_processes, limits.memory_mb * MB)
    if cgroup is None:
        missing.append("no cgroup can be created here (run as root or with a delegated cgroup v2 subtree)")
    return _Plan(why is None, cgroup, why is None and sec_why is None, _allow_fork(limits, gpu), missing)


def _chosen(limits: Sandbox) -> str:
    """Who set sandbox.isolation (autokernel.policy.for_checkout records it): the user config, a --policy file (the
    checkout's own, when it lives there), the command line, or the default."""
    return f"set by {limits.origin('isolation')}"


def _warn(missing: list[str], limits: Sandbox) -> None:
    key = "; ".join(missing)
    if key in _warned:
        return
    _warned.add(key)
    bar = "!" * 100
    if limits.isolation == "none":  # chosen, not missing: installing bubblewrap would change nothing
        fix = (f"sandbox.isolation: none was {_chosen(limits)}: remove it there (or set 'required') to isolate "
               "candidate and checkout code again.")
    else:
        fix = ("Install bubblewrap (apt-get install bubblewrap) and libseccomp2, or set sandbox.isolation: required "
               f"in your user config ({user_config() or '$AUTOKERNEL_CONFIG'}) or a --policy file to refuse.")
    sys.stderr.write(f"{bar}\nWARNING: candidate code runs with WEAKER isolation: {key}.\n"
                     f"Without bubblewrap it can read your files, your network and your other processes. {fix}\n"
                     f"{bar}\n")


def preflight(limits: Sandbox, *, untrusted_author: bool) -> str:
    """The isolation string jobs will get here (e.g. "bwrap+cgroup+seccomp"); call it BEFORE profiling.

    Raises UserError (exit 2) when `sandbox.isolation: required` and any of bubblewrap, cgroup limits or seccomp is
    missing, or when the code is untrusted (`untrusted_author`: candidates an LLM agent or nightly writes, and every
    job of a target checkout, whose engine, references and kernels someone else may have written: trust rule 6) and
    isolation is not full, unless the policy opted out explicitly with `sandbox.isolation: none` (then a loud
    warning)."""
    from autokernel.errors import UserError
    plan = _plan(limits, bool(bwrap.gpu_nodes()))
    if plan.cgroup is not None:
        plan.cgroup.remove()
    if not plan.missing:
        return plan.label()
    if limits.isolation == "required":
        raise UserError(f"sandbox.isolation is 'required' ({_chosen(limits)}) but {plan.missing[0]}")
    if untrusted_author and limits.isolation != "none":
        raise UserError(f"refusing to run untrusted code (model-written candidates, a target checkout's engine and "
                        f"kernels) with weak isolation ({plan.label()}): "
                        f"{plan.missing[0]}; fix that, or set sandbox.isolation: none in your user config "
                        f"({user_config() or '$AUTOKERNEL_CONFIG'}) or a --policy file to accept it (a checkout's "
                        "policies.yaml cannot)")
    _warn(plan.missing, limits)
    return plan.label()


def _write_inputs(d: Path, inputs: Mapping[str, Any]) -> None:
    for name, value in inputs.items():
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"sandbox input name {name!r} is not a plain file name")
        if isinstance(value, (bytes, bytearray)):
            (d / name).write_bytes(value)
        else:
            import torch
            torch.save(value, d / name)


def entry_name(fn: Callable) -> str:
    """The child's name of a trusted entry function ("module:function"): callers pass the function itself, so a
    renamed or moved entry is an import error in the parent, not a failed job."""
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"a sandbox entry is a function, not {type(fn).__name__}")
    if fn.__module__ == "__main__" or "." in fn.__qualname__:
        raise ValueError(f"{fn.__qualname__}: a sandbox entry is a module-level function of an importable module")
    return f"{fn.__module__}:{fn.__qualname__}"


def run(entry: Callable, payload: Mapping[str, Any], job_dir: Path, limits: Sandbox, *,
        inputs: Mapping[str, Any] | None = None, pythonpath: Sequence[Path] = (), ro_paths: Sequence[Path] = (),
        env: dict[str, str] | None = None) -> SandboxResult:
    """Run TRUSTED `entry` (a module-level function) on `payload` in a fresh sandboxed process (module docstring).

    Keyword arguments (all optional): `inputs` files for the read-only input directory, `pythonpath` directories to
    import from (bound read-only), `ro_paths` more read-only paths (trusted ones only: a model file, a checkout's
    kernels), `env` overrides of the allowlisted environment (a slot's CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS).
    A thread pinned to a slot (slots.pinned: a whole gate on one slot, autokernel/agent/workers.py) gets that slot's
    env under `env`.
    """
    name = entry_name(entry)
    env = {**pinned_env(), **(env or {})}
    job_dir = Path(job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    gpu = bool(bwrap.gpu_nodes())
    plan = _plan(limits, gpu)
    if plan.missing and limits.isolation == "required":
        if plan.cgroup is not None:
            plan.cgroup.remove()
        return SandboxResult(False, "sandbox.no_isolation", f"{plan.missing[0]}; policies.yaml sandbox.isolation is "
                             "'required' (install what is missing, or set it to 'auto')", job_dir=job_dir,
                             isolation=plan.label())
    if plan.missing:
        _warn(plan.missing, limits)
    tmp = [Path(tempfile.gettempdir())]  # what killed autokernel processes left there (autokernel.sandbox.orphans)
    sweep_once("autokernel-in", tmp)
    sweep_once("autokernel-job", tmp)
    in_dir = Path(tempfile.mkdtemp(prefix=f"autokernel-in-{os.getpid()}-"))
    scratch = None if plan.bwrap else Path(tempfile.mkdtemp(prefix=f"autokernel-job-{os.getpid()}-"))
    try:
        _write_inputs(in_dir, inputs or {})
        return _execute(name, payload, job_dir, limits, plan, in_dir, scratch,
                        [Path(p).resolve() for p in pythonpath], [Path(p) for p in ro_paths], env, gpu)
    finally:
        for d in (in_dir, scratch):  # parent-created paths; rmtree never follows a symlink inside them
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)
        if plan.cgroup is not None:
            plan.cgroup.remove()


def _command(plan: _Plan, in_dir: Path, pythonpath: list[Path], ro_paths: list[Path], gpu: bool,
             limits: Sandbox, seccomp_fd: int | None) -> list[str]:
    cmd = _harness_cmd([INSTALLED, *pythonpath])
    if not plan.bwrap:
        return cmd
    disk = limits.disk_mb * MB
    return bwrap.argv(in_dir, [*pythonpath, *ro_paths], gpu, disk, seccomp_fd) + cmd


_LIVE: dict[int, tuple[subprocess.Popen, Cgroup | None]] = {}  # the jobs running now, by pid (kill_all)
_LIVE_LOCK = threading.Lock()


def kill_all() -> int:
    """Kill every job this process has running (its process group and cgroup, SIGKILL: a job stopped by the bench's
    lockstep dies too); the number killed. For the CLI's SIGTERM/SIGINT handling: no job outlives autokernel."""
    with _LIVE_LOCK:
        live = list(_LIVE.values())
    for proc, cgroup in live:
        _kill(proc, cgroup)
    return len(live)


def _execute(entry: str, payload: Mapping[str, Any], job_dir: Path, limits: Sandbox, plan: _Plan, in_dir: Path,
             scratch: Path | None, pythonpath: list[Path], ro_paths: list[Path], env: dict[str, str],
             gpu: bool) -> SandboxResult:
    """Start the job, feed it, wait for it (killed at the timeout) and judge how it ended (module docstring)."""
    scratch_path = bwrap.SCRATCH if plan.bwrap else str(scratch)
    child_env = bwrap.env(scratch_path, pythonpath, env)
    seccomp_fd = seccomp.program_fd(plan.fork) if plan.seccomp else None
    cmd = _command(plan, in_dir, pythonpath, ro_paths, gpu, limits, seccomp_fd)
    rfd, wfd = os.pipe()
    nonce = secrets.token_hex(16).encode()
    keep = tuple(fd for fd in (wfd, seccomp_fd) if fd is not None)
    t0 = time.perf_counter()
    try:
        try:
            proc = subprocess.Popen(cmd + [str(wfd)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, pass_fds=keep, env=child_env,
                                    cwd="/" if plan.bwrap else scratch_path, start_new_session=True,
                                    preexec_fn=preexec(limits, plan.cgroup, rlimit_as=not gpu))
        except (OSError, subprocess.SubprocessError) as e:
            return SandboxResult(False, "sandbox.error", f"could not start the sandbox: {e}", job_dir=job_dir,
                                 isolation=plan.label())
        finally:
            _close(*keep)  # the child has its own copies of the result pipe's write end and the filter
        with _LIVE_LOCK:
            _LIVE[proc.pid] = (proc, plan.cgroup)
        try:
            msg = {"nonce": nonce.decode(), "entry": entry, "payload": payload, "inputs": str(in_dir)}
            timed_out, chunks, log = _supervise(proc, rfd, msg, limits, plan.cgroup)
        finally:
            if proc.poll() is None:  # an exception (KeyboardInterrupt, SystemExit) left it running: it dies with us
                _kill(proc, plan.cgroup)
            with _LIVE_LOCK:
                _LIVE.pop(proc.pid, None)
        wall_s = time.perf_counter() - t0
        oom = plan.cgroup is not None and plan.cgroup.oom_killed()
    finally:
        _close(rfd)
    write_log(job_dir / LOG_NAME, entry, plan.label(), proc.returncode, log)
    res = _Outcome(job_dir, wall_s, plan, limits, log)
    if timed_out:
        return res(False, "sandbox.timeout", f"no result within {limits.timeout_s:g} s; the job was killed")
    frame, why = parse_frame(chunks, nonce)
    if why:
        return res(False, "sandbox.error", why)
    if frame is not None:
        return res.from_frame(frame)
    return res.from_exit(proc.returncode, oom)


def _supervise(proc: subprocess.Popen, rfd: int, msg: dict, limits: Sandbox,
               cgroup: Cgroup | None) -> tuple[bool, list[bytes], LogTail]:
    """Drain the result pipe and the job's output, feed it its message, and wait for it: killed (process group and
    cgroup) at the timeout; stragglers that left the process group die with the job. Returns (timed out, the result
    pipe's chunks, the output's tail)."""
    log = LogTail()
    chunks: list[bytes] = []
    readers = [threading.Thread(target=drain, args=(rfd, chunks), daemon=True),
               threading.Thread(target=log.drain, args=(proc.stdout,), daemon=True)]
    for t in readers:
        t.start()
    threading.Thread(target=_feed, args=(proc, msg), daemon=True).start()
    timed_out = not wait_exit(proc, limits.timeout_s)
    if timed_out:
        _kill(proc, cgroup)
        proc.wait()
    if cgroup is not None:
        cgroup.kill()
    for t in readers:
        t.join(timeout=5)
    return timed_out, chunks, log


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class _Outcome:
    """Builds the SandboxResult of a finished job."""

    def __init__(self, job_dir: Path, wall_s: float, plan: _Plan, limits: Sandbox, log: LogTail):
        self.job_dir, self.wall_s, self.plan, self.limits, self.log = job_dir, wall_s, plan, limits, log

    def __call__(self, ok: bool, reason: str | None, detail: str, data: dict | None = None) -> SandboxResult:
        return SandboxResult(ok, reason, detail, data or {}, self.job_dir, self.wall_s, self.plan.label())

    def from_frame(self, frame: dict) -> SandboxResult:
        if frame["ok"] is True:
            return self(True, None, "", frame.get("data") if isinstance(frame.get("data"), dict) else {})
        reason, detail = frame.get("reason"), frame.get("detail")
        reason = reason if reason in REASONS else "sandbox.error"
        detail = detail if isinstance(detail, str) else ""
        if reason == "sandbox.oom":
            detail += f" (limit {self.limits.memory_mb} MB)"
        return self(False, reason, detail[:2000])

    def from_exit(self, rc: int, oom: bool) -> SandboxResult:
        sig = _signal_of(rc, self.plan.bwrap)
        if oom:
            return self(False, "sandbox.oom", f"killed by the kernel at the memory limit ({self.limits.memory_mb} MB)")
        if sig == signal.SIGXCPU:
            return self(False, "sandbox.timeout", f"CPU-time limit ({self.limits.cpu_s} s) reached")
        if sig is not None:
            return self(False, "sandbox.crash", _crash_detail(sig, self.log.lines()))
        tail = self.log.lines()
        return self(False, "sandbox.error", f"the harness exited with status {rc} and no result"
                    + (f": {tail[-1][:300]}" if tail else ""))


def _signal_of(rc: int, isolated: bool) -> int | None:
    if rc < 0:
        return -rc
    if isolated and rc > 128:  # bwrap reports its child's death by signal N as exit status 128 + N
        return rc - 128
    return None


def _crash_detail(sig: int, lines: list[str]) -> str:
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    fatal = next((ln for ln in reversed(lines) if ln.startswith("Fatal Python error")), "")
    where = ""
    if fatal:  # faulthandler prints the innermost frame first, after a "Current thread" header
        after = lines[len(lines) - 1 - lines[::-1].index(fatal):]
        where = next((ln for ln in after if ln.startswith("File ")), "")
    return "; ".join(x for x in (f"killed by {name}", fatal[:300], where[:300]) if x)


def _harness_cmd(paths: list[Path]) -> list[str]:
    """`python -I -B` runs the harness file itself: no PYTHON* variables (so -B, not PYTHONDONTWRITEBYTECODE, keeps
    __pycache__ out of the project in the fallback), and neither the working directory nor user site-packages on
    sys.path; and not `-m`, which would import this package (pydantic and all) into every job's start-up."""
    boot = (f"import runpy, sys; sys.path[:0] = {[str(p) for p in paths]!r}; "
            f"runpy.run_path({str(Path(__file__).with_name('child.py'))!r}, run_name='__main__')")
    return [sys.executable, "-I", "-B", "-c", boot]


def _feed(proc: subprocess.Popen, msg: dict) -> None:
    import json
    stdin = proc.stdin
    assert stdin is not None  # Popen(stdin=PIPE)
    try:
        stdin.write(json.dumps(msg).encode())
        stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


def _kill(proc: subprocess.Popen, cgroup: Cgroup | None) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if cgroup is not None:
        cgroup.kill()

