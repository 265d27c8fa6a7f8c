"""Shared pieces of the agent tests: a stub Evaluator (the real gate is tested in tests/gate), a scripted Model,
and candidate sources (one that cheats, one that is a real kernel). Imported by name; fixtures live in conftest.py."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from autokernel.agent.evaluate import Feedback
from autokernel.agent.search import apply, find_knobs
from autokernel.bench.measure import Measurement
from autokernel.candidate import Candidate
from autokernel.deadline import Deadline

ROOT = Path(__file__).resolve().parents[2]
KERNEL_FILE = ROOT / "kernels" / "rmsnorm.py"  # the incumbent the prompts show (prompt.build's kernel_file)
INCUMBENT = KERNEL_FILE.read_text()
# A correct rmsnorm planted slow: BLOCK_N=256 walks each 576-wide row in 3 chunks, twice (fixtures/ says why).
PLANTED = (Path(__file__).parent / "fixtures" / "rmsnorm_small_block.py").read_text()

# docs/shortcuts.md #1: call the library instead of launching a kernel.
CHEAT = '''import torch
import torch.nn.functional as F


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)
'''
# A real kernel: the incumbent with num_warps=8.
_knobs = find_knobs(INCUMBENT)
GOOD = apply(INCUMBENT, _knobs, {"num_warps": 8, "num_stages": 3})
assert GOOD != INCUMBENT and "num_warps=8" in GOOD


def sha256(source: str) -> str:
    """The digest a test expects for `source` (what Candidate.of computes where a source enters)."""
    return Candidate.of("rmsnorm", source).sha256


class WholeEvaluator:
    """The rest of the Evaluator protocol for a double judged in one call (its evaluate, figures included): gate()
    is that whole judgement and bench() keeps its figures; no quick check; never confirms."""

    def evaluate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        raise NotImplementedError

    def gate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        return self.evaluate(candidate, deadline)

    def bench(self, candidate: Candidate, feedback: Feedback, deadline: Deadline = Deadline.none()) -> Feedback:
        return feedback

    def check(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> dict | None:
        return None

    def confirm(self, candidate: Candidate) -> Measurement:
        raise AssertionError("the agent's tests never confirm a win (tests/run does)")


class StubEvaluator:
    """An Evaluator (agent/evaluate.py) with fixed verdicts. Gate: rejects sources that import torch.nn.functional
    (static.forbidden_import, as the real gate does), passes anything else. Bench: speedup 1.25 [1.20, 1.30] and 42 %
    of peak, accepted. Counts evaluations; same sha256 answered once. No quick check (check: None); the agent's tests
    never confirm."""

    def __init__(self, speedup: float = 1.25, pct_of_peak: float = 42.0):
        self.speedup, self.pct = speedup, pct_of_peak
        self.calls: list[str] = []
        self.seen: dict[str, Feedback] = {}

    def evaluate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        digest = candidate.sha256
        if digest in self.seen:
            return self.seen[digest]
        self.calls.append(candidate.text)
        fb = self.gate(candidate, deadline)
        if fb.verdict == "accepted":
            fb = self.bench(candidate, fb, deadline)
        self.seen[digest] = fb
        return fb

    def gate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        if "torch.nn.functional" in candidate.text:
            return Feedback(candidate.op, candidate.sha256, "rejected",
                            reasons=[{"stage": "static", "code": "static.forbidden_import",
                                      "detail": "line 2: import torch.nn.functional: a kernel file computes in its "
                                                "own Triton kernel"}])
        return Feedback(candidate.op, candidate.sha256, "accepted", device="cpu-interpreter", note="stub")

    def bench(self, candidate: Candidate, feedback: Feedback, deadline: Deadline = Deadline.none()) -> Feedback:
        s = self.speedup
        return replace(feedback, accepted=True, speedup=s, speedup_ci=[s - 0.05, s + 0.05], pct_of_peak=self.pct)

    def check(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> dict | None:
        return None

    def confirm(self, candidate: Candidate) -> Measurement:
        raise AssertionError("the agent's tests never confirm a win (tests/run does)")


def turn(text: str = "", *calls: tuple, input_tokens: int = 0, output_tokens: int = 0, usd: float = 0.0,
         truncated: bool = False) -> dict:
    """An assistant message in the neutral format; calls are (name, arguments) pairs."""
    return {"role": "assistant", "content": text,
            "tool_calls": [{"id": f"t{i}", "name": n, "arguments": a} for i, (n, a) in enumerate(calls)],
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens, "usd": usd, "estimated": False},
            "truncated": truncated}


class ScriptedModel:
    """A Model that replays assistant messages in order (mini-swe-agent's DeterministicModel) and records what it
    was shown; `on_query(messages)` runs before each reply (tests inspect the saved transcript there)."""

    def __init__(self, replies: list[dict], on_query=None):
        self.replies, self.on_query = list(replies), on_query
        self.name, self.prices, self.model = "scripted", None, None
        self.seen: list[list[dict]] = []
        self.time_left: list[float] = []  # the seconds left to the deadline the loop passed with each query

    def query(self, messages: list[dict], tools: list[dict], deadline: Deadline = Deadline.none()) -> dict:
        self.seen.append([dict(m) for m in messages])
        self.time_left.append(deadline.left())
        if self.on_query:
            self.on_query(messages)
        return self.replies.pop(0)
