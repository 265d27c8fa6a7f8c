"""verify(): one candidate through the gate's stages, cheapest first, stopping at the first failure.

static (parse only, in this process) -> runtime + numeric (one sandboxed run of the candidate, judged here) ->
the end-to-end KL stage on the live model (autokernel/gate/e2e.py) -> Verdict, written to <job_dir>/verdict.json.
"""
from __future__ import annotations

import functools
import secrets
import time
from pathlib import Path
from typing import Protocol, Sequence

import torch

from autokernel import device
from autokernel.candidate import Candidate
from autokernel.deadline import Deadline
from autokernel.gate import numeric, static, thresholds
from autokernel.gate.verdict import StageResult, Verdict
from autokernel.ops import get
from autokernel.policy import Policy

MAX_PLAN_CASES = 600  # a thorough plan is ~100 cases (+ at most 48 threshold rows and gate.coverage_cases steered)


class Stage(Protocol):
    """A stage run after static, runtime and numeric have passed, in order (verify's `stages` replaces the default,
    the end-to-end stage alone, in tests). It is given the op, the gate's own copy of the candidate (the bytes that
    were hashed) and the policy; by keyword the target's kernels/ (verify resolves it once), the numeric stage's
    metrics (its per-call times size the stage's time limit) and the gate's deadline."""

    def __call__(self, op: str, candidate: Path, policy: Policy, *, kernels_dir: Path,
                 measured: dict | None = None, deadline: Deadline = Deadline.none()) -> StageResult: ...


def _e2e(op: str, candidate: Path, policy: Policy, *, kernels_dir: Path,
         measured: dict | None = None, deadline: Deadline = Deadline.none()) -> StageResult:
    from autokernel.gate import e2e
    return e2e.stage(op, candidate, policy, kernels_dir=kernels_dir, measured=measured, deadline=deadline)


def _capped(limits, deadline: Deadline):
    """Sandbox limits whose wall clock ends by `deadline`; TimeoutError if it has passed."""
    if deadline.expired():
        raise TimeoutError("the gate's deadline passed before its next sandbox job")
    return limits.model_copy(update={"timeout_s": min(limits.timeout_s, deadline.left())})


def _deadline_cut(results: list[StageResult], deadline: Deadline) -> None:
    """A job that timed out at the deadline ran out of the caller's time, not its own: TimeoutError, not a verdict."""
    if deadline.left() <= 1.0 and any(
            not r.passed and r.reason == "sandbox.timeout" for r in results):
        raise TimeoutError("a gate job was cut at the caller's deadline")


def _timed(fn, *args):
    """fn(*args), each StageResult it returns stamped with the seconds it took (unless it split its own time)."""
    s = time.perf_counter()
    out = fn(*args)
    for r in out if isinstance(out, tuple) else (out,):
        if r is not None and not r.elapsed_s:  # a stage that splits its own time (runtime/numeric) keeps it
            r.elapsed_s = round(time.perf_counter() - s, 3)
    return out


def _sandboxed(spec, copy: Path, job_dir: Path, policy: Policy, shapes, dtypes, dists, seed: int, source: bytes,
               deadline: Deadline) -> list[StageResult]:
    """The runtime and numeric stages: the case plan (traced shapes, the production-range sweep, the thresholds the
    source compares) run in the sandbox and judged here (autokernel/gate/numeric.py)."""
    max_rows = policy.gate.max_rows  # under the CPU interpreter at most max_rows_interpreter (policy.py)
    if not torch.cuda.is_available():
        max_rows = min(max_rows, policy.gate.max_rows_interpreter)
    found = thresholds.extract(source)
    planned = numeric.plan(spec, shapes, dtypes, dists, seed, max_rows, found, policy.gate.max_rows)
    if len(planned) > MAX_PLAN_CASES:  # a backstop: thresholds and steering are capped where they are made
        return [StageResult.fail("numeric", "numeric.budget", f"the plan has {len(planned)} cases, more than a "
                                 f"verdict may run ({MAX_PLAN_CASES}): fewer shapes, or fewer constants compared")]
    cover = numeric.Cover(policy.gate.coverage_cases, max_rows, policy.gate.max_rows, frozenset(found)) \
        if policy.gate.require_coverage else None
    runtime, num = _timed(numeric.run, spec, copy, job_dir, _capped(policy.sandbox, deadline), seed, planned,
                          None, policy.gate.require_bitwise_determinism, cover)
    return [r for r in (runtime, num) if r is not None]


def verify(op: str, candidate_path: str | Path, *, run_dir: str | Path, kernels_dir: str | Path,
           shapes: list[dict] | None = None, seed: int | None = None, policy: Policy | None = None,
           dtypes: list[torch.dtype] | None = None, dists: list[str] | None = None,
           stages: Sequence[Stage] | None = None, time_left_s: float | None = None) -> Verdict:
    """Judge `candidate_path` as a replacement for kernels/<op>.py.

    run_dir: where the job directory <op>-<sha256[:12]> goes (`autokernel verify` passes its layout's
    sandbox/verify-<run_name>: paths.Layout.run_dir; the agent its session's directory). kernels_dir: the target
    checkout's kernels/ (autokernel.paths), whose <op>.py gives the launcher signature and whose other kernels the
    end-to-end engine runs. Both are the caller's: the commands resolve the checkout once, and verify never looks
    one up (a test names the installed project's kernels/ itself).
    shapes: the traced shapes (default: the spec's model shapes); the spec's odd shapes and one larger shape are
    always added. policy: the checkout's (the commands and the agent pass policy.for_checkout's); None: the built-in
    defaults, Policy() (tests). seed: None draws a fresh secret one. dtypes/dists narrow the case grid (tests); the
    default is every dtype of the spec and every distribution. Raises KeyError for an unknown op, OSError for an
    unreadable candidate (the command turns both into exit code 2). time_left_s:
    the seconds left to the caller (an agent session's deadline, autokernel/agent/evaluate.py; None or inf: no
    limit), in seconds because verify may run on another machine (autokernel/cluster.py); each sandbox job then
    runs under the time left at its start, and a job cut by the deadline, or a deadline passed before a job, raises
    TimeoutError (the caller's clock, not a verdict).
    """
    t0 = time.perf_counter()
    deadline = Deadline.after(time_left_s)
    spec = get(op)
    candidate = Candidate.of(op, Path(candidate_path).read_bytes())
    source, sha = candidate.source, candidate.sha256
    seed = secrets.randbits(63) if seed is None else int(seed)
    policy = Policy() if policy is None else policy  # the documented default (docstring)
    job_dir = Path(run_dir) / f"{op}-{sha[:12]}"
    copy = candidate.write(job_dir)  # what the sandbox imports and later stages read: exactly the hashed bytes
    results: list[StageResult] = []
    kernels = Path(kernels_dir)
    results.append(_timed(functools.partial(static.check_source, policy=policy), source, op, kernels / f"{op}.py"))
    if results[-1].passed:
        results += _sandboxed(spec, copy, job_dir, policy, shapes, dtypes, dists, seed, source, deadline)
        _deadline_cut(results, deadline)
    for stage in ((_e2e,) if stages is None else stages):
        if not all(r.passed for r in results):
            break
        _capped(policy.sandbox, deadline)  # TimeoutError when no time is left for it
        measured = next((r.metrics for r in results if r.name == "numeric"), None)
        results.append(_timed(functools.partial(stage, kernels_dir=kernels, measured=measured, deadline=deadline),
                              op, copy, policy))
        _deadline_cut(results, deadline)
    accepted = all(r.passed for r in results)
    v = Verdict(op=op, candidate=str(candidate_path), candidate_sha256=sha,
                verdict="accepted" if accepted else "rejected", stages=results, seed=seed,
                device=dict(device.fingerprint()), elapsed_s=round(time.perf_counter() - t0, 3),
                run_dir=str(job_dir))
    v.write(job_dir / "verdict.json")
    return v
