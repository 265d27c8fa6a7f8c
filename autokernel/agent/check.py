"""check_candidate: a quick, free look at a draft before spending a submission on it.

The model may call check_candidate(source) up to agent.max_checks times, in agent.max_check_s seconds together, per
session. A check runs the gate's static stage (every finding, not just the first) and, only if the file passes it,
the runtime + numeric stages on a narrowed grid in the sandbox: the cheapest of the op's shapes (the gate still adds
its odd shapes and a larger one), the first dtype, the first value distribution, with a fresh secret seed of its own,
and no end-to-end stage, no benchmark. It runs the same gate.verify as a submission, so a check can only be stricter
than nothing and never weaker than the gate on the cases it runs; passing it promises nothing about the full gate.

    quick_check(candidate, ...) -> dict    the sandboxed part (SandboxEvaluator.check calls it)
    CheckTool(evaluator.check, policy, replies)(op, args, deadline) -> the loop's handler: budgets, the reply text
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from autokernel import ops as opspecs
from autokernel.candidate import Candidate
from autokernel.deadline import Deadline
from autokernel.policy import Agent as AgentPolicy
from autokernel.policy import Policy


def findings(stages: list) -> list[dict]:
    """Every failed stage's findings: the static stage's all (metrics['findings']), one per other stage."""
    out = []
    for s in stages:
        if s.passed:
            continue
        listed = (s.metrics or {}).get("findings") or []
        out += [{"stage": s.name, "code": f.get("reason"), "line": f.get("line"), "detail": f.get("detail")}
                for f in listed] or [{"stage": s.name, "code": s.reason, "detail": s.detail}]
    return out


def quick_shapes(op: str, shapes: list[dict] | None) -> list[dict]:
    """The one cheapest shape of the op's traced (or model) shapes: the check is for seconds, not a verdict."""
    from autokernel.gate.schedule import cost
    spec = opspecs.get(op)
    pool = [dict(s) for s in (shapes or spec.model_shapes)]
    return [min(pool, key=lambda s: cost(spec, s))] if pool else []


def quick_check(candidate: Candidate, job_dir: Path, policy: Policy, kernels_dir: Path,
                shapes: list[dict] | None = None) -> dict:
    """Static stage + a narrowed numeric check of `candidate` in the sandbox; {passed, findings, checked}."""
    from autokernel import gate
    from autokernel.gate.numeric import DISTS
    op = candidate.op
    spec = opspecs.get(op)
    path = candidate.write(job_dir)
    # one small shape: no production-range sweep and no calls past the CPU row cap (the submission's gate makes them)
    quick = policy.model_copy(update={"gate": policy.gate.model_copy(update={"max_rows": 0})})
    v = gate.verify(op, path, shapes=quick_shapes(op, shapes), seed=None, policy=quick, run_dir=job_dir,
                    dtypes=[spec.dtypes[0]], dists=[DISTS[0]], stages=[], kernels_dir=kernels_dir)
    ran = list(v.stages)
    checked = "; ".join(f"{s.name}: {'passed' if s.passed else s.reason}" + (f" ({s.detail})" if s.passed else "")
                        for s in ran)
    return {"passed": v.accepted, "findings": findings(ran), "checked": checked,
            "job_time_limit_s": round(policy.sandbox.timeout_s, 1)}  # a sandbox.timeout may be this cap's doing


class CheckTool:
    """The loop's side of check_candidate: the budgets, the sandboxed check (`run_check`: the Evaluator's .check;
    one that answers None has none), and the reply. A check that runs out of its own time budget is reported to the
    model; one that runs out of the session's time raises TimeoutError, which ends the session as spent budget
    (autokernel/agent/loop.py)."""

    def __init__(self, run_check: Callable[[Candidate, Deadline], dict | None], policy: AgentPolicy,
                 replies: dict, clock: Callable[[], float] = time.monotonic):
        self.run_check, self.none = run_check, False  # none: the evaluator said it has no quick check
        self.policy, self.replies, self.clock = policy, replies, clock
        self.used, self.spent_s = 0, 0.0
        self.seen: dict[str, dict] = {}  # source -> its report: the same draft again is answered, not counted

    def __call__(self, op: str, args: dict, deadline: Deadline) -> str:
        source = args.get("source")
        if not isinstance(source, str) or not source.strip():
            return self.replies["no_source"].replace("submit_candidate", "check_candidate")
        left_s = self.policy.max_check_s - self.spent_s
        if self.none or self.policy.max_checks == 0:
            return self.replies["no_checks"]
        if source in self.seen:
            return self.reply({**self.seen[source], "duplicate": True})
        if self.used >= self.policy.max_checks or left_s <= 0:
            return self.replies["out_of_checks"].format(max_checks=self.policy.max_checks,
                                                        max_check_s=self.policy.max_check_s)
        t0 = self.clock()
        try:
            report = self.run_check(Candidate.of(op, source), deadline.within(left_s))  # the draft's one hash
        except TimeoutError as e:
            if deadline.expired():
                raise
            report = {"passed": None, "findings": [], "checked": f"not finished: {e}"}
        if report is None:  # no quick check here: not counted, and not asked again
            self.none = True
            return self.replies["no_checks"]
        self.used += 1
        self.spent_s += self.clock() - t0
        if report.get("passed") is not None:
            self.seen[source] = report
        return self.reply(report)

    def reply(self, report: dict) -> str:
        report = {**report, "note": "a quick check (one small shape, one dtype, no end-to-end check, no timing): not "
                                    "a verdict, and no submission was used",
                  "checks_left": self.policy.max_checks - self.used,
                  "check_seconds_left": round(max(0.0, self.policy.max_check_s - self.spent_s), 1)}
        return json.dumps(report, indent=1, default=str)
