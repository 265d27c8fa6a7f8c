"""`autokernel run` wraps the evaluator to print verdicts (run.Shown): the session's deadline must pass through it,
or the evaluator would plan gate and bench past the session's wall budget (agent/evaluate.py)."""
import io

from delivery_doubles import StubEvaluator
from rich.console import Console

from autokernel import run


class Recording(StubEvaluator):
    def __init__(self):
        super().__init__("/tmp")
        self.got = []

    def evaluate(self, op, source, time_left_s=None):
        self.got.append(("evaluate", time_left_s))
        return StubEvaluator("/tmp").evaluate(op, source)

    def gate(self, op, source, time_left_s=None):
        self.got.append(("gate", time_left_s))
        return super().gate(op, source)

    def bench(self, op, source, feedback, time_left_s=None):
        self.got.append(("bench", time_left_s))
        return super().bench(op, source, feedback)

    def check(self, op, source, time_left_s=None):
        self.got.append(("check", time_left_s))
        return None


def test_shown_forwards_the_time_left():
    inner = Recording()
    shown = run.Shown(inner, Console(file=io.StringIO()))
    shown.evaluate("rmsnorm", "src", time_left_s=12.5)
    fb = shown.gate("rmsnorm", "src", time_left_s=11.0)
    shown.bench("rmsnorm", "src", fb, time_left_s=10.0)
    assert shown.check("rmsnorm", "src", time_left_s=9.0) is None
    assert inner.got == [("evaluate", 12.5), ("gate", 11.0), ("bench", 10.0), ("check", 9.0)]
