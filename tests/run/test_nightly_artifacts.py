"""Artifacts always (issue 23, item 2): `autokernel nightly --out DIR` writes summary.json and pr.md whatever stops the
run. Here the key passes the start-up check (the fake server lists its models) and is refused at the first
completion (HTTP 401, 403; 404 for the model): a UserError (exit 2 through the CLI), with the artifacts written
first, saying why. The real run.context talks to the fake OpenAI-compatible server (tests/agent/fake_llm_api.py); only
the evaluator is a stub (no candidate ever reaches it)."""
import io
import json
import re
from pathlib import Path

import git
import pytest
import typer
from delivery_doubles import StubEvaluator, write_trace
from fake_llm_api import FakeAPI, status
from rich.console import Console
from typer.testing import CliRunner

from autokernel import run
from autokernel.cli import run as run_cli
from autokernel.errors import UserError

ROOT = Path(__file__).parents[2]


@pytest.fixture
def clone(tmp_path):
    return git.Repo.clone_from(ROOT, tmp_path / "clone")


@pytest.mark.parametrize("code, said", [(401, "refused the API key (HTTP 401)"),
                                        (403, "refused the API key (HTTP 403)"),
                                        (404, "has no model 'fake-model' (HTTP 404)")])
def test_nightly_writes_artifacts_when_the_first_completion_is_refused(clone, tmp_path, monkeypatch, code, said):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-revoked")
    real = run.context
    monkeypatch.setattr(run, "context", lambda **kw: real(**{**kw, "console": Console(file=io.StringIO())},
                                                        make_evaluator=lambda op_dir, *a: StubEvaluator(op_dir)))
    app = typer.Typer()
    run_cli.register(app)
    out = tmp_path / "nightly-out"
    with FakeAPI([status(code, "key revoked", None)]) as api:
        with pytest.raises(UserError, match=re.escape(said)) as e:
            CliRunner().invoke(app, ["nightly", "--agent", "openai", "--base-url", f"{api.base_url}/v1",
                                     "--repo", clone.working_tree_dir, "--op", "rmsnorm", "--out", str(out),
                                     "--trace", str(write_trace(tmp_path / "t"))], catch_exceptions=False)
    assert e.value.exit_code == 2
    assert [r.path for r in api.requests][-1] == "/v1/chat/completions"  # past the start-up check
    summary = json.loads((out / "summary.json").read_text())
    assert said in summary["error"] and summary["run_dir"] and summary["outcomes"] == []
    pr = (out / "pr.md").read_text()
    assert pr.startswith("# autokernel nightly: stopped") and said in pr


def test_nightly_writes_artifacts_when_the_start_up_check_fails(tmp_path, monkeypatch):
    app = typer.Typer()
    run_cli.register(app)
    out = tmp_path / "nightly-out"
    with pytest.raises(UserError, match="not an autokernel checkout"):
        CliRunner().invoke(app, ["nightly", "--repo", str(tmp_path), "--out", str(out)], catch_exceptions=False)
    assert "not an autokernel checkout" in json.loads((out / "summary.json").read_text())["error"]
    assert "not an autokernel checkout" in (out / "pr.md").read_text()
