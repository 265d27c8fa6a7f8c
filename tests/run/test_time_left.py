"""`autokernel run` wraps the evaluator to print verdicts (run.Shown): the session's deadline must pass through it,
or the evaluator would plan gate and bench past the session's wall budget (agent/evaluate.py)."""
import io

from delivery_doubles import StubEvaluator
from rich.console import Console

from autokernel import run
from autokernel.candidate import Candidate
from autokernel.deadline import Deadline


class Recording(StubEvaluator):
    def __init__(self):
        super().__init__("/tmp")
        self.got = []

    def evaluate(self, candidate, deadline=None):
        self.got.append(("evaluate", deadline))
        return StubEvaluator("/tmp").evaluate(candidate)

    def gate(self, candidate, deadline=None):
        self.got.append(("gate", deadline))
        return super().gate(candidate)

    def bench(self, candidate, feedback, deadline=None):
        self.got.append(("bench", deadline))
        return super().bench(candidate, feedback)

    def check(self, candidate, deadline=None):
        self.got.append(("check", deadline))
        return None


def test_shown_forwards_the_time_left():
    inner = Recording()
    shown = run.Shown(inner, Console(file=io.StringIO()))
    d = [Deadline.after(s) for s in (12.5, 11.0, 10.0, 9.0)]
    src = Candidate.of("rmsnorm", "src")
    shown.evaluate(src, d[0])
    fb = shown.gate(src, d[1])
    shown.bench(src, fb, d[2])
    assert shown.check(src, d[3]) is None
    assert inner.got == [("evaluate", d[0]), ("gate", d[1]), ("bench", d[2]), ("check", d[3])]
