"""`autokernel run` and `autokernel nightly` as a user runs them, in a temporary clone: the clone's branch, index and
working tree are unchanged whatever the outcome; a win is one commit on autokernel's own branch."""
import json
import os
import subprocess
import sys
from pathlib import Path

import git
import pytest

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.slow
# the installed console script: `python -c` would import the clone's own copy of autokernel from the cwd
CLI = [str(Path(sys.executable).parent / "autokernel")]


@pytest.fixture
def trace(smollm2_trace):
    """The real model's profile (tests/conftest.py: `autokernel profile`, taken once and shared with
    tests/profile/test_real_model.py); each run would otherwise profile again."""
    return smollm2_trace


@pytest.fixture
def clone(tmp_path):
    repo = git.Repo.clone_from(ROOT, tmp_path / "clone")
    (tmp_path / "clone" / "policies.yaml").write_text(
        "agent:\n  provider: search\n  max_iterations: 2\nbench:\n  max_time_s: 10\n")
    # the user's uncommitted edit, in a kernel the run does not tune (the op's own file must be HEAD's:
    # tests/run/test_delivery.py test_an_op_file_that_is_not_heads_is_refused_before_a_session)
    (tmp_path / "clone" / "kernels" / "silu_mul.py").write_text(
        (tmp_path / "clone" / "kernels" / "silu_mul.py").read_text() + "# the user's uncommitted edit\n")
    return repo


def state(repo):
    return (repo.active_branch.name, repo.head.commit.hexsha, repo.git.status("--porcelain"), repo.git.diff())


def test_run_commits_or_cleanly_reports_no_improvement(clone, trace):
    before, heads = state(clone), {h.name for h in clone.heads}
    r = subprocess.run(CLI + ["run", "--agent", "search", "--op", "rmsnorm", "--yes", "--repo", clone.working_dir,
                              "--trace", str(trace)], capture_output=True, text=True, timeout=1500,
                       cwd=clone.working_dir)
    print(r.stdout[-3000:])
    assert r.returncode in (0, 1), r.stderr[-3000:]
    assert "sandbox.error" not in r.stdout
    assert "interpreter timing" in r.stdout
    assert state(clone) == before
    new = {h.name for h in clone.heads} - heads
    if r.returncode == 1:
        assert "no improvement" in r.stdout and not new
    else:
        (branch,) = new
        c = clone.commit(branch)
        assert c.parents[0].hexsha == before[1] and "kernels/rmsnorm.py" in c.stats.files
        for needle in ("speedup", "KL mean", "top-1", "autokernel verify rmsnorm kernels/rmsnorm.py --seed",
                       "Device:"):
            assert needle in c.message


def test_nightly_writes_summary_and_pr(clone, trace, tmp_path):
    before = state(clone)
    out = tmp_path / "nightly"
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_TOKEN"}
    r = subprocess.run(CLI + ["nightly", "--op", "rmsnorm", "--repo", clone.working_dir, "--trace", str(trace),
                              "--out", str(out)], capture_output=True, text=True, timeout=1500,
                       cwd=clone.working_dir, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcomes"][0]["op"] == "rmsnorm" and summary["device"]["kind"]
    assert (out / "pr.md").read_text().startswith("# autokernel")
    assert state(clone) == before


@pytest.mark.parametrize("args,needle", [(["run", "--op", "nosuch"], "unknown op 'nosuch'"),
                                         (["run", "--op", "lm_head"], "may not be rewritten"),
                                         (["bench", "rmsnorm", "/nonexistent.py"], "no such candidate file"),
                                         (["run", "--trace"], "requires an argument")])
def test_bad_input_exits_2_without_traceback(args, needle):
    r = subprocess.run(CLI + args, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr[-1000:]


def test_the_offline_search_skips_ops_it_cannot_retune(tmp_path):
    """The offline search only retunes launch meta-parameters: an op whose kernel has none (add_rmsnorm: its block
    is next_power_of_2(N)) is skipped for it, so `autokernel run` goes on to the next ranked op; an LLM keeps it."""
    import shutil

    from rich.console import Console

    from autokernel import paths
    from autokernel.run import searchable
    root = tmp_path / "checkout"
    shutil.copytree(Path(__file__).parents[2] / "kernels", root / "kernels")
    layout, out = paths.Layout(root), Console(file=open(tmp_path / "out.txt", "w"), width=200)
    assert not searchable("add_rmsnorm", "search", layout, out)
    assert searchable("attention_decode", "search", layout, out)  # BLOCK_N
    assert searchable("add_rmsnorm", "anthropic", layout, out)
    out.file.close()
    assert "skipping add_rmsnorm: its kernel has no launch meta-parameters" in (tmp_path / "out.txt").read_text()
