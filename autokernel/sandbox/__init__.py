"""Run untrusted candidate code in an isolated process and bring back the raw data the trusted harness collected.

CONTRACT (other packages code against this; the implementation may grow, the signature stays):

    run(entry, payload, job_dir, limits, *, inputs={}, pythonpath=(), ro_paths=(), env=None) -> SandboxResult
    preflight(limits, *, untrusted_author) -> isolation string, or UserError (exit 2)

- `entry` is a TRUSTED module-level function of an importable module (e.g. autokernel.gate.child.numeric), named
  to the child as "module:function" (entry_name). In the child process the
  function is called as fn(payload: dict, inputs: Path) -> dict. `inputs` is a fresh, READ-ONLY directory holding
  the `inputs` the parent passed (name -> bytes, written as they are, or any other object, written with torch.save);
  the entry imports candidate files from there. The returned dict may hold tensors, numbers, strings, bytes and
  containers of them; it travels back through a pipe (torch.save in the child, torch.load(weights_only=True) under
  a size cap in the parent) and arrives as SandboxResult.data. Nothing else comes back: no file the job wrote is
  ever read by the parent.
- `job_dir` is the PARENT's evidence directory for this job: under bubblewrap the candidate never has access to it.
  The parent writes the child's stdout/stderr there (sandbox.log, drained from a pipe with a cap, opened with
  O_NOFOLLOW), and the callers write their verdicts and raw figures there. It may be reused by several run() calls
  (the chunks of one gate stage): being parent-only, it is never a channel between them.

The rules that make the parent safe from what it runs (the threat model is docs/design.md's: a candidate that can
read every Python object of its process and knows this code):
1. Nothing the candidate can write is ever read, followed or bound again by the parent. Under bubblewrap the only
   writable place is a size-limited tmpfs on /tmp created inside the sandbox (policy `sandbox.disk_mb`; the job's
   scratch directory, HOME, TMPDIR and Triton cache live there), so it vanishes with the job: a disk quota and
   cleanup by construction. Each run() call gets fresh, parent-created directories; none is reused across calls and
   no cache is shared between jobs (a shared writable Triton cache would let one job poison the next one's kernels).
   Without bubblewrap the job gets a fresh temporary scratch directory that the parent deletes afterwards
   (shutil.rmtree, which does not follow symlinks) and never reads.
2. The result channel cannot be forged into a verdict. The frame carries raw data only, and every judgement
   (comparisons against references, speedups, shapes, reasons) is made in the parent from data it generated itself:
   callers must never take a shape, a reason or a detail text from the child as truth, and must type-check every
   value before use. The nonce and the early binding of the harness's writer (autokernel/sandbox/child.py) stop
   forging by output and by monkeypatching; they do not stop a candidate that introspects the harness's frame
   (the nonce and FD are main()'s locals): the static grammar (autokernel/gate/static.py) and parent-side
   judgement are what make such a forgery useless. Its limit, stated plainly: the parent judges WHAT came back,
   not HOW it was computed, so the harness's observations of how (its own Triton kernel launched, no torch
   compute) are only as good as the static grammar's ban on introspection; a wrong result cannot be forged into a
   pass (tests/sandbox/test_hostile.py), a right result computed a forbidden way could be.
3. The kernel is narrowed by a seccomp filter (autokernel/sandbox/seccomp.py): no ptrace, no signals to anything
   but the harness itself, no process creation on CPU, no namespaces, mounts, keyrings, bpf, io_uring, non-UNIX
   sockets. On CUDA (NVIDIA device nodes present) process creation is allowed by default (`sandbox.fork`, reported
   as "+fork"): Triton compiles with a ptxas subprocess inside the job, and since no cache outlives a job there is
   no compiled-once cache to hand over. The pid namespace, the pids cgroup and the signal rules still hold there.
4. Isolation is reported (SandboxResult.isolation, e.g. "bwrap+cgroup+seccomp"; "subprocess+nproc" without
   bubblewrap) and never silently weaker: `sandbox.isolation: required` needs bubblewrap AND cgroup limits AND
   seccomp; `auto` falls back with a loud warning; preflight() refuses (exit 2) candidates from an untrusted author
   (an LLM agent, nightly) without full isolation unless the policy says `isolation: none` explicitly.
- Failures are values, never exceptions: SandboxResult.ok False with reason one of
  sandbox.timeout | sandbox.oom | sandbox.crash | sandbox.error (entry raised: detail = last traceback line) |
  sandbox.no_isolation.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from autokernel.sandbox import slots as _slots
from autokernel.sandbox.runner import LOG_NAME, REASONS, SandboxResult, entry_name, kill_all, preflight, run
from autokernel.sandbox.slots import default_slots, pinned_env

if TYPE_CHECKING:
    from autokernel.policy import Sandbox

__all__ = ["LOG_NAME", "REASONS", "SandboxResult", "default_slots", "entry_name", "kill_all", "pinned_env", "preflight",
           "run", "run_many"]


def run_many(jobs: Sequence[tuple], limits: Sandbox, *, slots: Sequence[_slots.Slot] | None = None,
             pythonpath: Sequence[Path] = ()) -> list:
    """Run (entry, payload, job_dir[, inputs]) jobs on free slots, at most one job per slot at a time; results in
    job order (autokernel/sandbox/slots.py). Each job calls this package's `run` as looked up now, so a test double
    patched onto autokernel.sandbox reaches the pool too."""
    return _slots.run_many(jobs, limits, run=run, slots=slots, pythonpath=pythonpath)
