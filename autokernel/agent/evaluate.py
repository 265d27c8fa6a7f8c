"""What a submitted candidate earns: the gate's verdict and, only if the gate accepts it, the benchmark's measurement.

The Evaluator is a Protocol so the loop can be tested with a stub; the real one writes the candidate to
sandbox/<run>/<sha8>/<op>.py, runs autokernel.gate.verify and then the benchmark (both run candidate code only in
the sandbox), and answers with Feedback: the same facts a person reviewing the candidate would read. A source
already evaluated (same sha256) is answered from memory, never evaluated again. Its two halves are also callable
apart, gate() and bench(), so parallel workers (autokernel/agent/workers.py) can gate several candidates at once and
still time them one at a time.

Given a `deadline` (the session's, autokernel/agent/loop.py), an evaluation never plans past it: the gate's
sandbox jobs run under sandbox.timeout_s capped at the time left, the bench's max_time_s likewise, a bench that cannot
fit is not started, and a deadline that passes (or a sandbox.timeout under the capped limit: our clock, not the
candidate's fault) raises the built-in TimeoutError, which ends the session as spent budget, never as a rejection.
When that happens after the gate accepted the candidate, the TimeoutError is an Unbenched carrying the gate's verdict:
the session keeps it (the ledger, the run's state) and `autokernel run --resume RUN` benchmarks it without gating
it again (autokernel/run.py), so a verdict that took minutes is never thrown away for lack of time.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from autokernel import device
from autokernel import ops as opspecs
from autokernel.candidate import Candidate
from autokernel.deadline import Deadline
from autokernel.errors import UserError
from autokernel.paths import Layout
from autokernel.policy import Policy

if TYPE_CHECKING:
    from autokernel.bench.measure import Measurement
    from autokernel.cluster import Executor


@dataclass
class Feedback:
    op: str
    sha256: str  # of the candidate's source
    verdict: str  # the gate's: 'accepted' | 'rejected'
    reasons: list[dict] = field(default_factory=list)  # failed stages: {stage, code, detail}; [] when it passed
    stages: list[dict] = field(default_factory=list)  # every stage run: {name, passed, reason, detail}
    accepted: bool = False  # the gate accepted AND the benchmark measured a plausible win clearing the policy
    speedup: float | None = None  # call-weighted over the shape corpus, incumbent time / candidate time
    speedup_ci: list[float] | None = None  # [lo, hi] at the policy's confidence
    pct_of_peak: float | None = None  # of the roofline, call-weighted over the corpus
    incumbent_pct_of_peak: float | None = None
    implausible: bool = False
    per_shape: list[dict] = field(default_factory=list)  # {shape, calls, speedup, ci, pct_of_peak, ...}
    device: str = ""  # 'cuda' | 'cpu-interpreter'
    note: str = ""  # e.g. that CPU timings are interpreter timings, never GPU speed
    path: str = ""  # where the candidate was written
    duplicate: bool = False  # answered from memory: this exact source was evaluated before
    seed: int | None = None  # the gate's input seed, revealed after the candidate's process is gone
    isolation: str = ""  # how the gate's sandboxed stages ran (e.g. bwrap+cgroup), from its own stage results

    @property
    def summary(self) -> str:
        if self.verdict != "accepted":
            r = self.reasons[0] if self.reasons else {"code": "?", "detail": ""}
            return f"rejected by the gate: {r['code']}: {r['detail']}"
        if self.speedup is None:
            return "passed the gate; not benchmarked" + (f" ({self.note})" if self.note else "")
        ci = f" [{self.speedup_ci[0]:.3f}, {self.speedup_ci[1]:.3f}]" if self.speedup_ci else ""
        pct = f", {self.pct_of_peak:.2f} % of peak" if self.pct_of_peak is not None else ""
        why = "accepted" if self.accepted else ("implausible" if self.implausible else "no significant win")
        return f"passed the gate; speedup {self.speedup:.3f}x{ci}{pct}: {why}"

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, **asdict(self)}

    def to_text(self) -> str:
        """What the model reads: the verdict as JSON, the one-line summary first."""
        d = self.to_dict()
        d.pop("stages")  # the failing ones are in reasons; passing ones are noise for the model
        d.pop("isolation")
        return json.dumps(d, indent=1, default=str)

    def brief(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "verdict": self.verdict, "reason": self.reasons[0]["code"] if self.reasons
                else None, "accepted": self.accepted, "speedup": self.speedup, "pct_of_peak": self.pct_of_peak}


class Unbenched(TimeoutError):
    """The deadline passed after the gate accepted a candidate and before its benchmark could end: `feedback` is the
    gate's verdict, not yet timed (neither a rejection nor a measurement)."""

    def __init__(self, message: str, feedback: Feedback):
        super().__init__(message)
        self.feedback = feedback


class Evaluator(Protocol):
    """How a candidate is judged, whole: the session calls evaluate (and check, and bench for a gate acceptance the
    ledger holds: loop.Session.evaluate), parallel workers gate and bench apart (workers.py), and `autokernel run`
    confirms the winner before committing. SandboxEvaluator, target.run.TargetEvaluator, the wrappers round them
    (workers._Seat, run.Shown) and the tests' doubles implement every method; callers call them directly.

    Every method takes the Candidate (autokernel/candidate.py) made where the source entered (the session's
    submission, check_candidate's draft, a kept file re-read by --resume): its op, bytes and sha256, so no
    implementation hashes the source again. `deadline` is the session's: a call that cannot finish by it raises
    TimeoutError (evaluate.Unbenched after a gate acceptance)."""

    def evaluate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        """Judge one complete candidate file for kernels/<op>.py: gate, then (accepted) bench."""
        ...

    def gate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        """The gate's verdict alone, not yet timed; gates of different sources may run at once."""
        ...

    def bench(self, candidate: Candidate, feedback: Feedback, deadline: Deadline = Deadline.none()) -> Feedback:
        """The benchmark of a candidate the gate accepted (`feedback`, its verdict), filling in its figures; one at
        a time on a device."""
        ...

    def check(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> dict | None:
        """check_candidate's sandboxed look at a draft (agent/check.py): {passed, findings, checked}; None where
        this evaluator has no quick check (the model is told there is none)."""
        ...

    def confirm(self, candidate: Candidate) -> Measurement:
        """A fresh benchmark of an accepted candidate against the incumbent: what `autokernel run` commits on."""
        ...


def from_verdict(v: Any) -> Feedback:
    """The gate's Verdict (autokernel.gate.verdict) as Feedback, before any measurement."""
    stages = [{"name": s.name, "passed": s.passed, "reason": s.reason, "detail": s.detail,
               "elapsed_s": s.elapsed_s, "metrics": dict(s.metrics or {})} for s in v.stages]
    reasons = [{"stage": s.name, "code": s.reason, "detail": s.detail} for s in v.stages if not s.passed]
    isolation = next((str(s.metrics["isolation"]) for s in v.stages if (s.metrics or {}).get("isolation")), "")
    return Feedback(op=v.op, sha256=v.candidate_sha256, verdict=v.verdict, reasons=reasons, stages=stages,
                    device=(v.device or {}).get("kind", ""), note=(v.device or {}).get("timing_note", ""),
                    path=str(v.candidate), seed=v.seed, isolation=isolation)


def gate_record(fb: Feedback) -> dict:
    """The gate's facts about an accepted candidate as the delivery report takes them (autokernel.git.report)."""
    return {"seed": fb.seed, "isolation": fb.isolation, "sha256": fb.sha256,
            "stages": [s for s in fb.stages if s.get("name") != "bench"]}


class SandboxEvaluator:
    """gate.verify, then (if the gate accepts) the benchmark, for candidates written under `run_dir`.

    `trace` (a traces/<run>/ directory or its summary.json) gives the shapes and call weights; without one, the
    spec's model shapes, one call each. `policy` is the run's (policy.for_checkout's). `layout` is the target
    checkout (autokernel.paths, resolved by the command): its kernels/<op>.py is the incumbent the gate checks
    signatures against and the bench times. `verify_kwargs` narrows the gate's case
    grid (tests only). `executor` (autokernel/cluster.py: a Ray cluster) runs the gate and bench jobs; None: here.
    """

    def __init__(self, run_dir: str | Path, policy: Policy, trace: str | Path | None = None,
                 seed: int | None = None, verify_kwargs: dict | None = None, *, layout: Layout,
                 executor: Executor | None = None):
        self.run_dir, self.policy, self.trace = Path(run_dir), policy, trace
        self.seed, self.verify_kwargs = seed, verify_kwargs or {}
        self.layout = layout
        self.seen: dict[str, Feedback] = {}
        self._checks = itertools.count(1)
        self.executor = executor

    def cases(self, op: str) -> list[dict]:
        """[{shape, calls, dtype}] as the benchmark takes them."""
        default = str(device.default_dtype()).removeprefix("torch.")
        if self.trace is None:
            return [{"shape": dict(s), "calls": 1, "dtype": default} for s in opspecs.get(op).model_shapes]
        from autokernel.profile import trace as trace_mod
        traced = trace_mod.cases(trace_mod.load_trace(self.trace, check_device=False), op)
        return [{**c, "dtype": c["dtype"] or default} for c in traced]

    def evaluate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        if candidate.sha256 in self.seen:
            return replace(self.seen[candidate.sha256], duplicate=True)
        feedback = self.gate(candidate, deadline)
        if feedback.verdict != "accepted":
            return feedback
        return self.bench(candidate, feedback, deadline)

    def gate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        """The gate's verdict alone, not yet timed. Gates of different sources may run at once (each on its own
        sandbox slot: autokernel/agent/workers.py); timings may not, so the benchmark is the separate bench()."""
        op, digest = candidate.op, candidate.sha256
        if deadline.expired():
            raise TimeoutError(f"{digest[:8]}: no time left for the gate")
        policy = capped(self.policy, deadline.left())
        job = self.run_dir / digest[:8]
        path = candidate.write(job)
        from autokernel import gate
        shapes = [c["shape"] for c in self.cases(op)] if self.trace is not None else None
        verify = gate.verify if self.executor is None else self.executor.verify
        verdict = verify(op, path, shapes=shapes, seed=self.seed, policy=policy, run_dir=job,
                         kernels_dir=self.layout.kernels, **self.verify_kwargs,
                         time_left_s=deadline.left())  # seconds: the executor may run it on another machine
        feedback = from_verdict(verdict)
        feedback.sha256, feedback.path = digest, str(path)
        if policy.sandbox.timeout_s < self.policy.sandbox.timeout_s and any(
                r["code"] == "sandbox.timeout" for r in feedback.reasons):
            raise TimeoutError(f"{digest[:8]}: a gate job hit the deadline-capped limit of "
                               f"{policy.sandbox.timeout_s:.3g} s (the session's clock, not the candidate's fault)")
        if not verdict.accepted:
            self._keep(job, feedback)
        return feedback

    def bench(self, candidate: Candidate, feedback: Feedback, deadline: Deadline = Deadline.none()) -> Feedback:
        """The benchmark of a candidate gate() accepted, filling in `feedback`'s figures: one at a time on a device
        (the caller's job when several sessions share it). It times the copy at `feedback.path`."""
        op, digest, path = candidate.op, feedback.sha256, Path(feedback.path)
        gated = replace(feedback, reasons=list(feedback.reasons), stages=list(feedback.stages))  # before any figure
        if deadline.expired():
            raise Unbenched(f"{digest[:8]} passed the gate with no time left for its benchmark", gated)
        left, need = deadline.left(), bench_floor_s(self.policy)
        if left < need:
            raise Unbenched(f"{digest[:8]} passed the gate; its benchmark needs at least ~{need:.3g} s "
                            f"({self.policy.bench.rounds} rounds) and {left:.3g} s are left", gated)
        policy = capped(self.policy, left)
        measure(feedback, op, path, path.parent, self.cases(op), policy, self.layout.kernel_file(op), self.executor)
        if policy.sandbox.timeout_s < self.policy.sandbox.timeout_s and any(
                r["stage"] == "bench" and r["code"] == "sandbox.timeout" for r in feedback.reasons):
            raise Unbenched(f"{digest[:8]} passed the gate; a bench job hit the deadline-capped limit of "
                            f"{policy.sandbox.timeout_s:.3g} s (the session's clock, not the candidate's fault)", gated)
        self._keep(path.parent, feedback)
        return feedback

    def _keep(self, job: Path, feedback: Feedback) -> None:
        """The final verdict: written beside the candidate, and remembered (the same source is never judged twice)."""
        (job / "feedback.json").write_text(json.dumps(feedback.to_dict(), indent=1, default=str) + "\n")
        self.seen[feedback.sha256] = feedback

    def check(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> dict:
        """check_candidate's sandboxed part (autokernel/agent/check.py): static + a narrowed numeric check on the
        cheapest traced shape, its sandbox jobs capped at `deadline`; never benchmarked, never remembered as a
        submission."""
        from autokernel.agent.check import quick_check
        if deadline.expired():
            raise TimeoutError("no time left for a check")
        job = self.run_dir / "checks" / f"{next(self._checks):03d}-{candidate.sha256[:8]}"  # atomic under threads
        shapes = [c["shape"] for c in self.cases(candidate.op)]
        return quick_check(candidate, job, capped(self.policy, deadline.left()), self.layout.kernels, shapes)

    def confirm(self, candidate: Candidate) -> Measurement:
        """A fresh benchmark of an accepted source against the incumbent (the session's best of several noisy
        measurements is biased upwards): the Measurement the commit reports, or UserError if the incumbent fails."""
        from autokernel.bench.measure import IncumbentFailed
        from autokernel.bench.measure import measure as bench
        bench = bench if self.executor is None else self.executor.measure
        op = candidate.op
        path = candidate.write(self.run_dir / f"confirm-{candidate.sha256[:8]}")
        job = path.parent
        try:
            return bench(op, [path], self.cases(op), self.policy, job, incumbent=self.layout.kernel_file(op))
        except IncumbentFailed as e:
            raise UserError(str(e)) from None


def capped(policy: Policy, left_s: float) -> Policy:
    """The policy with every sandbox job's wall clock and the bench's time cap at most `left_s` (inf: as is)."""
    sb, bench = policy.sandbox, policy.bench
    return policy.model_copy(update={"sandbox": sb.model_copy(update={"timeout_s": min(sb.timeout_s, left_s)}),
                                     "bench": bench.model_copy(update={"max_time_s": min(bench.max_time_s, left_s)})})


def bench_floor_s(policy: Policy) -> float:
    """The least a benchmark can take (its first `rounds` rounds always run; incumbent + candidate, each timed for
    bench.job_time_s): a lower bound, used only to not start one that cannot end before the deadline."""
    return policy.bench.rounds * 2 * policy.bench.job_time_s


def _pct(shapes: list) -> float | None:
    """Call-weighted % of peak over a file's shapes: sum(calls x floor) / sum(calls x median)."""
    if not shapes or any(s.fraction_of_peak is None for s in shapes):
        return None
    floor = sum(s.calls * s.fraction_of_peak * s.median_ms.est for s in shapes)
    return 100 * floor / sum(s.calls * s.median_ms.est for s in shapes)


def measure(feedback: Feedback, op: str, path: Path, job: Path, cases: list[dict], policy: Policy,
            incumbent: Path, executor: Executor | None = None) -> None:
    """Fill in the benchmark's figures: the target's kernels/<op>.py vs the candidate, A/B in the sandbox (of this
    machine, or of a cluster node: `executor`, autokernel/cluster.py)."""
    from autokernel.bench.measure import IncumbentFailed
    from autokernel.bench.measure import measure as bench
    bench = bench if executor is None else executor.measure
    try:
        m = bench(op, [path], cases, policy, job, incumbent=incumbent)
    except IncumbentFailed as e:  # the environment, not the candidate: stop the session (exit 2)
        raise UserError(str(e)) from None
    inc, cand = m.files[0], m.files[-1]
    feedback.note = m.label
    feedback.incumbent_pct_of_peak = _pct(inc.shapes)
    if cand.status != "ok":  # failed while being timed (re-checked outputs, crash, timeout): a rejection
        feedback.verdict = "rejected"
        feedback.reasons.append({"stage": "bench", "code": cand.status, "detail": cand.detail})
        return
    assert cand.speedup is not None, "a candidate timed ok has its speedup"
    feedback.speedup = round(cand.speedup.est, 4)
    feedback.speedup_ci = [round(cand.speedup.lo, 4), round(cand.speedup.hi, 4)]
    feedback.pct_of_peak = _pct(cand.shapes)
    feedback.accepted, feedback.implausible = cand.accepted, cand.reason == "bench.implausible"
    if not cand.accepted:
        feedback.reasons.append({"stage": "bench", "code": cand.reason, "detail": cand.detail})
    feedback.per_shape = [{"shape": s.shape, "dtype": s.dtype, "calls": s.calls, "median_ms": round(s.median_ms.est, 6),
                           "speedup": s.speedup and round(s.speedup.est, 4),
                           "speedup_ci": s.speedup and [round(s.speedup.lo, 4), round(s.speedup.hi, 4)],
                           "pct_of_peak": None if s.fraction_of_peak is None else round(100 * s.fraction_of_peak, 3),
                           **({"implausible": s.implausible} if s.implausible else {})} for s in cand.shapes]
