"""The gate's runtime and numeric stages, parent side: make the inputs, run the candidate in the sandbox, judge.

The parent (trusted, the autokernel process) generates every input from a secret seed and hands it to the sandbox
job read-only; the child (autokernel.gate.child) runs the candidate and returns raw observations and outputs; only
then does the parent compute the float64 reference and eager torch on private copies and judge every call
(autokernel.gate.judge). The candidate never sees the seed, the generator, the reference or the tolerance
(docs/design.md trust rules 1-2), and the parent takes nothing the child says as truth.

Cases are shape x dtype x distribution (autokernel.gate.schedule): the traced (or model) shapes, the spec's odd shapes,
a larger one and a sweep of the leading dimension; each dtype of the spec; every distribution of autokernel.ops.spec
plus "mixed" (all of them interleaved elementwise in one tensor, so a kernel that samples a few values to pick a path
is wrong somewhere). Each case makes one to five calls (fresh, copy, refills, repeat), interleaved with the other
cases' calls in a secret order, with the grid's programs run in ascending, descending or shuffled order.
"""
from __future__ import annotations

import itertools
import queue
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, AbstractSet, Any, cast

import torch

from autokernel import device, harness
from autokernel.gate import coverage, coverage_steer, judge, schedule, thresholds
from autokernel.gate.verdict import REASONS, StageResult
from autokernel.ops.spec import DISTRIBUTIONS, MIXED, OpSpec, like

if TYPE_CHECKING:
    from autokernel.policy import Sandbox

DISTS = DISTRIBUTIONS + ("mixed",)
CHUNK_BYTES = 256 << 20  # inputs per sandbox job; bigger case sets run as several jobs
CHUNK_TIME_FRACTION = 0.4  # of the sandbox timeout, per job, as estimated from the smoke job's timings
JOB_TIMEOUT_SLACK = 3.0  # a job's wall clock may run this many times its estimate before sandbox.timeout


@dataclass
class Case:
    id: str
    shape: dict[str, int]
    dtype: torch.dtype
    dist: str
    calls: int  # schedule.FULL or schedule.SINGLE: what the plan asked for
    a: dict[str, Any]  # the first call's arguments
    b: dict[str, Any] | None  # new values for the same tensors (an in-place refill)
    t: dict[str, Any] | None = None  # a's values with a few elements from b (an in-place refill)
    steps: list[tuple[str, str]] = field(default_factory=list)  # (mode, values) of each call, in order

    def nbytes(self) -> int:
        """Bytes of the case's input storages (each value set counted once)."""
        return _nbytes(self.a) + _nbytes(self.b) + _nbytes(self.t)

    def label(self) -> str:
        dims = ",".join(f"{k}={v}" for k, v in self.shape.items())
        return f"{dims} {str(self.dtype).removeprefix('torch.')} {self.dist}"


_derive = schedule.derive
larger_shape = schedule.larger_shape


def plan(spec: OpSpec, shapes: list[dict] | None, dtypes: list[torch.dtype] | None,
         dists: list[str] | None, seed: int = 0, max_rows: int = 0,
         thresholds: AbstractSet[int] = frozenset(),
         production_rows: int = 0) -> list[tuple[dict, torch.dtype, str, int]]:
    """(shape, dtype, dist, schedule.FULL | SINGLE) for every case, smoke cases first (autokernel.gate.schedule);
    max_rows/thresholds: the production-range sweep (policy gate.max_rows, autokernel.gate.thresholds);
    production_rows: policy gate.max_rows uncapped (what cheap dimensions such as a cache's reserve reach)."""
    return schedule.plan(spec, shapes, dtypes, dists, DISTS, seed, max_rows, thresholds, production_rows)


def _constrained(spec: OpSpec, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A value set made valid again after elementwise mixing or tweaking: a target's declared input rules
    (spec.extra['constrain'], autokernel/target/contract.py), e.g. rope's cos as two equal halves."""
    fix = spec.extra.get("constrain")
    if fix is not None:
        fix(kwargs)
    return kwargs


def _inputs(spec: OpSpec, shape: dict, dtype: torch.dtype, dist: str, seed: int, dev: str) -> dict[str, Any]:
    if dist != "mixed":
        return spec.make_inputs(shape, dtype, dev, torch.Generator().manual_seed(seed), dist)
    parts = [spec.make_inputs(shape, dtype, dev, torch.Generator().manual_seed(_derive(seed, d)), d)
             for d in MIXED]
    base = parts[0]
    parts = [base] + [like(base, p) for p in parts[1:]]
    pick = torch.Generator().manual_seed(_derive(seed, "pick"))
    for k, v in base.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel():
            which = torch.randint(0, len(parts), v.shape, generator=pick).to(v.device)
            mixed = v.clone()
            for i, p in enumerate(parts[1:], start=1):
                mixed = torch.where(which == i, p[k], mixed)
            v.copy_(mixed)  # in place: a strided view keeps its layout
    return _constrained(spec, base)


def make_case(spec: OpSpec, index: int, planned_case, seed: int) -> Case:
    shape, dtype, dist, calls = planned_case
    dev = "cuda" if device.is_cuda() else "cpu"
    cid = f"c{index:03d}"
    steps = schedule.case_steps(cid, calls, random.Random(_derive(seed, index, "steps"))).steps
    used = {v for _, v in steps}
    a = _inputs(spec, shape, dtype, dist, _derive(seed, index, "a"), dev)
    b = like(a, _inputs(spec, shape, dtype, dist, _derive(seed, index, "b"), dev)) if used & {"b", "t"} else None
    t = None
    if "t" in used:
        assert b is not None  # drawn above wherever "t" is used
        t = _constrained(spec, schedule.tweak(a, b, _derive(seed, index, "t")))
    return Case(cid, shape, dtype, dist, calls, a, b, t, steps)


def make_cases(spec: OpSpec, planned, seed: int) -> list[Case]:
    return [make_case(spec, i, p, seed) for i, p in enumerate(planned)]


def poison_bits(seed: int) -> dict[str, int]:
    """A quiet NaN per float dtype with a random, non-zero payload: a kernel never writes these bits itself (written
    and looked for as raw bits: harness.fill_poison, harness.poisoned)."""
    r = random.Random(_derive(seed, "poison"))
    return {"float16": 0x7E00 | r.randrange(1, 1 << 9), "bfloat16": 0x7FC0 | r.randrange(1, 1 << 6),
            "float32": 0x7FC00000 | r.randrange(1, 1 << 22), "float64": 0x7FF8000000000000 | r.randrange(1, 1 << 51)}


def _nbytes(kwargs: dict | None) -> int:
    seen, n = set(), 0
    for v in (kwargs or {}).values():
        if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() not in seen:
            seen.add(v.untyped_storage().data_ptr())
            n += v.untyped_storage().nbytes()
    return n


class _Stop(Exception):
    def __init__(self, runtime: StageResult, numeric: StageResult | None):
        self.runtime, self.numeric = runtime, numeric


def _child_failure(failure: Any, by_id: dict[str, Case]) -> tuple[str, str] | None:
    """The failure the child reported, if well-formed: a known runtime./numeric. code and a one-line detail (with the
    case's id replaced by its label). A candidate that forges one only rejects itself; anything else is ignored and
    the missing calls then fail the job (runtime.incomplete)."""
    if not isinstance(failure, dict):
        return None
    reason, detail = failure.get("reason"), failure.get("detail")
    if reason not in REASONS or not reason.startswith(("runtime.", "numeric.")) or not isinstance(detail, str):
        return None
    cid = failure.get("case")
    case = by_id.get(cid if isinstance(cid, str) else "")
    if case is not None:
        detail = detail.replace(f"case {case.id}", case.label())
    return reason, " ".join(detail.split())[:400]


class _Runner:
    """Runs chunks of cases in the sandbox and judges them; raises _Stop at the first failure."""

    def __init__(self, spec: OpSpec, candidate: Path, job_dir: Path, limits: Sandbox, seed: int, sandbox_run,
                 bitwise: bool):
        self.spec, self.candidate, self.job_dir, self.limits = spec, candidate, job_dir, limits
        self.seed, self.poison, self.sandbox_run, self.bitwise = seed, poison_bits(seed), sandbox_run, bitwise
        self.worst: dict[str, float] = {}
        self.calls = self.launches = self.cases = self.jobs = 0
        self.sandbox_s = self.candidate_s = self.parent_s = 0.0
        self.lock = threading.Lock()
        self.leftover: list[Case] = []  # cases a soft deadline left undone (run_chunks), for the next phase
        self.isolation = ""
        self.call_s: dict[str, float] = {}  # measured seconds per call, by shape (sizes the next chunks, e2e budget)
        self.shape_of: dict[str, dict] = {}
        self.sites: dict[str, coverage.Site] = {}  # the candidate's coverage sites (set by run when required)
        self.seen: dict[str, int] = {}  # what every job's probes saw, OR-ed (autokernel/gate/coverage.py)
        self.steered = 0  # extra cases the coverage steering ran
        self.exempt: dict[str, coverage.Site] = {}  # a target's sites that are its incumbent's code
        self.configs = coverage.autotune_variants(candidate.read_bytes())  # 1, or a "config" call each per case

    def chunk(self, chunk: list[Case], est_s: float = 0.0, job: int | None = None, soft_s: float = 0.0,
              groups: tuple[int, ...] = ()) -> list[Case]:
        """One sandbox job for `chunk`, judged here; returns the cases a soft deadline left undone (for a later job).
        job: its number (the interleaving's seed), assigned in plan order by the caller when jobs run in parallel.
        soft_s: the child starts no call past this many seconds of calls (0: none). groups: the chunk's first cases
        in groups of these sizes, each group's calls made before the next group's (the rest last)."""
        from autokernel.gate import child  # the sandbox entry: not imported by the parent before it is needed
        if job is None:
            job = self.jobs
        calls: list[dict] = []
        lo = 0
        for g, hi in enumerate([*itertools.accumulate(groups), len(chunk)]):
            more = [("config", "a")] * self._config_calls()
            part = [schedule.CaseCalls(c.id, [*c.steps, *more]) for c in chunk[lo:hi]]
            calls += [c.payload() for c in schedule.interleave(part, self.seed, job if g == 0 else f"{job}.{g}",
                                                               start=len(calls))]
            lo = hi
        # Inputs go into the job's fresh read-only input directory; outputs come back in the result (the sandbox
        # contract): nothing the candidate could write is read here.
        inputs: dict = {self.candidate.name: self.candidate.read_bytes()}
        files: dict[str, dict[str, str]] = {}
        for c in chunk:
            for v in sorted({v for _, v in c.steps}):
                inputs[f"{c.id}.{v}.pt"] = getattr(c, v)
                files.setdefault(c.id, {})[v] = f"{c.id}.{v}.pt"
        payload: harness.NumericPayload = {"op": self.spec.name, "candidate": self.candidate.name,
                                           "poison": self.poison, "cases": files,
                                           "calls": cast("list[harness.CallSpec]", calls),  # Call.payload's dicts
                                           "soft_s": soft_s,
                                           "salt": _derive(self.seed, "autotune")}
        target = self.spec.extra.get("target")  # a target checkout's op (autokernel/target/contract.py)
        where = {}
        if target:
            payload["target"] = {"module": target["module"], "launcher": target["launcher"],
                                 "outputs": target["outputs"], "written": target["written"],
                                 "inplace": target.get("inplace") or [],
                                 "preload": target["preload"]}
            where = {"pythonpath": [target["root"]]}
            prepare = self.spec.extra["prepare"]  # its reference's own sandboxed job, for every value set used
            prepare([getattr(c, v) for c in chunk for v in sorted({v for _, v in c.steps})])
        res = self.sandbox_run(child.numeric, payload, self.job_dir, self.limits_for(est_s),
                               inputs=inputs, **where)
        with self.lock:  # parallel jobs (run_chunks) are judged one at a time
            t = time.perf_counter()
            try:
                return self._judge_job(res, chunk, calls, child.ALLOWED_OPS, soft=soft_s > 0)
            finally:
                self.parent_s += time.perf_counter() - t

    def _judge_job(self, res, chunk: list[Case], calls: list[dict], allowed, soft: bool = False) -> list[Case]:
        """Judge what came back; the cases left undone when a soft deadline stopped the job after at least one whole
        case (what the parent counts: the child's word on why it stopped is not needed). Fewer calls than asked for
        otherwise, or no whole case, is runtime.incomplete."""
        self.jobs += 1
        self.sandbox_s += res.wall_s
        self.isolation = res.isolation
        if not res.ok:
            raise _Stop(StageResult.fail("runtime", res.reason or "sandbox.error", res.detail,
                                         isolation=res.isolation, sandbox_s=round(res.wall_s, 3)), None)
        by_id = {c.id: c for c in chunk}
        coverage.merge(self.seen, res.data.get("coverage"), {**self.sites, **self.exempt})
        try:
            recs = judge.records(res.data, calls)
        except judge.Reject as r:
            raise _Stop(StageResult.fail("runtime", r.reason, r.detail, isolation=self.isolation), None) from None
        self._tally(recs, calls, by_id)
        numeric_failure = self._judge(chunk, calls, recs, allowed, soft)
        failure = _child_failure(res.data.get("failure"), by_id)
        undone = [c for c in chunk if any(call["id"] not in recs for call in calls if call["case"] == c.id)]
        if soft and failure is None and numeric_failure is None and undone and len(undone) < len(chunk):
            return undone
        if failure is None and numeric_failure is None and len(recs) < len(calls):
            failure = ("runtime.incomplete", f"the job returned {len(recs)} of the {len(calls)} calls asked for, and "
                                             "no failure")
        if failure and (failure[0].startswith("runtime.") or numeric_failure is None):
            if failure[0].startswith("runtime."):
                raise _Stop(StageResult.fail("runtime", *failure, isolation=self.isolation,
                                             ops=res.data.get("ops") if isinstance(res.data.get("ops"), dict)
                                             else {}), None)
            numeric_failure = failure
        if numeric_failure:
            raise _Stop(self.runtime_ok(), StageResult.fail("numeric", *numeric_failure,
                                                            worst_error_ratio=self.rounded_worst()))
        return []

    def _tally(self, recs: dict[str, dict], calls: list[dict], by_id: dict[str, Case]) -> None:
        for call in calls:
            rec = recs.get(call["id"])
            if rec is None:
                continue
            self.calls += 1
            self.launches += rec["launches"]
            seconds = rec.get("seconds")
            s = seconds if isinstance(seconds, float) else 0.0
            self.candidate_s += s
            key = json_shape(by_id[call["case"]].shape)
            self.call_s[key] = max(self.call_s.get(key, 0.0), s)
            self.shape_of[key] = by_id[call["case"]].shape

    def _judge(self, chunk: list[Case], calls: list[dict], recs: dict[str, dict], allowed,
               soft: bool = False) -> tuple[str, str] | None:
        """Judge the cases whose calls all came back, in case order: a wrong early answer outranks a later crash
        (after a soft deadline, every whole case). A runtime failure the parent finds here stops at once (_Stop); a
        numeric one is returned."""
        for c in chunk:
            mine = [call for call in calls if call["case"] == c.id]
            if any(call["id"] not in recs for call in mine):
                if soft:
                    continue
                return None
            outs = {}
            try:
                for call in mine:
                    where = f"{c.label()}, call {call['id']}"
                    judge.check_runtime(recs[call["id"]], where, allowed)
                    outs[call["id"]] = judge.outputs(recs[call["id"]], where)
            except judge.Reject as r:
                if r.reason.startswith("runtime."):
                    raise _Stop(StageResult.fail("runtime", r.reason, r.detail, isolation=self.isolation),
                                None) from None
                return r.reason, r.detail
            try:
                judge.judge_case(self.spec, c, mine, outs, self.poison, self.worst, self.bitwise)
            except judge.Reject as r:
                return r.reason, r.detail
            self.cases += 1
        return None

    def _per_call_s(self, shape: dict) -> float:
        """Seconds a call of `shape` takes: measured, else per_call_model's; 0 before any measurement."""
        per_call = self.call_s.get(json_shape(shape))
        if per_call is None and self.call_s:
            per_call = per_call_model(self.spec, {k: (self.shape_of[k], t) for k, t in self.call_s.items()})(shape)
        return per_call or 0.0

    def estimate_s(self, c: Case) -> float:
        """Seconds for case c's calls."""
        return self._per_call_s(c.shape) * (len(c.steps) + self._config_calls())

    def _config_calls(self) -> int:
        return self.configs if self.configs > 1 else 0

    def estimate_planned(self, planned_case) -> float:
        """estimate_s for a planned case before its inputs are made (its calls: the schedule's expected number)."""
        calls = (4.5 if planned_case[3] == schedule.FULL else 1.25) + self._config_calls()
        return self._per_call_s(planned_case[0]) * calls

    def limits_for(self, est_s: float) -> Sandbox:
        """The job's limits: the policy's, with the wall and CPU clocks stretched for one case that alone needs
        more than the chunk budget (a slow but legitimate candidate under the interpreter is not a timeout)."""
        need = JOB_TIMEOUT_SLACK * est_s
        if need <= self.limits.timeout_s:
            return self.limits
        return self.limits.model_copy(update={"timeout_s": need, "cpu_s": max(self.limits.cpu_s, int(2 * need))})

    def rounded_worst(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.worst.items()}

    def runtime_ok(self) -> StageResult:
        detail = f"{self.calls} calls, each launched the candidate's own kernel; no torch compute, global state " \
                 "unchanged" if self.calls else "no call completed: the first failed the numeric check below, " \
                 "after its runtime checks passed"
        return StageResult.ok("runtime", detail, calls=self.calls, launches=self.launches,
                              isolation=self.isolation, sandbox_s=round(self.sandbox_s, 3),
                              candidate_s=round(self.candidate_s, 3), jobs=self.jobs)


def per_call_model(spec: OpSpec, measured: dict[str, tuple[dict, float]]):
    """Seconds per call of a shape as a + b * work, from measured (shape, seconds) points: a the fastest call (the
    launch overhead), b the steepest slope seen. Pessimistic on purpose: it sizes time budgets and limits."""
    pts = [(schedule.cost(spec, s), t) for s, t in measured.values()]
    a = min(t for _, t in pts)
    b = max(((t - a) / w for w, t in pts if w > 0), default=0.0)
    return lambda shape: a + b * schedule.cost(spec, shape)


PARALLEL_MIN_S = 10.0  # estimated candidate seconds left after the first job below which one job does the rest: a
# second job's start-up (torch and Triton imported, ~2.5 s on 2 cores) would cost more than it saves
FIRST_JOB_SOFT_S = 20.0  # the first job starts no call past this many seconds of calls (once one case is whole): a
# bound on what a wrong candidate costs before the parent's first judgement, and the serial part of a long plan


@dataclass
class Cover:
    """The coverage requirement for one verdict (policy gate.require_coverage, autokernel/gate/coverage.py)."""
    extra_cases: int  # policy gate.coverage_cases: the steering's budget
    max_rows: int  # the range dimension's reach (the plan's own)
    production_rows: int = 0  # policy gate.max_rows: production's reach, past the interpreter's cap (_reach)
    thresholds: frozenset[int] = frozenset()  # the source's integer thresholds (autokernel/gate/thresholds.py)


def run(spec: OpSpec, candidate: Path, job_dir: Path, limits: Sandbox, seed: int, planned,
        sandbox_run=None, bitwise: bool = True, cover: Cover | None = None) -> tuple[StageResult, StageResult | None]:
    """Runtime and numeric stages. `candidate` is the gate's copy of the file, named <op>.py; the child imports it
    from the job's input directory. Returns the runtime result and, if runtime passed, the numeric one. `bitwise`:
    policy gate.require_bitwise_determinism.

    Inputs are made chunk by chunk (a 49152 x 576 weight is 113 MB per case, CHUNK_BYTES a job). The first job has a
    soft deadline: the first case, the other smoke cases, then the rest, for FIRST_JOB_SOFT_S seconds of calls; what
    it leaves runs after it in chunks sized by the speed it measured, on every sandbox slot at once (one per core, or
    per GPU; _chunked, run_chunks), each chunk a fresh job; failures are reported in plan order, whichever job
    finished first.

    cover: require coverage (autokernel/gate/coverage.py): after the plan, what the probes never saw steers up to
    cover.extra_cases more cases; what is still unreached then fails the stage (coverage.unreached).
    """
    if sandbox_run is None:
        from autokernel.sandbox import run as sandbox_run
    t0 = time.perf_counter()
    if not planned:
        return StageResult.ok("runtime", "nothing to run"), StageResult.fail("numeric", "numeric.no_cases",
                                                                             "no shape of the op could be checked")
    runner = _Runner(spec, candidate, job_dir, limits, seed, sandbox_run, bitwise and spec.deterministic)
    skipped: dict[str, str] = {}
    gaps: list = []
    reach: dict = {}
    try:
        if cover is not None:
            runner.sites = coverage.sites(candidate.read_bytes())
            target = spec.extra.get("target")
            if target:  # a target's op: the incumbent's own statements are no obligation (coverage.incumbents)
                theirs = coverage.incumbents(runner.sites, candidate.read_bytes(), target["incumbent"])
                runner.exempt = {k: runner.sites.pop(k) for k in theirs}
        slots = _lanes(limits)
        run_chunks(runner, _chunked(runner, planned, skipped, len(slots)), slots)
        if cover is not None:
            gaps = _steer(runner, planned, skipped, slots, cover)
            if not gaps:
                reach = _reach(runner, planned, skipped, slots, cover)
    except _Stop as stop:
        return _split_time(runner, t0, stop.runtime, stop.numeric)
    except ValueError as e:  # more coverage sites than any kernel file has (coverage.MAX_SITES)
        return StageResult.ok("runtime", "not run"), StageResult.fail("numeric", "coverage.unreached", str(e))
    if not runner.cases:
        return runner.runtime_ok(), StageResult.fail("numeric", "numeric.no_cases", "the op's input generator "
                                                     f"refused every shape: {skipped}")
    if gaps:
        return _split_time(runner, t0, runner.runtime_ok(), StageResult.fail(
            "numeric", "coverage.unreached", coverage.describe(gaps, runner.cases),
            unreached=[{"line": g.line, "kind": g.kind, "text": g.text, "why": why} for g, why in gaps[:20]],
            **_coverage_metrics(runner)))
    shapes = sorted({json_shape(p[0]) for p in planned} - set(skipped))
    note = f"; skipped {', '.join(skipped)} (the input generator refused it)" if skipped else ""
    det = "bitwise reproducible in any program order" if runner.bitwise else "nondeterminism allowed by policy"
    if reach and not reach["checked"]:
        note += (f"; vouched up to {reach['dim']} = {reach['vouched']} of production's {reach['production']} "
                 f"(a call at {reach['rows']} would take ~{reach['est_s']:.0f} s under the interpreter and "
                 f"~{reach['need_mb']} MB; the gate on a GPU checks it)")
    if reach and reach.get("past_cap_checked"):
        note += (f"; past the plan's cap also at {reach['dim']} = {', '.join(map(str, reach['past_cap_checked']))} "
                 "(the source's thresholds crossed, a secret size per octave)")
    if reach and reach.get("thresholds_left"):
        note += (f"; NOT CHECKED here: {reach['dim']} = {', '.join(map(str, reach['thresholds_left'][:6]))} (the "
                 "source's thresholds past the plan's cap, over the interpreter's time or the sandbox's memory; the "
                 "gate on a GPU checks them)")
    left = len(coverage.missing(runner.exempt, runner.seen, not device.is_cuda())) if runner.exempt else 0
    if left:  # a target's unchanged statements no input reached here (coverage.incumbents)
        note += (f"; {left} coverage site(s) in statements kept verbatim from the incumbent were not reached here "
                 "(NOT CHECKED: the incumbent's code, as production runs it)")
    numeric = StageResult.ok("numeric", f"{runner.cases} cases ({len(shapes)} shapes x dtypes x distributions), "
                                        f"{runner.calls} calls in {runner.jobs} jobs: every element within "
                                        f"tolerance, {det}, no cache{note}",
                             cases=runner.cases, calls=runner.calls, shapes=shapes,
                             worst_error_ratio=runner.rounded_worst(), skipped=skipped,
                             call_s={k: round(v, 5) for k, v in runner.call_s.items()},
                             elapsed_s=round(time.perf_counter() - t0, 3),
                             **(_coverage_metrics(runner) if cover is not None else {}),
                             **({"reach": reach} if reach else {}))
    return _split_time(runner, t0, runner.runtime_ok(), numeric)


STEER_ROUNDS = 3  # round 0: the unreached conditions' own numbers; then secret sizes (coverage.steer)


def _steer(runner: _Runner, planned, skipped: dict[str, str], slots: list, cover: Cover) -> list:
    """Run steered cases while sites stay unreached, the budget lasts and rounds are left; what is unreached then.
    Kernel bodies are measured only where they run as Python (the interpreter); on CUDA the launcher's sites."""
    kernels = not device.is_cuda()
    gaps = coverage.missing(runner.sites, runner.seen, kernels)
    done = {json_shape(p[0]) for p in planned}
    start, left = len(planned), cover.extra_cases
    named = thresholds.names(runner.candidate.read_bytes()) if gaps else {}
    for round_ in range(STEER_ROUNDS):
        if not gaps or left <= 0:
            break
        extra = coverage_steer.steer(runner.spec, planned, gaps, runner.seed, round_, cover.max_rows, done, DISTS,
                               named)[:left]
        if not extra:
            continue
        runner.steered += len(extra)
        run_chunks(runner, _chunked(runner, extra, skipped, len(slots), start), slots)
        start, left = start + len(extra), left - len(extra)
        gaps = coverage.missing(runner.sites, runner.seen, kernels)
    return gaps


REACH_BASE_MB, REACH_COPIES = 1024, 8  # a numeric job's own footprint (torch, Triton, the interpreter: ~700 MB of
# address space measured) and how many times it holds a call's bytes at most
REACH_WORK = 4.0  # the calls past the plan's cap always made, all together, in units of the costliest call measured
# (schedule.cost): a floor that does not depend on this machine's speed or load, so the same candidate gets the same
# calls anywhere (on 2 idle cores ~30 s for rmsnorm at the 1024-row cap: the octave past it, not production's 8192)
REACH_TOP_WORK = 10.0  # production's maximum itself joins the floor where its call's work is at most this (linear ops:
# rmsnorm's 8k rows are ~8 cap calls, ~60 s on 2 cores): a kernel wrong only past the floor's octaves (M > 8N, say:
# no literal to cross) was accepted and vouched for up to the cap; a quadratic op's maximum (prefill attention at 8k
# tokens, 64 cap calls) stays a stated gap on CPU, checked where the kernels compile
REACH_BUDGET_S = 30.0  # estimated interpreter seconds the further calls past the cap may take, all together (a decode
# call at L = 8191 costs seconds; an 8191-row rmsnorm ~60 s on 2 cores, so that one is stated instead): a fast
# machine goes further than the floor


def _need_mb(spec: OpSpec, shape: dict, dtype) -> float:
    """The memory a numeric job with one call of `shape` needs: its own footprint and the call's bytes several times
    over (guard-byte copies, the saved outputs, the result frame)."""
    return REACH_BASE_MB + REACH_COPIES * spec.bytes_moved(shape, dtype) / (1 << 20)


TAIL_BLOCK = 128  # past the cap, the secret sizes are one past a multiple of this (_past_cap)


def _past_cap(runner: _Runner, planned, cover: Cover, dim: str) -> tuple[list[dict], list[dict]]:
    """The calls worth making past the plan's cap, in the order they get the budget: (crossings) the far side (T,
    T+1) of each threshold of the source there, so `(M // 1100) % 2` in arithmetic, exact at every size below the cap
    and at production's maximum, is judged inside its window; (octaves) a secret size in each octave from the cap to
    production, so a window keyed on a size derived from other dimensions, with no literal to find, is too. Each is
    one past a multiple of TAIL_BLOCK (where the octave holds a few such sizes): the last block of rows holds one
    row for every power-of-2 block up to it, so a grid that rounds the rows down (`(M + 62) // 64` programs of 64
    rows, taken only for M > 2N: no literal) leaves it unwritten there. Production's maximum comes last (_reach)."""
    spec, shapes = runner.spec, [p[0] for p in planned]
    far = sorted({v for t in cover.thresholds for v in (t, t + 1) if cover.max_rows < v <= cover.production_rows})
    crossings = [schedule.at_rows(spec, shapes, v) for v in far[:thresholds.MAX_ROWS_FROM_THRESHOLDS]]
    r, lo, octaves = random.Random(_derive(runner.seed, "past-cap")), cover.max_rows, []
    while lo < cover.production_rows:
        hi = min(2 * lo, cover.production_rows)
        first = lo - lo % TAIL_BLOCK + 1
        tails = range(first + (TAIL_BLOCK if first <= lo else 0), hi + 1, TAIL_BLOCK)  # v % TAIL_BLOCK == 1 in (lo, hi]
        v = r.choice(tails) if len(tails) >= 4 else min(r.randrange(lo + 1, hi + 1) | 1, hi)
        octaves.append(schedule.at_rows(spec, shapes, v))
        lo = hi
    return crossings, [s for s in octaves if s not in crossings]


def _greedy(calls: dict[str, dict], price, budget: float, taken: list[str]) -> list[str]:
    """`taken`, then each other call in order whose price still fits `budget` with the ones taken before it."""
    out, spent = list(taken), sum(price(calls[k]) for k in taken)
    for key, s in calls.items():
        if key not in out and spent + price(s) <= budget:
            spent += price(s)
            out.append(key)
    return out


def _reach(runner: _Runner, planned, skipped: dict[str, str], slots: list, cover: Cover) -> dict:
    """Calls past the plan's cap (the interpreter's row cap) up to production's maximum of the range dimension, each
    one case: as far as their work fits REACH_WORK together (the same calls on any machine, under any load), and
    production's maximum where its work is at most REACH_TOP_WORK, then
    further as far as their estimated times (the candidate's measured speed) fit REACH_BUDGET_S; each within the
    sandbox's memory (_past_cap's order; one that does not fit is passed over, cheaper ones still run): a
    kernel right up to the cap and wrong past it (a fixed number of key blocks, StreamingLLM-style sinks plus a
    window, a threshold in arithmetic) is then judged where production goes. What was vouched for, and the
    thresholds' sizes left unchecked, are stated in the verdict. {} where there is no gap to close."""
    spec = runner.spec
    shapes = [p[0] for p in planned]
    if cover.production_rows <= cover.max_rows or not shapes or cover.max_rows <= 1:
        return {}
    picked = schedule.range_dim(spec, shapes)
    if picked is None:
        return {}
    dim = picked[0]
    shape = schedule.at_rows(spec, shapes, schedule.secret_top(runner.seed, dim, cover.production_rows))
    # linear in work from the costliest shape measured (the plan's own range cases: the same kernel path, at scale);
    # per_call_model's steepest slope, fitted to small calls, overstates a long one tenfold
    big = max(runner.shape_of, key=lambda k: schedule.cost(spec, runner.shape_of[k]), default=None)
    if big is None:
        return {}

    def work(s: dict) -> float:  # in units of the costliest call measured
        return schedule.cost(spec, s) / max(schedule.cost(spec, runner.shape_of[big]), 1)

    def est_s(s: dict) -> float:
        return runner.call_s[big] * work(s)

    # the job holds the inputs and outputs several times over (guard-byte copies, the saved outputs, the result
    # frame) on top of torch and Triton: within the sandbox's memory or not made (a failure would be a verdict)
    need_mb = _need_mb(spec, shape, planned[0][1])
    crossings, octaves = _past_cap(runner, planned, cover, dim)
    known = {json_shape(s) for s in shapes}
    wanted = {json_shape(s): s for s in [*crossings, *octaves, shape] if json_shape(s) not in known}
    fits = {k: s for k, s in wanted.items() if _need_mb(spec, s, planned[0][1]) <= runner.limits.memory_mb}
    floor = _greedy(fits, work, REACH_WORK, [])
    last = json_shape(shape)
    if last in fits and last not in floor and work(shape) <= REACH_TOP_WORK:
        floor.append(last)
    done = _greedy(fits, est_s, REACH_BUDGET_S, floor)  # the floor first: its data and dtypes never depend on extras
    if done:  # production's data at production's sizes: "outliers" first, then "mixed", in turn (a soft clip of
        # values past 4N taken only past 2N rows was exact on "mixed" alone, which holds no value that large); and
        # production's dtypes: the largest call in a half precision (secretly which), the next ones in the plan's
        # other dtypes in turn (half precision dropping keys past 2,048 tokens ran in float32 only)
        turns = [d for d in ("outliers", "mixed") if d in DISTS]
        dts = list(dict.fromkeys(p[1] for p in planned))
        random.Random(_derive(runner.seed, "reach dtype")).shuffle(dts)
        dts.sort(key=lambda dt: torch.empty((), dtype=dt).element_size())  # stable: the halves first, shuffled
        big_first = sorted(floor, key=lambda k: -work(wanted[k])) + [k for k in done if k not in floor]
        dtype_of = {k: dts[i % len(dts)] for i, k in enumerate(big_first)}
        cases = [(wanted[k], dtype_of[k], turns[i % len(turns)], schedule.SINGLE) for i, k in enumerate(done)]
        run_chunks(runner, _chunked(runner, cases, skipped, len(slots), len(planned) + runner.steered), slots)
    ran = [k for k in done if k not in skipped]
    return {"dim": dim, "rows": shape[dim], "vouched": shape[dim] if last in ran else cover.max_rows,
            "production": cover.production_rows, "est_s": round(est_s(shape), 1), "need_mb": round(need_mb),
            "checked": last in ran, "past_cap_checked": sorted(wanted[k][dim] for k in ran if k != last),
            "thresholds_left": sorted(wanted[k][dim] for k in map(json_shape, crossings) if k in wanted
                                      and k not in done)}


def _coverage_metrics(runner: _Runner) -> dict:
    met = sum(1 for s in runner.sites.values() if runner.seen.get(s.key, 0) & coverage.REACHED)
    out = {"coverage_sites": len(runner.sites), "coverage_reached": met, "coverage_steered_cases": runner.steered}
    if runner.exempt:  # a target's unchanged statements left unreached here (coverage.incumbents): NOT CHECKED
        out["incumbent_unreached"] = len(coverage.missing(runner.exempt, runner.seen, not device.is_cuda()))
    return out


def _lanes(limits: Sandbox) -> list:
    """The slots (autokernel.sandbox.slots) the chunks past the smoke jobs run on at once: one per core, or per GPU;
    none (one job at a time) when this thread is already pinned to a slot (a gate among parallel agent workers,
    autokernel/agent/workers.py, already has its share of the machine)."""
    from autokernel.sandbox.slots import default_slots, pinned_env
    if pinned_env():
        return []
    slots = default_slots(limits)
    return slots if len(slots) > 1 else []


@dataclass
class Chunk:
    """One sandbox job's cases, as _chunked plans it and run_chunks runs it."""
    cases: list[Case]
    est_s: float  # estimated seconds of calls (sizes the job's limits)
    phase: int  # a phase's jobs are all judged before the next phase's first one starts
    parallel: bool  # may run on a slot alongside the phase's other jobs
    soft_s: float = 0.0  # the child starts no call past this (Runner.chunk); the cases left go to the next phase
    groups: tuple[int, ...] = ()  # Runner.chunk: the first cases' calls made group by group, before the rest's


def _made(runner: _Runner, planned, skipped: dict[str, str], start: int = 0):
    """(index, Case) for each planned case, inputs made as each is asked for; a shape the trusted generator refuses (the
    heuristic larger one, say) is noted in `skipped`. start: the first case's number (its id and its seeds)."""
    for i in range(len(planned)):
        t0 = time.perf_counter()
        try:
            yield i, make_case(runner.spec, start + i, planned[i], runner.seed)
        except Exception as e:  # noqa: BLE001 -- any refusal of the generator is a skipped shape, not a verdict
            skipped.setdefault(json_shape(planned[i][0]), f"{type(e).__name__}: {e}"[:120])
        finally:
            with runner.lock:
                runner.parent_s += time.perf_counter() - t0


def _chunked(runner: _Runner, planned, skipped: dict[str, str], lanes: int, start: int = 0):
    """The jobs of a run, in plan order. Phase 0 is one job with a soft deadline (FIRST_JOB_SOFT_S): the first case's
    calls, then the other smoke cases', then the rest's, as far as CHUNK_BYTES of inputs goes; most wrong candidates
    are turned away there, most small plans end there, and it measures the candidate's speed. Phase 1 is what it
    left (runner.leftover) and the rest, in chunks of at most CHUNK_BYTES and a time budget estimated from those
    measurements, split `lanes` ways when worth it (PARALLEL_MIN_S). run_chunks finishes phase 0 before asking for
    phase 1."""
    first_smoke = planned[0][1:3]
    n_smoke = next((i for i, p in enumerate(planned) if p[1:3] != first_smoke or p[3] != schedule.FULL), len(planned))
    made = _made(runner, planned, skipped, start)
    runner.leftover = []  # an earlier run_chunks' leftovers were run in its own phase 1
    first: list[tuple[int, Case]] = []
    size, pending = 0, None
    for i, c in made:
        n = c.nbytes()
        if first and size + n > CHUNK_BYTES:
            pending = (i, c)
            break
        first.append((i, c))
        size += n
    if first:
        smoke = sum(1 for i, _ in first if i < n_smoke)
        yield Chunk([c for _, c in first], 0.0, 0, False, FIRST_JOB_SOFT_S, (1, smoke - 1) if smoke > 1 else (1,))
    todo = list(runner.leftover) + ([pending[1]] if pending else [])
    later = (planned[pending[0] + 1:] if pending else [])
    rest_s = sum(map(runner.estimate_s, todo)) + sum(map(runner.estimate_planned, later))
    parallel = lanes > 1 and rest_s >= PARALLEL_MIN_S
    cap_s = CHUNK_TIME_FRACTION * runner.limits.timeout_s
    budget_s = min(cap_s, rest_s / lanes) if parallel else cap_s
    chunk: list[Case] = []
    chunk_bytes = est = 0.0
    for c in [*todo, *(c for _, c in made)]:
        n, t = c.nbytes(), runner.estimate_s(c)
        if chunk and (chunk_bytes + n > CHUNK_BYTES or est + t > budget_s):
            yield Chunk(chunk, est, 1, parallel)
            chunk, chunk_bytes, est = [], 0.0, 0.0
        chunk.append(c)
        chunk_bytes, est = chunk_bytes + n, est + t
    if chunk:
        yield Chunk(chunk, est, 1, parallel)


def run_chunks(runner: _Runner, chunks, slots: list) -> None:
    """Run each Chunk of `chunks`: in this thread, or on the slots when parallel, at most one job per slot (so at most
    len(slots) chunks' inputs in memory); every job of a phase is judged before the next phase starts, and the cases
    a soft deadline left are put in runner.leftover for it. Once a job fails no further chunk starts; the failure
    earliest in plan order is raised (_Stop)."""
    from autokernel.sandbox.slots import pinned
    free: queue.Queue = queue.Queue()
    for s in slots:
        free.put(s)
    failures: dict[int, _Stop] = {}

    def lane(ch: Chunk, job: int, slot) -> None:
        try:
            with pinned(slot):
                runner.chunk(ch.cases, ch.est_s, job)
        except _Stop as stop:
            failures[job] = stop
        finally:
            free.put(slot)

    with ThreadPoolExecutor(max_workers=max(len(slots), 1)) as pool:
        futures: list = []
        current = None
        for job, ch in enumerate(chunks):
            if ch.phase != current:  # a phase's jobs all judged before the next one's start
                for f in futures:
                    f.result()
                futures, current = [], ch.phase
            if failures:
                break
            if not (ch.parallel and slots):
                runner.leftover += runner.chunk(ch.cases, ch.est_s, job, ch.soft_s, ch.groups)
                continue
            slot = free.get()
            if failures:
                free.put(slot)
                break
            futures.append(pool.submit(lane, ch, job, slot))
        for f in futures:
            f.result()
    if failures:
        raise failures[min(failures)]


def _split_time(runner: _Runner, t0: float, runtime: StageResult, numeric: StageResult | None):
    """The two stages share one run: numeric's time is the parent's own work (making inputs, references and judging
    every output), runtime's the rest of the wall clock (the sandbox jobs, and their start-up). Jobs on several slots
    overlap each other and the parent's work: metrics sandbox_s sums their wall clocks."""
    wall = time.perf_counter() - t0
    runtime.elapsed_s = round(max(wall - runner.parent_s, 0.0), 3)
    if numeric is not None:
        numeric.elapsed_s = round(min(runner.parent_s, wall), 3)
    return runtime, numeric


def json_shape(shape: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())
