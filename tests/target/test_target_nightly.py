"""`autokernel nightly --repo` on a target writes summary.json and pr.md whatever happens (autokernel/target/run.py):
here a model server that is not there (exit 2, the error in both artifacts, the checkout untouched) and a target
whose ops are all protected (exit 0, no op tried). The winning path is test_target_run.py's (run --repo)."""
import json
import os
import subprocess
import sys

import git
from test_target_gate import DECLARATION, checkout

CLI = [str(os.path.join(os.path.dirname(sys.executable), "autokernel"))]


def nightly(root, out, tmp_path, *extra):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "AUTOKERNEL_CONFIG": "",
           "OPENAI_API_KEY": "sk-test"}
    return subprocess.run(CLI + ["nightly", "--repo", str(root), "--out", str(out), *extra], capture_output=True,
                          text=True, timeout=600, env=env)


def committed(root):
    repo = git.Repo.init(root)
    repo.index.add([str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".git" not in p.parts])
    repo.index.commit("target", author=git.Actor("u", "u@x"), committer=git.Actor("u", "u@x"))
    return repo


def test_a_model_server_that_is_not_there_still_writes_the_artifacts(tmp_path):
    repo = committed(checkout(tmp_path / "co"))
    r = nightly(repo.working_tree_dir, tmp_path / "out", tmp_path, "--agent", "openai", "--base-url",
                "http://127.0.0.1:9/v1")
    assert r.returncode == 2, r.stdout + r.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["target"] is True and summary["error"] and summary["outcomes"] == []
    assert "# autokernel nightly: stopped" in (tmp_path / "out" / "pr.md").read_text()
    assert not repo.is_dirty(untracked_files=True) and [h.name for h in repo.heads] == [repo.active_branch.name]


def test_a_target_with_every_op_protected_tries_nothing(tmp_path):
    repo = committed(checkout(tmp_path / "co", DECLARATION + "protected = true\n"))
    r = nightly(repo.working_tree_dir, tmp_path / "out", tmp_path, "--agent", "search")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no declared op was tried" in (tmp_path / "out" / "pr.md").read_text()
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["outcomes"] == []
    assert not repo.is_dirty(untracked_files=True)


def test_a_delivery_waiting_on_a_branch_is_not_redone(tmp_path):
    """An autokernel/* branch one commit over this base that changes the op's file: the op is not tried again (no
    session, no new branch) until it is merged or deleted."""
    repo = committed(checkout(tmp_path / "co"))
    base = repo.head.commit
    from autokernel import git as delivery
    delivery.commit_files(repo.working_tree_dir, "autokernel/2026-01-01-norm",
                          {"toyt/ops/norm.py": (tmp_path / "co/toyt/ops/norm.py").read_text() + "\n# faster\n"},
                          "an earlier win")
    before = sorted(h.name for h in repo.heads)
    r = nightly(repo.working_tree_dir, tmp_path / "out", tmp_path, "--agent", "search")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# autokernel nightly: already delivered" in (tmp_path / "out" / "pr.md").read_text()
    assert "autokernel/2026-01-01-norm" in (tmp_path / "out" / "pr.md").read_text()
    assert sorted(h.name for h in repo.heads) == before and repo.head.commit == base


def test_the_report_is_never_written_through_a_link_the_checkout_ships(tmp_path):
    """A checkout committing autokernel-nightly/pr.md as a link to ~/.bashrc (the default --out, run in the checkout
    as CI does): the report overwrote the link's target, and its text ran at the user's next shell. Now exit 2
    naming the link, the target untouched; the same with the directory itself a link, and with a FIFO."""
    victim = tmp_path / "home" / ".bashrc"
    victim.parent.mkdir()
    victim.write_text("# mine\n")
    root = checkout(tmp_path / "co", DECLARATION + "protected = true\n")
    (root / "autokernel-nightly").mkdir()
    (root / "autokernel-nightly" / "pr.md").symlink_to(victim)
    repo = committed(root)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "AUTOKERNEL_CONFIG": ""}
    r = subprocess.run(CLI + ["nightly", "--agent", "search"], cwd=root, capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 2 and "pr.md: refused" in r.stderr + r.stdout, r.stdout + r.stderr
    assert victim.read_text() == "# mine\n" and (root / "autokernel-nightly" / "pr.md").is_symlink()
    assert not repo.is_dirty(untracked_files=True)

    from autokernel import paths
    from autokernel.errors import UserError
    linked = tmp_path / "co2"
    linked.mkdir()
    (linked / "out").symlink_to(victim.parent)
    for out, files in ((linked / "out", {"pr.md": "x"}), (linked / "out" / "deeper", {"pr.md": "x"})):
        try:
            paths.write_outputs(out, files, (linked,))
            raise AssertionError(f"{out}: written through a link")
        except UserError as e:
            assert "symbolic link" in str(e), e
    fifo_dir = linked / "real"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "pr.md")
    try:
        paths.write_outputs(fifo_dir, {"pr.md": "x"}, (linked,))
        raise AssertionError("written into a FIFO")
    except UserError as e:
        assert "refused" in str(e) and "not a" in str(e), e
    assert sorted(p.name for p in victim.parent.iterdir()) == [".bashrc"] and victim.read_text() == "# mine\n"
    paths.write_outputs(linked / "fresh" / "dir", {"pr.md": "ok"}, (linked,))  # made as needed
    assert (linked / "fresh" / "dir" / "pr.md").read_text() == "ok"
