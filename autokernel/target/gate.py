"""The gate on a target checkout's op (`autokernel verify --repo CHECKOUT OP CANDIDATE.py`): the same stages and
judges as for autokernel's own kernels, with the op described by the declaration and the live workload
(autokernel/target/contract.py) instead of autokernel/ops/.

1. The workload runs once in the sandbox with the declared launchers recorded (autokernel/target/launches.py): the
   layouts the cases are made in. A declared launcher the workload never calls is an error (exit 2): the gate would
   vouch for calls production never makes, and none that it does.
2. static: the grammar, relative to the incumbent file (gate/static.py, excused): the candidate may keep verbatim
   what the incumbent does (its imports, autograd classes, backward kernels) and nothing new outside the grammar.
3. runtime + numeric: the candidate in its own sandboxed jobs under the checkout's module name, the checkout's
   reference in separate jobs (contract.ReferenceTable), every case judged here; coverage required on what the
   candidate changed (coverage.incumbents).
4. end to end: the engine's next-token distributions with the candidate swapped in, against the incumbent's
   (autokernel/target/e2e.py).
"""
from __future__ import annotations

import hashlib
import secrets
import time
from pathlib import Path

from autokernel import device, paths
from autokernel.errors import UserError
from autokernel.gate import pipeline, static
from autokernel.gate.verdict import StageResult, Verdict
from autokernel.target import contract, discover
from autokernel.target import declaration as decl


def declared_op(root: Path, name: str) -> tuple[decl.Declaration, decl.Op]:
    """The checkout's declaration and its op `name`, ready to gate; UserError naming what to complete."""
    d = decl.load(root)
    if d is None:
        raise UserError(f"{root}: no {decl.NAME}; run `autokernel init --repo {root}` first (docs/targets.md)")
    if d.build is None:
        raise UserError(f"{d.path}: [engine] build is not set (docs/targets.md)")
    op = d.ops.get(name)
    if op is None:
        raise UserError(f"{d.path}: no [ops.{name}]; declared ops: {', '.join(sorted(d.ops)) or 'none'}")
    if op.reference == decl.TODO:
        raise UserError(f"{d.path}: [ops.{name}] reference is still \"TODO\": set it to a torch function with the "
                        f"launcher's signature (docs/targets.md)")
    if op.protected:
        raise UserError(f"{d.path}: [ops.{name}] is protected (protected = true): it is never rewritten")
    return d, op


def record(root: Path, d: decl.Declaration, op: decl.Op, policy, job_dir: Path) -> discover.LauncherCalls:
    """The workload's calls of the op's first declared launcher; UserError when it is never called."""
    found = discover.run(root, d.build, policy, job_dir, {decl.module_of(op.file): (op.launchers, op.file)})
    calls = {c.launcher: c for c in found.launcher_calls if c.file == op.file}
    never = [n for n in op.launchers if n not in calls]
    if never:
        raise UserError(f"{d.path}: [ops.{op.name}] launcher {never[0]} is never called by the engine's workload: "
                        "the gate makes its cases from the calls production makes (fix `launchers`, or make the "
                        "workload call it)")
    return calls[op.launchers[0]]


def from_trace(root: Path, op: decl.Op, trace: Path) -> discover.LauncherCalls:
    """The op's first launcher's records in a trace `autokernel profile --repo` wrote (the workload is not run
    again); checked like a fresh record (discover._launcher_calls: the trace is data from the checkout's job)."""
    from autokernel.target import rank_target
    t = rank_target.load(root, trace)
    entry = (t.get("ops") or {}).get(op.name) or {}
    for raw in entry.get("launcher_calls") or []:
        c = discover._launcher_calls(raw, root)
        if c is not None and c.file == op.file and c.launcher == op.launchers[0]:
            return c
    raise UserError(f"{t['_path']}: no recorded calls of {op.launchers[0]} for op {op.name}: profile again "
                    f"(`autokernel profile --repo {root}`) after declaring it")


def verify(root: Path, name: str, candidate_path: Path, *, policy, seed: int | None = None,
           run_dir: Path | None = None, stages: list | None = None, trace: Path | None = None) -> Verdict:
    """Judge `candidate_path` as a replacement for the op's file in the checkout (module docstring). trace: a
    profile of the target whose launcher records give the cases (default: the workload runs once here)."""
    t0 = time.perf_counter()
    d, op = declared_op(root, name)
    source = Path(candidate_path).read_bytes()
    sha = hashlib.sha256(source).hexdigest()
    seed = secrets.randbits(63) if seed is None else int(seed)
    base = Path(run_dir) if run_dir else paths.user_cache() / "verify" / paths.run_name(name)
    job_dir = base / f"{name}-{sha[:12]}"
    job_dir.mkdir(parents=True, exist_ok=True)
    incumbent = decl.checkout_file(root, root / op.file, f"[ops.{name}] file")
    calls = from_trace(root, op, trace) if trace else record(root, d, op, policy, job_dir / "workload")
    table = contract.ReferenceTable(root, op.reference, job_dir / "reference", policy.sandbox)
    spec = contract.spec(op, calls, table)
    copy = job_dir / incumbent.name  # imported by the jobs as the checkout's module: the file keeps its name
    copy.write_bytes(source)
    results: list[StageResult] = [pipeline._timed(
        lambda: static.check_source(source, calls.launcher, incumbent, policy=policy, relative=True))]
    if results[-1].passed:
        try:
            results += pipeline._sandboxed(spec, copy, job_dir, policy, None, None, None, seed, source, None)
        except contract.ReferenceError as e:
            raise UserError(f"{d.path}: [ops.{name}] {e}") from None
    for stage in ([_e2e] if stages is None else stages):
        if not all(r.passed for r in results):
            break
        results.append(pipeline._timed(lambda st=stage: st(root, d, op, copy, policy)))
    accepted = all(r.passed for r in results)
    v = Verdict(op=name, candidate=str(candidate_path), candidate_sha256=sha,
                verdict="accepted" if accepted else "rejected", stages=results, seed=seed,
                device=dict(device.fingerprint()), elapsed_s=round(time.perf_counter() - t0, 3), run_dir=str(job_dir))
    v.write(job_dir / "verdict.json")
    return v


def _e2e(root: Path, d: decl.Declaration, op: decl.Op, copy: Path, policy) -> StageResult:
    from autokernel.target import e2e
    return e2e.check(root, d, op, copy, policy)
