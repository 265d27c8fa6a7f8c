"""Delivery never touches the user's checkout (branch, index, HEAD, dirty files), commits ignored evidence paths,
runs no hook of the repository, and hands git no secret from our environment."""
import json
import os
import stat
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import git
import pytest

from autokernel import git as delivery
from autokernel.errors import UserError

HOOKS = ("pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-checkout", "reference-transaction",
         "post-index-change", "pre-push", "post-rewrite")


@pytest.fixture
def repo(tmp_path):
    r = git.Repo.init(tmp_path / "user", initial_branch="main")
    (tmp_path / "user" / "kernels").mkdir()
    (tmp_path / "user" / "kernels" / "rmsnorm.py").write_text("old\n")
    (tmp_path / "user" / ".gitignore").write_text("traces/*\n!traces/.gitkeep\nsandbox/*\n")
    r.index.add(["kernels/rmsnorm.py", ".gitignore"])
    r.index.commit("init", author=git.Actor("u", "u@x"), committer=git.Actor("u", "u@x"))
    return r


def snapshot(r):
    wd = Path(r.working_tree_dir)
    return (r.active_branch.name, r.head.commit.hexsha, r.git.status("--porcelain", "--ignored"), r.git.diff(),
            r.git.diff("--cached"), sorted(str(p.relative_to(wd)) for p in wd.rglob("*") if ".git" not in p.parts),
            (wd / ".git" / "index").read_bytes())


def plant_hooks(repo) -> Path:
    """Every hook git might run writes a marker; returns the marker directory."""
    marks = Path(repo.working_tree_dir).parent / "marks"
    marks.mkdir()
    hooks = Path(repo.git_dir) / "hooks"
    hooks.mkdir(exist_ok=True)
    for h in HOOKS:
        (hooks / h).write_text(f"#!/bin/sh\ntouch {marks}/{h}\nenv > {marks}/{h}.env\n")
        (hooks / h).chmod(0o755)
    return marks


@pytest.fixture
def nobody(tmp_path, monkeypatch):
    """No global git config names anyone (a CI runner's)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))


def test_commit_on_own_branch_leaves_checkout_untouched(repo, nobody):
    wd = repo.working_tree_dir
    open(f"{wd}/kernels/rmsnorm.py", "w").write("user's uncommitted edit\n")
    open(f"{wd}/notes.txt", "w").write("untracked\n")
    repo.git.add("notes.txt")  # something staged too
    before = snapshot(repo)
    d = delivery.commit_files(wd, "autokernel/2026-12-02-rmsnorm", {"kernels/rmsnorm.py": "new\n",
                                                                    "traces/a/summary.json": "{}"}, "msg\n\nbody")
    assert snapshot(repo) == before
    assert open(f"{wd}/kernels/rmsnorm.py").read() == "user's uncommitted edit\n"
    c = repo.commit(d.branch)
    assert c.hexsha == d.sha and c.message.startswith("msg") and c.parents[0].hexsha == before[1] == d.base
    assert c.tree["kernels/rmsnorm.py"].data_stream.read() == b"new\n"
    # traces/ is ignored by .gitignore: committed all the same (the bug was `git add` without -f)
    assert c.tree["traces/a/summary.json"].data_stream.read() == b"{}"
    assert sorted(c.stats.files) == ["kernels/rmsnorm.py", "traces/a/summary.json"]
    assert repo.git.worktree("list").count("\n") == 0  # no worktree made or left behind
    assert (c.author.name, c.committer.name) == ("autokernel", "autokernel")
    assert c.author.email == c.committer.email == "autokernel@users.noreply.github.com"  # never @localhost


def test_the_author_is_never_the_checkouts_configured_user(repo, tmp_path, nobody):
    """A handed-over checkout's .git/config names whom it likes: the author is the user's (global config) or the
    bot, never the checkout's user.name."""
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Ada Lovelace")
        cw.set_value("user", "email", "ada@example.com")
    c = repo.commit(delivery.commit_files(repo.working_tree_dir, "autokernel/x", {"kernels/rmsnorm.py": "new\n"},
                                          "msg").sha)
    assert (c.author.name, c.author.email) == ("autokernel", "autokernel@users.noreply.github.com")
    assert (c.committer.name, c.committer.email) == ("autokernel", "autokernel@users.noreply.github.com")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".gitconfig").write_text("[user]\n\tname = Grace Hopper\n\temail = grace@example.com\n")
    c = repo.commit(delivery.commit_files(repo.working_tree_dir, "autokernel/y", {"kernels/rmsnorm.py": "new\n"},
                                          "msg").sha)
    assert (c.author.name, c.author.email) == ("Grace Hopper", "grace@example.com")


def test_the_author_comes_from_the_users_global_config(repo, tmp_path, nobody):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".gitconfig").write_text("[user]\n\tname = Grace Hopper\n\temail = grace@example.com\n")
    c = repo.commit(delivery.commit_files(repo.working_tree_dir, "autokernel/x", {"kernels/rmsnorm.py": "new\n"},
                                          "msg").sha)
    assert (c.author.name, c.author.email) == ("Grace Hopper", "grace@example.com")


def test_no_repository_hook_runs(repo):
    marks = plant_hooks(repo)
    d = delivery.commit_files(repo.working_tree_dir, "autokernel/h", {"kernels/rmsnorm.py": "new\n"}, "m")
    assert repo.commit(d.branch).hexsha == d.sha
    assert sorted(p.name for p in marks.iterdir()) == []


def test_git_gets_no_secret_from_our_environment(repo, tmp_path, monkeypatch):
    """A `git` earlier on PATH records the environment it was started with, then runs the real git."""
    real = [p for p in os.environ["PATH"].split(os.pathsep) if (Path(p) / "git").is_file()][0]
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "git").write_text(f"#!/bin/sh\nenv >> {tmp_path}/git.env\nexec {real}/git \"$@\"\n")
    (shim / "git").chmod((shim / "git").stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(var, "canary-7f3a91")
    delivery.commit_files(repo.working_tree_dir, "autokernel/e", {"kernels/rmsnorm.py": "new\n"}, "m")
    seen = (tmp_path / "git.env").read_text()
    assert "GIT_INDEX_FILE" in seen  # the shim did see the plumbing calls
    assert "canary-7f3a91" not in seen


def test_branch_name_collision_gets_suffix(repo):
    a = delivery.commit_files(repo.working_tree_dir, "autokernel/x", {"f": "1"}, "a")
    b = delivery.commit_files(repo.working_tree_dir, "autokernel/x", {"f": "2"}, "b")
    assert (a.branch, b.branch) == ("autokernel/x", "autokernel/x-2")
    assert repo.commit(a.branch).tree["f"].data_stream.read() == b"1"


def test_failure_before_the_branch_leaves_no_branch(repo, monkeypatch):
    real = delivery.git

    def failing(cwd, *args, **kw):
        if args[0] == "update-ref":
            raise KeyboardInterrupt()
        return real(cwd, *args, **kw)
    monkeypatch.setattr(delivery, "git", failing)
    before = snapshot(repo)
    with pytest.raises(KeyboardInterrupt):
        delivery.commit_files(repo.working_tree_dir, "autokernel/y", {"f": "1"}, "m")
    assert "autokernel/y" not in [h.name for h in repo.heads]
    assert snapshot(repo) == before


@pytest.mark.parametrize("path", ["../escape.py", "/etc/passwd", ".git/hooks/pre-commit", "a/../../b"])
def test_paths_outside_the_tree_are_refused(repo, path):
    with pytest.raises(delivery.DeliveryError, match="not a plain path"):
        delivery.commit_files(repo.working_tree_dir, "autokernel/z", {path: "x"}, "m")
    assert "autokernel/z" not in [h.name for h in repo.heads]


def test_message_control_characters_are_stripped(repo):
    d = delivery.commit_files(repo.working_tree_dir, "autokernel/m", {"f": "1"},
                              "title\n\nfrom the model: \x1b]0;pwned\x07\x1b[2Jok [/]")
    assert repo.commit(d.branch).message.rstrip() == "title\n\nfrom the model: ok [/]"


def test_not_a_repo(tmp_path):
    with pytest.raises(UserError, match="not inside a git repository"):
        delivery.open_repo(tmp_path)
    with pytest.raises(UserError, match="not inside a git repository"):
        delivery.commit_files(tmp_path, "autokernel/x", {"f": "1"}, "m")


def test_open_pull_request_against_fake_github(repo):
    seen = {}

    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            seen["path"], seen["auth"] = self.path, self.headers["Authorization"]
            seen["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            out = json.dumps({"html_url": "http://127.0.0.1/o/r/pull/1"}).encode()
            self.send_response(201)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.handle_request, daemon=True).start()
    repo.create_remote("origin", "git@github.com:acme/engine.git")
    slug = delivery.github_slug(repo.working_tree_dir)
    url = delivery.open_pull_request(slug, "autokernel/x", "main", "t", "body \x1b[2J", "tok",
                                     api_url=f"http://127.0.0.1:{srv.server_port}")
    srv.server_close()
    assert slug == "acme/engine" and url.endswith("/pull/1")
    assert seen["path"] == "/repos/acme/engine/pulls" and seen["auth"] == "Bearer tok"
    assert seen["body"]["head"] == "autokernel/x" and seen["body"]["base"] == "main"
    assert seen["body"]["body"] == "body "


def test_the_repos_git_wrapper_is_guarded_too(repo, monkeypatch):
    """open_repo(...).git, GitPython's command wrapper, is delivery's (_Git): no hook runs, and what git starts (an
    alias here, a credential helper or ssh for real) sees the allowlist environment, not ours."""
    marks = plant_hooks(repo)
    monkeypatch.setenv("GITHUB_TOKEN", "canary-7f3a91")
    r = delivery.open_repo(repo.working_tree_dir)
    r.git.commit("--allow-empty", "-m", "through the wrapper")
    assert sorted(p.name for p in marks.iterdir()) == []
    seen = r.git(c="alias.envdump=!env").envdump()
    assert "GIT_CONFIG_NOSYSTEM=1" in seen and "canary-7f3a91" not in seen
    # GitPython's readers work through it (a long-lived cat-file, a streamed rev-list)
    assert [c.message.strip() for c in r.iter_commits()] == ["through the wrapper", "init"]
    assert r.head.commit.tree["kernels/rmsnorm.py"].data_stream.read() == b"old\n"


def test_a_commit_keeps_the_files_mode(repo, nobody):
    """An op file committed 100755 came back 100644 on autokernel's branch (a mode change nobody asked for); a new
    file is 100644."""
    wd = repo.working_tree_dir
    repo.git.update_index("--chmod=+x", "kernels/rmsnorm.py")
    repo.index.commit("exec bit")
    d = delivery.commit_files(wd, "autokernel/mode", {"kernels/rmsnorm.py": "new\n", "kernels/other.py": "x\n"}, "m")
    c = repo.commit(d.branch)
    assert c.tree["kernels/rmsnorm.py"].mode == 0o100755 and c.tree["kernels/other.py"].mode == 0o100644
