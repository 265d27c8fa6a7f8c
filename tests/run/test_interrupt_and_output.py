"""Issue 23, item 5 (the small ones): Ctrl-C names the run to resume and exits 130; in a CI log (not a terminal) no
line is wrapped at 80 columns; a run lists the server's models once (GET /v1/models), however many workers."""
import io
import json
from pathlib import Path

import git
import pytest
import typer
from delivery_doubles import ScriptedModel, StubEvaluator, write_trace
from fake_llm_api import FakeAPI
from rich.console import Console
from typer.testing import CliRunner

from autokernel import paths, run
from autokernel.agent import command
from autokernel.cli import run as run_cli
from autokernel.policy import Policy

ROOT = Path(__file__).parents[2]


@pytest.fixture
def clone(tmp_path):
    return git.Repo.clone_from(ROOT, tmp_path / "clone")


class Interrupted(ScriptedModel):
    def query(self, messages, tools, deadline=None):
        raise KeyboardInterrupt


def cli(monkeypatch, clone, llm, *args):
    """The command as a user runs it, with run_cmd's own console (not a terminal under CliRunner: a CI log)."""
    def context(**kw):
        return run.Context(paths.Layout(Path(clone.working_tree_dir)), Policy(), Policy().agent, llm,
                           lambda op_dir, *a: StubEvaluator(op_dir), kw["console"], yes=True)
    monkeypatch.setattr(run, "context", context)
    app = typer.Typer()
    run_cli.register(app)
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.mark.parametrize("cmd", ["run", "nightly"])
def test_ctrl_c_names_the_run_to_resume_and_exits_130(clone, tmp_path, monkeypatch, cmd):
    out = tmp_path / "n"
    r = cli(monkeypatch, clone, Interrupted([]), cmd, "--op", "rmsnorm", "--trace", str(write_trace(tmp_path / "t")),
            *(["--out", str(out)] if cmd == "nightly" else []))
    assert r.exit_code == 130, r.output
    run_dir = next((Path(clone.working_tree_dir) / "sandbox").glob("run-*"))
    assert f"autokernel: interrupted; resume with `autokernel run --resume {run_dir}`" in r.stderr
    if cmd == "nightly":  # the artifacts are written first
        assert json.loads((out / "summary.json").read_text())["error"] == "KeyboardInterrupt"


def test_ci_log_lines_are_not_wrapped_at_80_columns(clone, tmp_path, monkeypatch):
    r = cli(monkeypatch, clone, ScriptedModel([{"role": "assistant", "content": "", "tool_calls": [
        {"id": "f", "name": "finish", "arguments": {"summary": "nothing"}}]}]), "run", "--op", "rmsnorm",
        "--trace", str(write_trace(tmp_path / "t")))
    assert r.exit_code == 1, r.output
    transcript = next((Path(clone.working_tree_dir) / "sandbox").glob("run-*/rmsnorm/transcript.json"))
    assert len(str(transcript)) > 80 and f"transcript {transcript}" in r.stdout  # one piece, not cut at column 80


def test_the_server_s_models_are_listed_once_per_run(clone, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    mine = tmp_path / "mine.yaml"  # --policy: the user's own file may set workers
    mine.write_text("agent:\n  workers: 3\n")
    with FakeAPI([], models=("served-model", "other")) as api:
        ctx = run_cli.context(agent="openai", model=None, base_url=f"{api.base_url}/v1", repo=clone.working_tree_dir,
                              policy_file=mine, console=Console(file=io.StringIO()),
                              make_evaluator=lambda op_dir, *a: StubEvaluator(op_dir))
        models = command.worker_models(ctx.llm, ctx.settings)
    assert [m.model for m in models] == ["served-model"] * 3
    assert [r.path for r in api.requests] == ["/v1/models"]
