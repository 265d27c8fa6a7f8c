"""A session that ends on a persistent model error (Result.error, agent/loop.py) through the one orchestration path
(run.pipeline -> work_on -> agent.command.start): `autokernel run` prints the error as one loud escaped line and
exits 2, still committing a win the session already had; `autokernel nightly` exits non-zero. The model is injected
(run.context is replaced by one with the scripted model and the stub evaluator of delivery_doubles.py)."""
import io
import json
from pathlib import Path

import git
import pytest
import typer
from delivery_doubles import HOSTILE, ScriptedModel, StubEvaluator, today_branch, turn, write_trace
from rich.console import Console
from typer.testing import CliRunner

from autokernel import paths, run
from autokernel.agent.providers import ModelUnavailable
from autokernel.cli import run as run_cli
from autokernel.policy import Policy

ROOT = Path(__file__).parents[2]
FAILURE = "HTTP 500 from the server after 3 tries: " + HOSTILE


class FailingAfter(ScriptedModel):
    """Plays its script, then raises what the provider raises when the server keeps answering 500."""

    def query(self, messages, tools, deadline=None):
        if self.replies:
            return self.replies.pop(0)
        raise ModelUnavailable(FAILURE)


@pytest.fixture
def clone(tmp_path):
    return git.Repo.clone_from(ROOT, tmp_path / "clone")


def source(clone) -> str:
    return (Path(clone.working_tree_dir) / "kernels" / "rmsnorm.py").read_text() + "# the scripted rewrite\n"


def ctx_for(clone, llm, console=None):
    return run.Context(paths.Layout(Path(clone.working_tree_dir)), Policy(), Policy().agent, llm,
                       lambda op_dir, *a: StubEvaluator(op_dir), console or Console(file=io.StringIO()), yes=True)


def cli(monkeypatch, ctx, *args):
    monkeypatch.setattr(run, "context", lambda **kw: ctx)
    app = typer.Typer()
    run_cli.register(app)
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_model_error_is_an_outcome_not_no_improvement(clone, tmp_path):
    _, (o,) = run.pipeline(ctx_for(clone, FailingAfter([])), op="rmsnorm", resume=None,
                           trace=write_trace(tmp_path / "t"))
    assert o.status == "model_error" and o.error and "HTTP 500" in o.error
    assert "\n" not in o.error and "\x1b" not in o.error


def test_run_exits_2_with_one_loud_escaped_line(clone, tmp_path, monkeypatch):
    r = cli(monkeypatch, ctx_for(clone, FailingAfter([])), "run", "--op", "rmsnorm",
            "--trace", str(write_trace(tmp_path / "t")))
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.startswith("error: rmsnorm:")]
    assert len(lines) == 1 and "HTTP 500 from the server" in lines[0], r.output
    assert "\x1b" not in r.output and "\x07" not in r.output and "no improvement" not in r.output


def test_run_keeps_a_win_then_exits_2(clone, tmp_path, monkeypatch):
    llm = FailingAfter([turn("two rows", ("submit_candidate", {"source": source(clone)}))])
    r = cli(monkeypatch, ctx_for(clone, llm), "run", "--op", "rmsnorm", "--yes",
            "--trace", str(write_trace(tmp_path / "t")))
    assert r.exit_code == 2, r.output
    assert "its win was kept" in r.output
    c = clone.commit(today_branch("rmsnorm"))  # committed despite the error
    assert c.tree["kernels/rmsnorm.py"].data_stream.read().decode() == source(clone)


def test_resume_retries_an_op_that_ended_on_a_model_error(clone, tmp_path):
    ctx = ctx_for(clone, FailingAfter([]))
    state, (o,) = run.pipeline(ctx, op="rmsnorm", resume=None, trace=write_trace(tmp_path / "t"))
    assert json.loads((state.run_dir / "state.json").read_text())["done"]["rmsnorm"]["status"] == "model_error"
    ctx.llm = ScriptedModel([turn("", ("submit_candidate", {"source": source(clone)})),
                             turn("", ("finish", {"summary": "done"}))])
    _, (o,) = run.pipeline(ctx, op=None, resume=state.run_dir, trace=None)
    assert o.status == "committed" and o.error is None


@pytest.mark.parametrize("script, status", [([], "model_error"), (["win"], "committed")])
def test_nightly_fails_when_any_session_has_an_error(clone, tmp_path, monkeypatch, script, status):
    llm = FailingAfter([turn("", ("submit_candidate", {"source": source(clone)})) for _ in script])
    out = tmp_path / "nightly"
    r = cli(monkeypatch, ctx_for(clone, llm), "nightly", "--op", "rmsnorm", "--out", str(out),
            "--trace", str(write_trace(tmp_path / "t")))
    assert r.exit_code == 2, r.output
    (o,) = json.loads((out / "summary.json").read_text())["outcomes"]
    assert o["status"] == status and "HTTP 500" in o["error"]
    pr = (out / "pr.md").read_text()
    assert ("model failed" in pr and "HTTP 500" in pr) if status == "model_error" else "no improvement" not in pr
    assert "\x1b" not in pr


def test_nightly_without_error_still_exits_0(clone, tmp_path, monkeypatch):
    llm = ScriptedModel([turn("", ("finish", {"summary": "nothing to do"}))])
    r = cli(monkeypatch, ctx_for(clone, llm), "nightly", "--op", "rmsnorm", "--out", str(tmp_path / "n"),
            "--trace", str(write_trace(tmp_path / "t")))
    assert r.exit_code == 0, r.output
