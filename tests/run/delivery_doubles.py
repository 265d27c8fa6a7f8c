"""Test doubles for the run's orchestration: a scripted model and a stub evaluator whose verdict and measurement
are fixed DATA (no sandbox, no interpreter timing). What they stand for is tested in tests/agent, tests/gate and
tests/bench; here they let the real path from session to commit run in a second."""
from __future__ import annotations

import datetime
import json
from dataclasses import replace
from pathlib import Path

from autokernel import device
from autokernel.agent.evaluate import Feedback
from autokernel.bench.measure import FileResult, Measurement, ShapeResult
from autokernel.bench.stats import Interval
from autokernel.candidate import Candidate
from autokernel.deadline import Deadline
from autokernel.profile.trace import SCHEMA

HOSTILE = "x[/]y \x1b[2J\x1b]0;owned\x07\x1b[32mACCEPTED\x1b[0m\r"  # markup closer, clear screen, OSC title


def today_branch(op: str) -> str:
    return f"autokernel/{datetime.date.today().isoformat()}-{op}"


def write_trace(path: Path, op: str = "rmsnorm") -> Path:
    """A minimal trace summary (one op, one shape) in the schema load_trace reads."""
    path.mkdir(parents=True, exist_ok=True)
    shape = {"shape": {"M": 4, "N": 576}, "calls": 60, "dtype": "float32", "bytes": 4 * 4 * 576 * 2 + 4 * 576,
             "flops": 4 * 4 * 576, "mean_ms": 0.5}
    (path / "summary.json").write_text(json.dumps({
        "schema": SCHEMA, "run_id": path.name, "device": device.fingerprint(), "kernels": "triton",
        "weights": "quant", "roofline": {}, "ops": {
            op: {"calls": 60, "total_ms": 30.0, "share": 0.1, "gbps": 0.1, "gflops": 0.1, "shapes": [shape]},
            "lm_head": {"calls": 10, "total_ms": 10.0, "share": 0.05, "gbps": 0.1, "gflops": 0.1, "shapes": []}}}))
    return path


def turn(text: str, *calls: tuple) -> dict:
    return {"role": "assistant", "content": text, "truncated": False,
            "tool_calls": [{"id": f"t{i}", "name": n, "arguments": a} for i, (n, a) in enumerate(calls)],
            "usage": {"input_tokens": 1000, "output_tokens": 200, "usd": 0.01, "estimated": False}}


class ScriptedModel:
    name, prices, model = "scripted:test", None, None

    def __init__(self, replies: list[dict]):
        self.replies = list(replies)

    def query(self, messages, tools, deadline=None):
        return self.replies.pop(0)


def measurement(op: str = "rmsnorm", speedup: float = 2.0) -> Measurement:
    inc = ShapeResult({"M": 4, "N": 576}, "float32", 60, 30, Interval(0.5, 0.49, 0.51), None, 0.1, 0.1, 0.01)
    new = ShapeResult({"M": 4, "N": 576}, "float32", 60, 30, Interval(0.5 / speedup, 0.24, 0.26),
                      Interval(speedup, speedup - 0.1, speedup + 0.1), 0.2, 0.2, 0.02)
    return Measurement(op, "CPU / Triton interpreter", {"kind": "cpu-interpreter", "cpu": "test"}, None,
                       {"confidence": 0.95, "min_speedup": 1.02},
                       [FileResult(f"kernels/{op}.py", "incumbent", "ok", shapes=[inc]),
                        FileResult("cand.py", "candidate", "ok", shapes=[new], accepted=True,
                                   speedup=Interval(speedup, speedup - 0.1, speedup + 0.1))],
                       [], "bwrap+cgroup")


class StubEvaluator:
    """An Evaluator (agent/evaluate.py) with fixed data. Gate: rejects sources containing 'REJECT' with a hostile
    detail, passes the rest with e2e KL stats; bench: 2x, accepted. `evaluated` lists each source gated; no quick
    check (check: None)."""

    def __init__(self, op_dir: Path):
        self.op_dir, self.evaluated, self.confirmed = Path(op_dir), [], []

    def evaluate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        fb = self.gate(candidate, deadline)
        return fb if fb.verdict != "accepted" else self.bench(candidate, fb, deadline)

    def gate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        op, digest = candidate.op, candidate.sha256
        self.evaluated.append(candidate.text)
        if "REJECT" in candidate.text:
            return Feedback(op, digest, "rejected", reasons=[{"stage": "static", "code": "static.forbidden_call",
                                                             "detail": HOSTILE}],
                            stages=[{"name": "static", "passed": False, "reason": "static.forbidden_call",
                                     "detail": HOSTILE}])
        stages = [{"name": "static", "passed": True, "reason": None, "detail": "parsed", "elapsed_s": 0.1,
                   "metrics": {}},
                  {"name": "runtime", "passed": True, "reason": None, "detail": "launched", "elapsed_s": 2.0,
                   "metrics": {"isolation": "bwrap+cgroup"}},
                  {"name": "numeric", "passed": True, "reason": None, "detail": "126 cases", "elapsed_s": 9.0,
                   "metrics": {"cases": list(range(500))}},  # too big for the evidence: must be dropped
                  {"name": "e2e", "passed": True, "reason": None, "detail": "KL ok", "elapsed_s": 30.0,
                   "metrics": {"kl_mean": 1.1e-11, "kl_p99": 2e-10, "kl_max": 3e-9, "top1": 1.0, "positions": 40,
                               "repeat_runs": [[2, 2]], "plan": {"layers": 2, "of_layers": 31, "prefill": False,
                                                                 "new_tokens": 8, "predicted_s": 100.0}}}]
        return Feedback(op, digest, "accepted", stages=stages, device="cpu-interpreter",
                        path=str(self.op_dir / digest[:8] / f"{op}.py"), seed=12345, isolation="bwrap+cgroup")

    def bench(self, candidate: Candidate, feedback: Feedback, deadline: Deadline = Deadline.none()) -> Feedback:
        return replace(feedback, accepted=True, speedup=2.0, speedup_ci=[1.9, 2.1], note="stub")

    def check(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> dict | None:
        return None

    def confirm(self, candidate: Candidate) -> Measurement:
        self.confirmed.append(candidate.text)
        return measurement(candidate.op)
