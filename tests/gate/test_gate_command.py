"""`autokernel verify`: exit codes 0 accepted, 1 rejected, 2 bad input; a readable summary or the verdict as JSON."""
import json
import re
from pathlib import Path

import pytest
import torch

from autokernel.cli import verify as command
from autokernel.cli.verify import verify_command
from autokernel.gate import StageResult, e2e, numeric
from autokernel.paths import INSTALLED_LAYOUT

FIXTURES = Path(__file__).parent / "fixtures" / "rmsnorm"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # verdicts land in sandbox/ under the project; no policies.yaml here
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no checkout here: the runs go to the user cache
    monkeypatch.setenv("COLUMNS", "240")  # the summary's verdict.json path (under tmp_path) on one line


def test_unknown_op_and_missing_file_are_bad_input(capsys):
    assert verify_command("no_such_op", FIXTURES / "legit_two_pass.py") == 2
    assert "unknown op 'no_such_op'" in capsys.readouterr().err
    assert verify_command("rmsnorm", Path("missing.py")) == 2
    assert "missing.py: no such candidate file" in capsys.readouterr().err


def test_rejected_is_exit_1_with_reason_and_detail(capsys):
    assert verify_command("rmsnorm", FIXTURES / "fallback_try_except.py") == 1
    out = capsys.readouterr().out
    assert "REJECTED" in out and "static.fallback" in out and "verdict.json" in out


def test_json_output(capsys):
    assert verify_command("rmsnorm", FIXTURES / "call_functional.py", seed=3, as_json=True) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["verdict"] == "rejected" and d["reason"] == "static.forbidden_import" and d["seed"] == 3


def test_accepted_is_exit_0(capsys, monkeypatch):
    """The real static, runtime and numeric stages on a narrowed grid; the end-to-end stage is a stub that passes (the
    real one is tests/gate/test_gate_e2e.py on the live model, and runs inside verify in tests/run/test_run_e2e.py):
    here it would only add minutes of the real model for an exit code. Policy gate.max_rows 0: the narrowed plan has
    no range cases, and the calls past the CPU row cap (numeric._reach: 30 interpreter seconds of rmsnorm at 1.5k to
    8k rows, most of this test's 33 s on CI) would only add time for an exit code too."""
    quick = numeric.plan
    monkeypatch.setattr(numeric, "plan", lambda spec, shapes, dtypes, dists, seed=0, *_range:
                        quick(spec, shapes, [torch.float32], ["normal"], seed))
    monkeypatch.setattr(e2e, "stage", lambda op, candidate, policy, **kw: StageResult.ok("e2e", "stub"))
    trace = Path("trace.json")
    trace.write_text(json.dumps({"ops": {"rmsnorm": {"shapes": [{"shape": {"M": 2, "N": 576}, "calls": 3}]}}}))
    Path("policy.yaml").write_text("gate:\n  max_rows: 0\n")
    assert verify_command("rmsnorm", INSTALLED_LAYOUT.kernels / "rmsnorm.py", trace=trace,
                          policy_file=Path("policy.yaml")) == 0
    out = capsys.readouterr().out
    assert "ACCEPTED" in out and "numeric" in out and "e2e" in out


def test_bad_trace_is_bad_input(capsys):
    Path("t.json").write_text("{not json")
    assert verify_command("rmsnorm", FIXTURES / "legit_two_pass.py", trace=Path("t.json")) == 2
    assert "not JSON" in capsys.readouterr().err


@pytest.mark.parametrize("doc, why", [
    ({"ops": {"matmul": {"shapes": [{"shape": {"M": 1, "N": 2, "K": 3}}]}}}, "no shapes recorded for op 'rmsnorm'"),
    ({"shapes": {"rmsnorm": [{"M": 2, "N": 576}]}}, "not an autokernel trace summary"),  # only the profiler's layout
    ({"ops": {"rmsnorm": {"shapes": [{"M": 2, "N": 576}]}}}, r"ops\.rmsnorm\.shapes\[0\]\.shape"),
])
def test_a_trace_verify_cannot_read_is_bad_input_naming_what_to_fix(tmp_path, capsys, doc, why):
    """verify reads a trace through the one reader (autokernel.profile.trace): one layout, every entry checked."""
    (tmp_path / "summary.json").write_text(json.dumps(doc))
    assert verify_command("rmsnorm", FIXTURES / "legit_two_pass.py", trace=tmp_path) == 2
    assert re.search(why, capsys.readouterr().err)


def test_registers_on_the_cli():
    import typer
    app = typer.Typer()

    @app.command()
    def other() -> None:
        pass

    command.register(app)
    assert "verify" in {c.name for c in app.registered_commands}


def test_piped_output_never_splits_a_path(capsys, monkeypatch):
    """In a log or a pipe rich wrapped at 80 columns and split the verdict.json path in two (a user's copy-paste
    failed): the commands' console wraps nothing there (autokernel/cli/console.py)."""
    from autokernel.cli import console
    monkeypatch.setenv("COLUMNS", "80")
    long = "/tmp/" + "a-long-directory-name/" * 8 + "verdict.json"
    console.make().print(f"[dim]verdict: {long}[/dim]")
    assert f"verdict: {long}\n" in capsys.readouterr().out
