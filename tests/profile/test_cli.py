"""`autokernel profile` / `rank` as a user runs them: exit codes, one-line errors, JSON, plot."""
import json
import subprocess
import sys

import pytest

from autokernel import cli


@pytest.fixture
def ak(monkeypatch, capsys):
    """Run the CLI in this process (as `autokernel ARGS`); returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps tables at 80 columns without a terminal

    def run(*args, cwd=None):
        if cwd is not None:
            monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["autokernel"] + [str(a) for a in args])
        capsys.readouterr()
        try:
            cli.main()
            code = 0
        except SystemExit as e:
            code = e.code or 0
        out, err = capsys.readouterr()
        return code, out, err
    return run


def _one_line_error(result, text):
    code, out, err = result
    assert code == 2, (code, out, err)
    errors = [ln for ln in err.splitlines() if ln.startswith("autokernel: error:")]
    assert len(errors) == 1 and text in errors[0], err
    assert "Traceback" not in err


def test_rank_json_lists_protected_separately(ak, ref_trace_dir):
    code, out, err = ak("rank", ref_trace_dir, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [t["op"] for t in doc["excluded"]] == ["lm_head"] and doc["excluded"][0]["status"] == "protected"
    gains = [t["gain"] for t in doc["targets"]]
    assert gains == sorted(gains, reverse=True) and len(doc["targets"]) == 8
    assert doc["timing"]["label"]


def test_rank_table_and_op_detail(ak, ref_trace_dir):
    code, out, err = ak("rank", ref_trace_dir / "summary.json", "--op", "rope")
    assert code == 0, err
    assert "lm_head (protected)" in out and "rope: shape corpus" in out


def test_rank_defaults_to_the_latest_trace(ak, ref_trace_dir, tmp_path):
    import shutil
    shutil.copytree(ref_trace_dir, tmp_path / "traces" / ref_trace_dir.name)
    code, out, err = ak("rank", "--json", cwd=tmp_path)
    assert code == 0, err
    assert json.loads(out)["run_id"] == ref_trace_dir.name


def test_rank_plot(ak, ref_trace_dir, tmp_path):
    pytest.importorskip("matplotlib")
    code, out, err = ak("rank", ref_trace_dir, "--plot", tmp_path / "rank.png")
    assert code == 0, err
    assert (tmp_path / "rank.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_inputs_exit_2_with_one_line(ak, ref_trace_dir, tmp_path):
    _one_line_error(ak("rank", ref_trace_dir, "--op", "matmul_q5"), "unknown op 'matmul_q5'")
    _one_line_error(ak("rank", ref_trace_dir, "--op", "matmul"), "op 'matmul' was never called")
    doc = json.loads((ref_trace_dir / "summary.json").read_text())
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**doc, "schema": 0}))
    _one_line_error(ak("rank", old), "trace schema 0")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**doc, "device": {"kind": "elsewhere", "gpu": "NVIDIA H100"}}))
    _one_line_error(ak("rank", other), "trace taken on elsewhere")
    _one_line_error(ak("profile", "--workload", tmp_path / "none.yaml"), "no such workload file")
    _one_line_error(ak("rank", cwd=tmp_path), "no trace under traces/")


def test_malformed_workload_from_the_shell(tmp_path):
    """The installed entry point, end to end: exit 2 and one line naming file, line and field."""
    bad = tmp_path / "w.yaml"
    bad.write_text("prompts: [hi]\ndecode_steps: many\n")
    r = subprocess.run([sys.executable, "-c", "from autokernel.cli import main; main()", "profile", "--workload",
                        str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"autokernel: error: {bad}:2: field 'decode_steps'")
    assert "Traceback" not in r.stderr


def test_the_default_traces_dir_is_never_a_link_or_a_file(ak, tmp_path):
    """`autokernel profile` in a checkout (a clone of this project's layout) wrote its run into whatever the
    checkout's committed traces/ linked to, outside it; a traces file made it fail with a traceback after the whole
    workload. Both are refused up front, exit 2, nothing written."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for name, make in [("link", lambda d: (d / "traces").symlink_to(outside)),
                       ("file", lambda d: (d / "traces").write_text("not a directory\n"))]:
        here = tmp_path / name
        here.mkdir()
        make(here)
        _one_line_error(ak("profile", "--kernels", "reference", cwd=here), "traces")
        assert not list(outside.iterdir())


def test_rank_reads_no_trace_through_a_link_nor_another_checkout(ak, ref_trace_dir, tmp_path):
    """`rank` with no TRACE read and printed a checkout's traces/<run>/summary.json that linked out of it; a
    target's trace passed as TRACE had rank work in whatever directory its (checkout-written) `target.root` named."""
    import shutil
    run = tmp_path / "traces" / "r1"
    run.mkdir(parents=True)
    (run / "summary.json").symlink_to(ref_trace_dir / "summary.json")
    _one_line_error(ak("rank", "--json", cwd=tmp_path), "no trace under traces")
    forged = tmp_path / "co" / "traces" / "r2"
    shutil.copytree(ref_trace_dir, forged)
    summary = json.loads((forged / "summary.json").read_text())
    summary["target"] = {"root": str(tmp_path / "elsewhere"), "build": "x:y", "declaration": "autokernel.toml"}
    (forged / "summary.json").write_text(json.dumps(summary))
    _one_line_error(ak("rank", forged), "names the checkout")
