"""The gate on a target checkout's op (`autokernel verify --repo CHECKOUT OP CANDIDATE.py`): the same stages and
judges as for autokernel's own kernels, with the op described by the declaration and the live workload
(autokernel/target/contract.py) instead of autokernel/ops/.

1. The workload runs once in the sandbox with the declared launchers recorded (autokernel/target/launches.py): the
   layouts the cases are made in. A declared launcher the workload never calls is an error (exit 2): the gate would
   vouch for calls production never makes, and none that it does. So is a launch the gate would not reach (a
   function of the file that launches a kernel but is not declared, or a kernel of the file launched from outside
   it): a candidate replaces the whole file, and stages 2-3 run once per declared launcher.
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
from functools import partial
from pathlib import Path

from autokernel import device, paths, sandbox
from autokernel.deadline import Deadline
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
    if op.incomplete:
        which = f" of {op.incomplete[0]}" if len(op.launchers) > 1 else ""
        raise UserError(f"{d.path}: [ops.{name}] reference{which} is still \"TODO\": set it to a torch function with "
                        f"the launcher's signature (docs/targets.md)")
    if op.protected:
        raise UserError(f"{d.path}: [ops.{name}] is protected (protected = true): it is never rewritten")
    return d, op


def record(root: Path, d: decl.Declaration, op: decl.Op, policy, job_dir: Path) -> dict[str, discover.LauncherCalls]:
    """The workload's calls of each of the op's declared launchers; UserError when one is never called, or when the
    workload launches a kernel through the op's file by a way the gate does not call (unchecked)."""
    assert d.build is not None  # declared_op() refused a declaration without [engine] build
    found = discover.run(root, d.build, policy, job_dir, {decl.module_of(op.file): (op.launchers, op.file)})
    calls = {c.launcher: c for c in found.launcher_calls if c.file == op.file}
    never = [n for n in op.launchers if n not in calls]
    if never:
        raise UserError(f"{d.path}: [ops.{op.name}] launcher {never[0]} is never called by the engine's workload: "
                        "the gate makes its cases from the calls production makes (fix `launchers`, or make the "
                        "workload call it)")
    sites: list[tuple[str, str | None, tuple[str, ...] | None, str | None]] = [
        (x.kernel, x.kernel_file if x.in_checkout else None, (x.site.file, x.site.function) if x.site else None, x.via)
        for x in found.launches]
    _unchecked(d, op, sites)
    return {n: calls[n] for n in op.launchers}


def _unchecked(d: decl.Declaration, op: decl.Op,
               sites: list[tuple[str, str | None, tuple[str, ...] | None, str | None]]) -> None:
    """UserError for a launch the gate would not reach: a candidate replaces the whole file, so each launch of a
    kernel of the file, and each launch from a function of the file, must happen inside one of the declared
    launchers the gate calls (else what the candidate does there goes unchecked). sites: (kernel, its checkout file
    or None, (launch site file, function) or None, "file:launcher" of the declared launcher the launch ran inside or
    None) per group of the workload's launches."""
    declared = {f"{op.file}:{n}" for n in op.launchers}
    for kernel, kfile, site, via in sites:
        if kfile != op.file and (site is None or site[0] != op.file):
            continue
        if via in declared:  # inside a launcher the gate calls (a helper of the file it delegates to, say)
            continue
        if site is None or site[0] != op.file:
            where = f"{site[0]}:{site[1]}" if site else "outside the checkout's code"
            raise UserError(f"{d.path}: [ops.{op.name}] the workload launches {kernel} of {op.file} from {where}, "
                            "not through a launcher in the file: the gate reaches the file's kernels only through its "
                            "launchers, so a candidate's version of it would go unchecked; launch it from a function "
                            f"of {op.file} and declare that, or mark the op protected = true (docs/targets.md)")
        if site[1] not in op.launchers:
            raise UserError(f"{d.path}: [ops.{op.name}] launchers: the workload launches {kernel} from {site[1]} in "
                            f"{op.file}, which launchers does not list; a candidate replaces the whole file, so the "
                            f"gate must check every function of it that launches a kernel: add {site[1]} to launchers, "
                            "with its reference (docs/targets.md)")


def from_trace(root: Path, d: decl.Declaration, op: decl.Op, trace: Path) -> dict[str, discover.LauncherCalls]:
    """Each declared launcher's records in a trace `autokernel profile --repo` wrote (the workload is not run
    again); checked like a fresh record (discover._launcher_calls: the trace is data from the checkout's job), the
    sites too (_unchecked)."""
    from autokernel.target import rank_target
    t = rank_target.load(root, trace)
    entry = (t.get("ops") or {}).get(op.name) or {}
    found: dict[str, discover.LauncherCalls] = {}
    for raw in entry.get("launcher_calls") or []:
        c = discover._launcher_calls(raw, root)
        if c is not None and c.file == op.file and c.launcher in op.launchers:
            found.setdefault(c.launcher, c)
    missing = [n for n in op.launchers if n not in found]
    if missing:
        raise UserError(f"{t['_path']}: no recorded calls of {missing[0]} for op {op.name}: profile again "
                        f"(`autokernel profile --repo {root}`) after declaring it")
    sites: list[tuple[str, str | None, tuple[str, ...] | None, str | None]] = [
        (str(k), op.file, tuple(str(k).rsplit(":", 1)) if ":" in str(k) else None, via)
        for k, v in (entry.get("sites") or {}).items() for via in _vias(v)]
    sites += [(str(x.get("kernel")), x.get("kernel_file") if x.get("in_checkout") else None,
               tuple(str(x["site"]).rsplit(":", 1)) if x.get("site") else None, via)
              for x in t.get("not_declared") or [] if isinstance(x, dict) for via in _vias(x)]
    _unchecked(d, op, sites)
    return {n: found[n] for n in op.launchers}


def _vias(entry) -> list:
    """The declared launchers a trace entry's launches ran inside (`via`), None for those outside any (and for a
    trace without the field: the strict rule)."""
    v = entry.get("via") if isinstance(entry, dict) else None
    return [x if isinstance(x, str) else None for x in v] if isinstance(v, list) and v else [None]


def specs(root: Path, op: decl.Op, calls: dict[str, discover.LauncherCalls], job_dir: Path, policy,
          seed: int = 0) -> list:
    """One OpSpec per declared launcher (contract.spec), each judged against its own reference, whose jobs run in
    job_dir/reference[-<launcher>]; seed: the verdict's (the declared sizes' secret value)."""
    out = []
    for i, (name, c) in enumerate(calls.items()):
        where = job_dir / ("reference" if i == 0 else f"reference-{name}")
        out.append(contract.spec(op, c, contract.ReferenceTable(root, op.references[name], where, policy.sandbox),
                                 seed))
    return out


def verify(root: Path, name: str, candidate_path: Path, *, policy, seed: int | None = None,
           run_dir: Path | None = None, stages: list | None = None, trace: Path | None = None) -> Verdict:
    """Judge `candidate_path` as a replacement for the op's file in the checkout (module docstring). trace: a
    profile of the target whose launcher records give the cases (default: the workload runs once here)."""
    t0 = time.perf_counter()
    d, op = declared_op(root, name)
    sandbox.preflight(policy.sandbox, untrusted_author=True)  # the checkout's engine and references: trust rule 6
    source = Path(candidate_path).read_bytes()
    sha = hashlib.sha256(source).hexdigest()
    seed = secrets.randbits(63) if seed is None else int(seed)
    base = Path(run_dir) if run_dir else paths.user_cache() / "verify" / paths.run_name(name)
    job_dir = base / f"{name}-{sha[:12]}"
    job_dir.mkdir(parents=True, exist_ok=True)
    incumbent = decl.checkout_file(root, root / op.file, f"[ops.{name}] file")
    calls = from_trace(root, d, op, trace) if trace else record(root, d, op, policy, job_dir / "workload")
    copy = job_dir / incumbent.name  # imported by the jobs as the checkout's module: the file keeps its name
    copy.write_bytes(source)
    try:
        specs_ = specs(root, op, calls, job_dir, policy, seed)
    except contract.ReferenceError as e:
        raise UserError(f"{d.path}: [ops.{name}] {e}") from None
    results = _launchers(d, op, specs_, source, incumbent, copy, job_dir, policy, seed)
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


def _launchers(d: decl.Declaration, op: decl.Op, specs_: list, source: bytes, incumbent: Path, copy: Path,
               job_dir: Path, policy, seed: int) -> list[StageResult]:
    """The static, runtime and numeric stages for each declared launcher in turn (the first that fails ends the
    verdict): a candidate replaces the whole file, so every launcher the engine calls is judged. With several
    launchers each stage's line names its launcher, and each launcher's jobs run in a directory of their own."""
    results: list[StageResult] = []
    for i, spec in enumerate(specs_):
        launcher = spec.extra["target"]["launcher"]
        mine = [pipeline._timed(partial(static.check_source, source, launcher, incumbent, policy=policy,
                                        relative=True))]
        if mine[-1].passed:
            jobs = job_dir if i == 0 else job_dir / f"launcher-{launcher}"
            jobs.mkdir(parents=True, exist_ok=True)
            try:
                mine += pipeline._sandboxed(spec, copy, jobs, policy, None, None, None, seed, source, Deadline.none())
            except contract.ReferenceError as e:
                raise UserError(f"{d.path}: [ops.{op.name}] {e}") from None
            _held_sizes(op, mine, contract.held_ints(op, spec.extra["layouts"]))
        if len(specs_) > 1:
            for r in mine:
                r.detail = f"{launcher}: {r.detail}"
                r.metrics["launcher"] = launcher
        results += mine
        if not all(r.passed for r in mine):
            break
    return results


def _held_sizes(op: decl.Op, results: list[StageResult], ints: list[str] | None = None) -> None:
    """A passed numeric stage says what it did not vary: without `sizes`, every size but the token count stayed at
    what the workload sent, so the verdict vouches for those widths only; without `dtypes`, for the workload's
    dtypes only; `ints`, the integer arguments held at their recorded values (docs/targets.md, section 5)."""
    for r in results:
        if r.name == "numeric" and r.passed:
            r.metrics["sizes"] = sorted(op.sizes)
            r.metrics["held_ints"] = list(ints or [])
            if ints:
                r.detail += (f"; int argument(s) {', '.join(ints)} as the workload sent them (NOT CHECKED at other "
                             "values: declare `sizes` or `inputs.<name>.common` for those production varies)")
            if not op.sizes:
                r.detail += ("; every size but the token count as the workload sent it (NOT CHECKED at other "
                             "widths: declare `sizes` for those production varies)")
            if not op.dtypes:
                r.detail += ("; in the workload's dtype(s) only (NOT CHECKED in others: declare `dtypes` for those "
                             "production runs)")


def _e2e(root: Path, d: decl.Declaration, op: decl.Op, copy: Path, policy) -> StageResult:
    from autokernel.target import e2e
    return e2e.check(root, d, op, copy, policy)
