"""The gate's runtime and numeric stages, parent side: make the inputs, run the candidate in the sandbox, judge.

The parent (trusted, the autokernel process) generates every input from a secret seed and writes it into the job
dir; the child (autokernel.gate.child, in the sandbox) runs the candidate first and saves what it returned; only then
does the parent compute the float64 reference and eager torch on private copies and compare. The candidate never
sees the seed, the generator, the reference or the tolerance (DESIGN.md trust rules 1-2).

Cases are shape x dtype x distribution: the traced (or model) shapes, the spec's odd shapes and one shape larger than
any traced, each dtype of the spec, and every distribution of autokernel.ops.spec plus "mixed" (all of them
interleaved elementwise in one tensor, so a kernel that samples a few values to pick a path is wrong somewhere).
"""
from __future__ import annotations

import hashlib
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autokernel import device
from autokernel.gate.verdict import StageResult
from autokernel.ops.spec import DISTRIBUTIONS, OpSpec, upcast
from autokernel.ops.tolerance import compare

DISTS = DISTRIBUTIONS + ("mixed",)
CHUNK_BYTES = 256 << 20  # inputs written per sandbox job; bigger case sets run as several jobs
CHUNK_TIME_FRACTION = 0.4  # of the sandbox timeout, per job, as estimated from the smoke job's timings
ENTRY = "autokernel.gate.child:numeric"
# When eager torch itself breaks on an input (an fp16 x.pow(2) overflowing to inf, so a row comes out zero), 2x its
# error is a tolerance that cannot fail (STYLE.md #5). Eager counts as broken when it is non-finite where the float64
# reference is finite, or off by more than BROKEN_EAGER_FRACTION of the output's scale (imprecise is not broken: a
# float32 rope at position 1000 is off by ~500 ulps and keeps its derived bound). The bound then is what the rule
# gives a healthy eager of ~2 ulps: 2 x 2 + 4 = 8 ulps of the output's scale.
BROKEN_EAGER_FRACTION = 0.125
BROKEN_EAGER_ULPS = 8.0


@dataclass
class Case:
    id: str
    shape: dict[str, int]
    dtype: torch.dtype
    dist: str
    calls: int  # 1, or 3: same values at new addresses, then new values at the same addresses
    a: dict[str, Any]  # the call's arguments
    b: dict[str, Any] | None  # new values for the same tensors (the in-place refill of call 3)

    def label(self) -> str:
        dims = ",".join(f"{k}={v}" for k, v in self.shape.items())
        return f"{dims} {str(self.dtype).removeprefix('torch.')} {self.dist}"


def _derive(seed: int, *parts: object) -> int:
    h = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def larger_shape(spec: OpSpec, shapes: list[dict[str, int]]) -> dict[str, int] | None:
    """A shape past every traced one: the spec's own (extra['larger_shapes']) or the biggest traced shape with its
    leading (batch/token) dimension doubled plus one (not a block multiple either)."""
    if spec.extra.get("larger_shapes"):
        return dict(spec.extra["larger_shapes"][0])
    if not shapes:
        return None
    big = dict(max(shapes, key=spec.flops))
    k = next(iter(big))
    big[k] = 2 * big[k] + 1
    return big


def plan(spec: OpSpec, shapes: list[dict] | None, dtypes: list[torch.dtype] | None,
         dists: list[str] | None) -> list[tuple[dict, torch.dtype, str, int]]:
    """(shape, dtype, dist, calls) for every case, smoke cases first.

    Each (shape, dtype) gets all three calls (determinism, in-place refill) on its first distribution and one call on
    the others: the three-call properties do not depend on the values, and the interpreter's time is the budget.
    The smoke cases (every shape, first dtype, first distribution) run as their own sandbox job first, so most
    wrong candidates are turned away after a fraction of the work.
    """
    traced = [dict(s) for s in (shapes if shapes is not None else spec.model_shapes)]
    big = larger_shape(spec, traced)
    all_shapes = []
    for s in traced + [dict(s) for s in spec.odd_shapes] + ([big] if big else []):
        if s not in all_shapes:
            all_shapes.append(s)
    dtypes, dists = list(dtypes or spec.dtypes), list(dists or DISTS)
    grid = [(s, dt, d, 3 if d == dists[0] else 1) for s in all_shapes for dt in dtypes for d in dists]
    smoke = [c for c in grid if c[1] == dtypes[0] and c[2] == dists[0]]
    return smoke + [c for c in grid if c not in smoke]


def _inputs(spec: OpSpec, shape: dict, dtype: torch.dtype, dist: str, seed: int, dev: str) -> dict[str, Any]:
    if dist != "mixed":
        return spec.make_inputs(shape, dtype, dev, torch.Generator().manual_seed(seed), dist)
    parts = [spec.make_inputs(shape, dtype, dev, torch.Generator().manual_seed(_derive(seed, d)), d)
             for d in DISTRIBUTIONS]
    base = parts[0]
    pick = torch.Generator().manual_seed(_derive(seed, "pick"))
    for k, v in base.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel():
            which = torch.randint(0, len(parts), v.shape, generator=pick).to(v.device)
            mixed = v.clone()
            for i, p in enumerate(parts[1:], start=1):
                mixed = torch.where(which == i, p[k], mixed)
            v.copy_(mixed)  # in place: a strided view keeps its layout
    return base


def make_case(spec: OpSpec, index: int, planned_case, seed: int) -> Case:
    shape, dtype, dist, calls = planned_case
    dev = "cuda" if device.is_cuda() else "cpu"
    a = _inputs(spec, shape, dtype, dist, _derive(seed, index, "a"), dev)
    b = _inputs(spec, shape, dtype, dist, _derive(seed, index, "b"), dev) if calls == 3 else None
    return Case(f"c{index:03d}", shape, dtype, dist, calls, a, b)


def make_cases(spec: OpSpec, planned, seed: int) -> list[Case]:
    return [make_case(spec, i, p, seed) for i, p in enumerate(planned)]


def poison_bits(seed: int) -> dict[str, int]:
    """A quiet NaN per float dtype with a random, non-zero payload: a kernel never writes these bits itself."""
    r = random.Random(_derive(seed, "poison"))
    return {"float16": 0x7E00 | r.randrange(1, 1 << 9), "bfloat16": 0x7FC0 | r.randrange(1, 1 << 6),
            "float32": 0x7FC00000 | r.randrange(1, 1 << 22), "float64": 0x7FF8000000000000 | r.randrange(1, 1 << 51)}


def _nbytes(kwargs: dict) -> int:
    seen, n = set(), 0
    for v in kwargs.values():
        if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() not in seen:
            seen.add(v.untyped_storage().data_ptr())
            n += v.untyped_storage().nbytes()
    return n


def _as_list(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _clone(kwargs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


class _Reject(Exception):
    def __init__(self, reason: str, detail: str):
        self.reason, self.detail = reason, detail


def _judge_call(outs: list, eager: list, ref64: list, poison: dict[str, int], where: str,
                worst: dict[str, float], mismatch_reason: str = "numeric.mismatch") -> None:
    if len(outs) != len(eager):
        raise _Reject("numeric.bad_output", f"{len(outs)} outputs, the reference has {len(eager)} ({where})")
    for i, (o, e, r) in enumerate(zip(outs, eager, ref64)):
        if type(o) is not torch.Tensor:
            raise _Reject("numeric.bad_output", f"output {i} is a {type(o).__name__} ({where})")
        if o.shape != e.shape or o.dtype != e.dtype:
            raise _Reject("numeric.bad_output", f"output {i} is {tuple(o.shape)} {o.dtype}, the reference "
                                                f"{tuple(e.shape)} {e.dtype} ({where})")
        if e.is_contiguous() and not o.is_contiguous():
            raise _Reject("numeric.bad_output", f"output {i} is not contiguous (strides {o.stride()}), the "
                                                f"reference is ({where})")
        name = str(o.dtype).removeprefix("torch.")
        if name in poison and o.numel():
            width = 8 * o.element_size()
            p = poison[name] - (1 << width) if poison[name] >= 1 << (width - 1) else poison[name]
            stale = _bits(o) == p
            if bool(stale.any()):
                first = [int(x) for x in torch.nonzero(stale.reshape(o.shape))[0]]
                raise _Reject("numeric.unwritten", f"{int(stale.sum())} of {o.numel()} elements of output {i} never "
                                                   f"written, first at {first} ({where})")
        if not o.is_floating_point():
            if not torch.equal(o.cpu(), r.to(o.dtype).cpu()):
                raise _Reject(mismatch_reason, f"output {i}: {int((o.cpu() != r.to(o.dtype).cpu()).sum())} "
                                               f"elements differ ({where})")
            continue
        r = r.to(torch.float64).cpu()
        o64, o, e = o.cpu().to(torch.float64), o.cpu(), e.cpu()
        # where the true value overflows the output dtype (fp16 products past 65504), inf is the right answer;
        # elements whose reference is not finite at all are not compared
        representable = torch.isfinite(r.to(o.dtype))
        if not bool(representable.all()):
            overflow = torch.isfinite(r) & ~representable
            wrong_way = overflow & ~((o64.abs() >= torch.finfo(o.dtype).max) & (o64.sign() == r.sign()))
            if bool(wrong_way.any()):
                raise _Reject(mismatch_reason, f"output {i}: {int(wrong_way.sum())} elements past the "
                                               f"{o.dtype} range are not ±inf of the right sign ({where})")
            o, r, e = o[representable], r[representable], e[representable]
            o64 = o.to(torch.float64)
        finite_ref = torch.isfinite(r)
        bad = ~torch.isfinite(o64) & finite_ref
        if bool(bad.any()):
            raise _Reject("numeric.nonfinite", f"{int(bad.sum())} NaN/Inf in output {i} where the reference is "
                                               f"finite ({where})")
        c = compare(o, r, e, o.dtype)
        ulp_scale = torch.finfo(o.dtype).eps * max(c.scale, torch.finfo(o.dtype).tiny)
        eager_broken = not bool(torch.isfinite(e.to(torch.float64))[finite_ref].all()) or \
            c.eager_err > BROKEN_EAGER_FRACTION * c.scale
        if eager_broken:  # see BROKEN_EAGER_FRACTION
            bound = BROKEN_EAGER_ULPS * ulp_scale
            ok = c.max_err <= bound
            detail = f"max error {c.max_err:.3g} vs bound {bound:.3g} ({BROKEN_EAGER_ULPS:g} ulps of scale " \
                     f"{c.scale:.3g}: eager torch itself is off by {c.eager_err:.3g} here)"
        else:
            bound, ok, detail = c.bound, c.ok, c.detail()
        ratio = c.max_err / bound if bound > 0 else (0.0 if c.max_err == 0 else float("inf"))
        worst[name] = max(worst.get(name, 0.0), ratio)
        if not ok:
            raise _Reject(mismatch_reason, f"output {i}: {detail} ({where})")


def judge(spec: OpSpec, case: Case, outs: list[list], poison: dict[str, int], worst: dict[str, float]) -> None:
    """The parent's checks on one case's three calls; raises _Reject with the first failure."""
    eager_a = _as_list(spec.reference(**_clone(case.a)))
    ref_a = _as_list(spec.reference(**upcast(case.a)))
    _judge_call(outs[0], eager_a, ref_a, poison, f"{case.label()}, call 1", worst)
    if case.calls == 1:
        return
    if spec.deterministic:
        for i, (o1, o2) in enumerate(zip(outs[0], outs[1])):
            if o1.shape != o2.shape or o1.dtype != o2.dtype or not torch.equal(_bits(o1), _bits(o2)):
                raise _Reject("numeric.nondeterministic", f"output {i} differs between two calls on equal inputs "
                                                          f"({case.label()})")
    else:
        _judge_call(outs[1], eager_a, ref_a, poison, f"{case.label()}, call 2", worst)
    eager_b = _as_list(spec.reference(**_clone(case.b)))
    ref_b = _as_list(spec.reference(**upcast(case.b)))
    _judge_call(outs[2], eager_b, ref_b, poison, f"{case.label()}, call 3 after the inputs were refilled in place "
                                                 "with new values", worst, mismatch_reason="numeric.caching")


class _Stop(Exception):
    def __init__(self, runtime: StageResult, numeric: StageResult | None):
        self.runtime, self.numeric = runtime, numeric


class _Runner:
    """Runs chunks of cases in the sandbox and judges them; raises _Stop at the first failure."""

    def __init__(self, spec: OpSpec, candidate: Path, job_dir: Path, limits, poison: dict[str, int], sandbox_run):
        self.spec, self.candidate, self.job_dir, self.limits = spec, candidate, job_dir, limits
        self.poison, self.sandbox_run = poison, sandbox_run
        self.worst: dict[str, float] = {}
        self.calls = self.launches = self.cases = 0
        self.sandbox_s = self.candidate_s = 0.0
        self.isolation = ""
        self.call_s: dict[str, float] = {}  # measured seconds per call, by shape (sizes the next chunks)

    def chunk(self, chunk: list[Case]) -> None:
        inputs = self.job_dir / "in"
        inputs.mkdir(exist_ok=True)
        for c in chunk:
            torch.save(c.a, inputs / f"{c.id}.a.pt")
            if c.b is not None:
                torch.save(c.b, inputs / f"{c.id}.b.pt")
        payload = {"op": self.spec.name, "candidate": self.candidate.name, "poison": self.poison,
                   "cases": [{"id": c.id, "inputs": f"in/{c.id}.a.pt",
                              "refill": f"in/{c.id}.b.pt" if c.b is not None else None} for c in chunk]}
        try:
            res = self.sandbox_run(ENTRY, payload, self.job_dir, self.limits)
        finally:
            shutil.rmtree(inputs, ignore_errors=True)
        self.sandbox_s += res.wall_s
        self.isolation = res.isolation
        if not res.ok:
            raise _Stop(StageResult.fail("runtime", res.reason or "sandbox.error", res.detail,
                                         isolation=res.isolation, sandbox_s=round(res.wall_s, 3)), None)
        data = res.data
        self.calls += data.get("calls", 0)
        self.candidate_s += data.get("candidate_s", 0.0)
        by_id = {c.id: c for c in chunk}
        for rec in data.get("cases", []):
            self.launches += sum(rec["launches"])
            c = by_id[rec["id"]]
            self.call_s[json_shape(c.shape)] = max(self.call_s.get(json_shape(c.shape), 0.0),
                                                   rec.get("seconds", 0.0) / c.calls)
        numeric_failure = None
        done = {rec["id"] for rec in data.get("cases", [])}
        for c in chunk:  # the cases that completed are judged first: a wrong early answer outranks a later crash
            if c.id not in done:
                break
            try:
                outs = [torch.load(self.job_dir / "out" / f"{c.id}.{j}.pt", weights_only=True)
                        for j in range(1, c.calls + 1)]
                judge(self.spec, c, outs, self.poison, self.worst)
                self.cases += 1
            except _Reject as r:
                numeric_failure = (r.reason, r.detail)
                break
            finally:
                for j in (1, 2, 3):
                    (self.job_dir / "out" / f"{c.id}.{j}.pt").unlink(missing_ok=True)
        failure = data.get("failure")
        if failure and (failure["reason"].startswith("runtime.") or numeric_failure is None):
            reason, detail = failure["reason"], failure["detail"]
            case = by_id.get(failure.get("case") or "")
            if case is not None:
                detail = detail.replace(f"case {case.id}", case.label())
            if reason.startswith("runtime."):
                raise _Stop(StageResult.fail("runtime", reason, detail, isolation=self.isolation,
                                             ops=data.get("ops", {})), None)
            numeric_failure = (reason, detail)
        if numeric_failure:
            raise _Stop(self.runtime_ok(), StageResult.fail("numeric", *numeric_failure,
                                                            worst_error_ratio=self.rounded_worst()))

    def estimate_s(self, c: Case) -> float:
        return self.call_s.get(json_shape(c.shape), 0.0) * c.calls

    def rounded_worst(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.worst.items()}

    def runtime_ok(self) -> StageResult:
        return StageResult.ok("runtime", f"{self.calls} calls, each launched the candidate's own kernel; no torch "
                                         "compute, global state unchanged", calls=self.calls, launches=self.launches,
                              isolation=self.isolation, sandbox_s=round(self.sandbox_s, 3),
                              candidate_s=round(self.candidate_s, 3))


def run(spec: OpSpec, candidate: Path, job_dir: Path, limits, seed: int, planned,
        sandbox_run=None) -> tuple[StageResult, StageResult | None]:
    """Runtime and numeric stages. `candidate` is the file inside job_dir the child imports. Returns the runtime
    result and, if runtime passed, the numeric one.

    Inputs are made chunk by chunk (a 49152 x 576 weight is 113 MB per case): the smoke cases first, then chunks
    bounded by CHUNK_BYTES of inputs and by CHUNK_TIME_FRACTION of the sandbox's timeout, in the time the smoke run
    measured per call of each shape.
    """
    if sandbox_run is None:
        from autokernel.sandbox import run as sandbox_run
    t0 = time.perf_counter()
    if not planned:
        return StageResult.ok("runtime", "nothing to run"), StageResult.fail("numeric", "numeric.no_cases",
                                                                             "no shape of the op could be checked")
    runner = _Runner(spec, candidate, job_dir, limits, poison_bits(seed), sandbox_run)
    first = planned[0][1:3]
    n_smoke = next((i for i, p in enumerate(planned) if p[1:3] != first or p[3] != 3), len(planned))
    budget_s = CHUNK_TIME_FRACTION * float(getattr(limits, "timeout_s", 300.0))
    skipped: dict[str, str] = {}
    try:
        chunk: list[Case] = []
        size = est = 0.0
        for i, p in enumerate(planned):
            try:
                c = make_case(spec, i, p, seed)
            except Exception as e:  # the trusted generator refuses a shape (the heuristic larger one, say)
                skipped.setdefault(json_shape(p[0]), f"{type(e).__name__}: {e}"[:120])
                continue
            n, t = _nbytes(c.a) + (_nbytes(c.b) if c.b else 0), runner.estimate_s(c)
            if chunk and (i == n_smoke or size + n > CHUNK_BYTES or est + t > budget_s):
                runner.chunk(chunk)
                chunk, size, est = [], 0.0, 0.0
                t = runner.estimate_s(c)
            chunk.append(c)
            size, est = size + n, est + t
        if chunk:
            runner.chunk(chunk)
    except _Stop as stop:
        return stop.runtime, stop.numeric
    if not runner.cases:
        return runner.runtime_ok(), StageResult.fail("numeric", "numeric.no_cases", "the op's input generator "
                                                     f"refused every shape: {skipped}")
    shapes = sorted({json_shape(p[0]) for p in planned} - set(skipped))
    note = f"; skipped {', '.join(skipped)} (the input generator refused it)" if skipped else ""
    numeric = StageResult.ok("numeric", f"{runner.cases} cases ({len(shapes)} shapes x dtypes x distributions), "
                                        f"{runner.calls} calls: within tolerance, deterministic, no cache{note}",
                             cases=runner.cases, shapes=shapes, worst_error_ratio=runner.rounded_worst(),
                             skipped=skipped, elapsed_s=round(time.perf_counter() - t0, 3))
    return runner.runtime_ok(), numeric


def json_shape(shape: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())
