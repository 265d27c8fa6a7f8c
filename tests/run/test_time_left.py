"""`autokernel run` wraps the evaluator to print verdicts (run.Shown): the session's deadline must pass through it,
or the evaluator would plan gate and bench past the session's wall budget (agent/evaluate.py)."""
import io

from rich.console import Console

from autokernel import run
from autokernel.agent.loop import with_time_left


class Recording:
    def __init__(self):
        self.got = []

    def evaluate(self, op, source, time_left_s=None):
        from delivery_doubles import StubEvaluator
        self.got.append(time_left_s)
        return StubEvaluator("/tmp").evaluate(op, source)


def test_shown_forwards_the_time_left():
    inner = Recording()
    shown = run.Shown(inner, Console(file=io.StringIO()))
    with_time_left(shown.evaluate)("rmsnorm", "src", time_left_s=12.5)
    assert inner.got == [12.5]
