"""The agent loop: run() loops over step(); a small exception tree ends it; the message list is the
transcript, written to sandbox/<run>/transcript.json after every step with its token counts and cost.

The model is anything with `query(messages, tools, deadline) -> assistant message` (providers.Model): an LLM
through its SDK, the offline search, or a scripted model in tests. Every candidate goes through the same Evaluator
(gate, then bench). agent.max_wall_s is one deadline for the session (Session.deadline, autokernel/deadline.py): it
goes to every model call and every evaluation, and one that runs out ends the session as spent budget.
A model that cannot be used (ModelError: the server kept failing, replies never parsed) ends it with Result.error
set: an environment failure, never "no improvement". A candidate the gate accepted when no time was left for its
benchmark (evaluate.Unbenched) ends the session as spent budget and is kept in Result.unbenched (and the ledger):
`autokernel run --resume` benchmarks it; Result.replies says whether the model answered at all.

Tools: read_kernel and read_spec are answered from the prompt; check_candidate (a quick sandboxed look at a draft,
budgeted apart from submissions) is handled in check.py; submit_candidate goes to the Evaluator, unless the same
source was judged before: in this session or by another worker on the op (a duplicate) or, with a Ledger, in an
earlier run on this device (ledger.py), or already delivered on a branch over the same base (Ledger.delivered: kept
in Result.delivered, never gated or committed again). None is counted, and every new judgement is added to the
ledger. A source whose gate acceptance the ledger holds for this base, device and policy is benchmarked without
gating it again (Session.evaluate; counted: it is this session's measurement). With
agent.workers > 1 several Sessions share one evaluator (workers.py); `stop_early` ends this one when another wins.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from autokernel.agent.check import CheckTool
from autokernel.agent.evaluate import Evaluator, Feedback, Unbenched
from autokernel.agent.ledger import Ledger, answer, delivered_answer
from autokernel.agent.prompt import Prompt, feedback_text, tools_file
from autokernel.agent.providers import Model, ModelError
from autokernel.candidate import Candidate
from autokernel.deadline import Deadline
from autokernel.policy import Agent as AgentPolicy


class Stop(Exception):
    """Ends the session; the message says why and is kept in the transcript."""
    status = "stopped"


class Finished(Stop):
    status = "finished"  # the model called finish()


class TargetReached(Stop):
    status = "target_reached"  # an accepted candidate reached the policy's fraction of peak


class LimitReached(Stop):
    status = "limit"  # submissions, tokens, USD or wall time spent


class EarlySuccess(Stop):
    status = "early_success"  # another worker on this op has an accepted candidate (agent/workers.py)


@dataclass
class Submission:
    candidate: Candidate  # as submitted: op, bytes and the sha256 its feedback names
    feedback: Feedback

    @property
    def source(self) -> str:
        return self.candidate.text


@dataclass
class Result:
    op: str
    status: str  # finished | target_reached | limit | early_success | model_error | error
    detail: str
    best: Submission | None  # the accepted candidate with the highest weighted speedup, or none
    transcript: Path
    usage: dict  # input_tokens, output_tokens, usd over the session
    submitted: int
    error: str | None = None  # one line when the model could not be used (status model_error): not a clean negative
    unbenched: list[Submission] = field(default_factory=list)  # passed the gate, out of time before the benchmark
    replies: int = 0  # assistant turns the model sent (0: it never answered)
    delivered: list[dict] = field(default_factory=list)  # {branch, commit, base} of sources already delivered
    cut: int = 0  # evaluations the deadline cut before the gate's verdict (the candidate was not judged)


class Session:
    def __init__(self, op: str, model: Model, evaluator: Evaluator, prompt: Prompt, policy: AgentPolicy,
                 run_dir: str | Path, clock: Callable[[], float] = time.monotonic, ledger: Ledger | None = None,
                 stop_early: Callable[[], str | None] | None = None):
        self.op, self.model, self.evaluator, self.prompt, self.policy = op, model, evaluator, prompt, policy
        self.ledger = ledger  # earlier runs' judgements (agent/ledger.py): shown first, never re-evaluated
        self.stop_early = stop_early  # () -> why another worker's win ends this session, or None (agent/workers.py)
        self.transcript = Path(run_dir) / "transcript.json"
        self.tools, self.replies = tools_file()["tools"], tools_file()["replies"]
        self.messages: list[dict] = []
        self.candidates: list[Submission] = []
        self.unbenched: list[Submission] = []  # accepted by the gate, not benchmarked: the deadline came first
        self.delivered: list[dict] = []  # sources already on a branch over this base (Ledger.delivered)
        self.cut = 0  # evaluations the deadline cut before the gate's verdict
        self.recalled = 0  # submissions answered from an earlier run's verdict (the ledger): not counted, not judged
        self.usage = {"input_tokens": 0, "output_tokens": 0, "usd": 0.0}
        self.finished: str | None = None
        self.status, self.detail, self.clock = "running", "", clock
        self.error: str | None = None
        self.t0 = clock()
        self.check = CheckTool(evaluator.check, policy, self.replies, clock)  # check_candidate

    def run(self) -> Result:
        self.t0 = self.clock()
        earlier = self.ledger.brief(self.op, incumbent=self.prompt.kernel) if self.ledger else ""
        self.messages = [{"role": "system", "content": self.prompt.system},
                         {"role": "user", "content": self.prompt.task + (f"\n\n{earlier}\n" if earlier else "")}]
        try:
            while True:
                self.step()
        except Stop as e:
            self.status, self.detail = e.status, str(e)
        except ModelError as e:
            self.status, self.detail, self.error = "model_error", str(e), str(e)
        finally:
            if self.status == "running":  # an exception we do not handle (UserError) is on its way out
                self.status = "error"
            self.save()
        return Result(self.op, self.status, self.detail, self.best, self.transcript, dict(self.usage),
                      len(self.candidates), self.error, list(self.unbenched),
                      sum(m["role"] == "assistant" for m in self.messages), list(self.delivered), self.cut)

    def step(self) -> None:
        self.check_limits()
        try:
            reply = self.model.query(self.messages, self.tools, self.deadline)
        except TimeoutError as e:
            raise self.out_of_time(f"during a model call: {e}") from None
        self.messages.append(reply)
        for k in self.usage:
            self.usage[k] += (reply.get("usage") or {}).get(k, 0)
        for call in reply.get("tool_calls") or []:  # a cut-off reply's calls are incomplete: none is run
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content":
                                  self.replies["truncated"] if reply.get("truncated") else self.execute(call)})
        if not reply.get("tool_calls"):
            self.messages.append({"role": "user",
                                  "content": self.replies["truncated" if reply.get("truncated") else "no_tool_call"]})
        self.save()

    @property
    def deadline(self) -> Deadline:
        """agent.max_wall_s from the session's start, on its clock."""
        return Deadline(self.t0 + self.policy.max_wall_s, self.clock)

    def out_of_time(self, when: str) -> LimitReached:
        return LimitReached(f"wall_s budget spent: {self.clock() - self.t0:.6g} of {self.policy.max_wall_s:g} "
                            f"({when})")

    def check_limits(self) -> None:
        p, best, n = self.policy, self.best, len(self.candidates)
        if self.finished is not None:
            raise Finished(self.finished)
        if self.stop_early and (why := self.stop_early()):
            raise EarlySuccess(why)
        if best and (best.feedback.pct_of_peak or 0) >= 100 * p.target_fraction_of_peak:
            raise TargetReached(f"{best.feedback.sha256[:8]} reached {best.feedback.pct_of_peak:.1f} % of peak "
                                f"(target {100 * p.target_fraction_of_peak:g} %)")
        tokens, wall_s = self.usage["input_tokens"] + self.usage["output_tokens"], self.clock() - self.t0
        for spent, used, limit in (("submissions", n, p.max_iterations), ("tokens", tokens, p.max_tokens),
                                   ("usd", self.usage["usd"], p.max_usd), ("wall_s", wall_s, p.max_wall_s)):
            if used >= limit:
                raise LimitReached(f"{spent} budget spent: {used:.6g} of {limit:g}")

    def execute(self, call: dict) -> str:
        name, args = call["name"], call["arguments"]
        if not isinstance(args, dict):
            return self.replies["bad_arguments"].format(name=name, arguments=args)
        if name == "read_kernel":
            return self.prompt.kernel
        if name == "read_spec":
            return self.prompt.spec
        if name == "finish":
            self.finished = str(args.get("summary") or "the model called finish")
            return self.replies["finished"]
        if name == "check_candidate":  # free: budgeted apart from submissions (agent.max_checks, max_check_s)
            try:
                return self.check(self.op, args, self.deadline)
            except TimeoutError as e:
                raise self.out_of_time(f"during a check: {e}") from None
        if name != "submit_candidate":
            return self.replies["unknown_tool"].format(name=name)
        return self.submit(args)

    def submit(self, args: dict) -> str:
        source = args.get("source")
        if not isinstance(source, str) or not source.strip():
            return self.replies["no_source"]
        earlier = next((c for c in self.candidates if c.source == source), None)
        if earlier is not None:  # answered from memory and not counted, as the system prompt promises
            return self.feedback(replace(earlier.feedback, duplicate=True))
        candidate = Candidate.of(self.op, source)  # the one hash of this submission
        where = self.ledger.delivered(candidate) if self.ledger else None
        if self.ledger and where is not None:  # the same change is already on a branch: no second gate, commit or PR
            if where not in self.delivered:
                self.delivered.append(where)
            return delivered_answer(self.op, where, self.ledger.measured(self.op, candidate.sha256))
        known = self.ledger.judged(self.op, candidate.sha256) if self.ledger else None
        if known is not None:  # judged in an earlier run on this device: answered, not counted
            self.recalled += 1
            return answer(known)
        if len(self.candidates) >= self.policy.max_iterations:
            return self.replies["out_of_submissions"].format(max_iterations=self.policy.max_iterations)
        if self.deadline.expired():
            return self.replies["out_of_time"]
        try:
            feedback = self.evaluate(candidate)
        except Unbenched as e:  # the gate's verdict is kept, and benchmarked by `autokernel run --resume`
            self.candidates.append(Submission(candidate, e.feedback))
            self.unbenched.append(self.candidates[-1])
            if self.ledger:
                self.ledger.record(e.feedback, run=self.transcript.parent.name)
            raise self.out_of_time(f"during an evaluation: {e}") from None
        except TimeoutError as e:
            self.cut += 1
            raise self.out_of_time(f"during an evaluation: {e}") from None
        if feedback.duplicate:  # another worker's judgement of the same source (agent/workers.py): not counted
            return self.feedback(feedback)
        self.candidates.append(Submission(candidate, feedback))
        if self.ledger:
            self.ledger.record(feedback, run=self.transcript.parent.name, candidate=candidate)
        return self.feedback(feedback)

    def evaluate(self, candidate: Candidate) -> Feedback:
        """The evaluator's gate and bench; only the bench where the ledger holds this session's own kind of
        acceptance of the source (Ledger.gated: same base, device and policy, signed). The copy benchmarked is
        written where no candidate ran (<run>/ledger-<sha8>/)."""
        gated = self.ledger.gated(candidate) if self.ledger else None
        if gated is None:
            return self.evaluator.evaluate(candidate, self.deadline)
        path = candidate.write(self.transcript.parent / f"ledger-{candidate.sha256[:8]}")
        g = gated["gate"]
        fb = Feedback(self.op, candidate.sha256, "accepted", stages=list(g.get("stages") or []), path=str(path),
                      seed=g.get("seed"), isolation=str(g.get("isolation") or ""), device=str(g.get("device") or ""))
        return self.evaluator.bench(candidate, fb, self.deadline)

    def feedback(self, fb: Feedback) -> str:
        return feedback_text(fb, self.policy.max_iterations - len(self.candidates), self.deadline.left())

    @property
    def best(self) -> Submission | None:
        wins = [c for c in self.candidates if c.feedback.accepted]
        return max(wins, key=lambda c: c.feedback.speedup or 0.0, default=None)

    def save(self) -> None:
        """The transcript, atomically: a crash mid-write leaves the previous step's file, never half a file."""
        best = self.best
        data = {
            "op": self.op, "model": self.model.name, "status": self.status, "detail": self.detail,
            "error": self.error, "elapsed_s": round(self.clock() - self.t0, 3), "budget": self.policy.model_dump(),
            "usage": {**self.usage, "usd": round(self.usage["usd"], 6),
                      "price_per_mtok": self.model.prices},
            "submitted": len(self.candidates),
            "best": best and {"sha256": best.feedback.sha256, "feedback": best.feedback.to_dict()},
            "candidates": [c.feedback.brief() for c in self.candidates],
            "unbenched": [c.feedback.sha256 for c in self.unbenched],
            "messages": self.messages,
        }
        self.transcript.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.transcript.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
        os.replace(tmp, self.transcript)
