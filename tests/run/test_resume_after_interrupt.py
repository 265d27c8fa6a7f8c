"""Issue 23 item 5: `--resume` of a run interrupted mid-session continues without gating again what the interrupted
session had judged (its verdicts are in the checkout's ledger, which the resumed session's evaluations consult)."""
import io
from pathlib import Path

import git
import pytest
from delivery_doubles import ScriptedModel, StubEvaluator, turn, write_trace
from rich.console import Console

from autokernel import paths, run
from autokernel.policy import Policy

ROOT = Path(__file__).parents[2]


class InterruptedAfter(ScriptedModel):
    """Its replies, then Ctrl-C at the next model call."""

    def query(self, messages, tools, deadline=None):
        if not self.replies:
            raise KeyboardInterrupt
        return super().query(messages, tools, deadline)


def test_resume_does_not_gate_again_what_the_interrupted_session_judged(tmp_path):
    wd = Path(git.Repo.clone_from(ROOT, tmp_path / "clone").working_tree_dir)
    evaluators = []

    def ctx(llm):
        def make(op_dir, *a):
            evaluators.append(StubEvaluator(op_dir))
            return evaluators[-1]
        return run.Context(paths.Layout(wd), Policy(), Policy().agent, llm, make, Console(file=io.StringIO()),
                           yes=True)

    first = run.Progress()
    with pytest.raises(KeyboardInterrupt):
        run.pipeline(ctx(InterruptedAfter([turn("", ("submit_candidate", {"source": "REJECT me"}))])), op="rmsnorm",
                     resume=None, trace=write_trace(tmp_path / "t"), progress=first)
    assert evaluators[0].evaluated == ["REJECT me"]
    llm = ScriptedModel([turn("", ("submit_candidate", {"source": "REJECT me"})), turn("", ("finish", {}))])
    state, (o,) = run.pipeline(ctx(llm), op=None, resume=first.state.run_dir, trace=None)
    assert state.run_dir == first.state.run_dir and o.op == "rmsnorm"
    assert evaluators[1].evaluated == []  # answered from the ledger: not gated again
    assert o.status == "no_improvement", o
    # the report says what the resumed session did with it, not "0 candidate(s) judged" alone
    assert "0 candidate(s) judged (and 1 answered from earlier runs' verdicts)" in run.nightly_report(state, [o])
