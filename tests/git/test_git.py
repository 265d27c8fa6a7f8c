"""Delivery never touches the user's checkout: branch, index, HEAD and dirty files stay exactly as they were."""
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import git
import pytest

from autokernel import git as delivery
from autokernel.errors import UserError


@pytest.fixture
def repo(tmp_path):
    r = git.Repo.init(tmp_path / "user", initial_branch="main")
    (tmp_path / "user" / "kernels").mkdir()
    (tmp_path / "user" / "kernels" / "rmsnorm.py").write_text("old\n")
    r.index.add(["kernels/rmsnorm.py"])
    r.index.commit("init", author=git.Actor("u", "u@x"), committer=git.Actor("u", "u@x"))
    return r


def snapshot(r):
    return (r.active_branch.name, r.head.commit.hexsha, r.git.status("--porcelain"), r.git.diff(),
            r.git.diff("--cached"), sorted(p.name for p in __import__("pathlib").Path(r.working_tree_dir).iterdir()))


def test_commit_on_own_branch_leaves_checkout_untouched(repo):
    wd = repo.working_tree_dir
    (repo.working_tree_dir and open(f"{wd}/kernels/rmsnorm.py", "w")).write("user's uncommitted edit\n")
    open(f"{wd}/notes.txt", "w").write("untracked\n")
    repo.git.add("notes.txt")  # something staged too
    before = snapshot(repo)
    d = delivery.commit_files(wd, "autokernel/2026-12-02-rmsnorm", {"kernels/rmsnorm.py": "new\n",
                                                                    "traces/a/summary.json": "{}"}, "msg\n\nbody")
    assert snapshot(repo) == before
    assert open(f"{wd}/kernels/rmsnorm.py").read() == "user's uncommitted edit\n"
    c = repo.commit(d.branch)
    assert c.hexsha == d.sha and c.message.startswith("msg") and c.parents[0].hexsha == before[1]
    assert c.tree["kernels/rmsnorm.py"].data_stream.read() == b"new\n"
    assert repo.git.worktree("list").count("\n") == 0  # the temporary worktree is gone


def test_branch_name_collision_gets_suffix(repo):
    a = delivery.commit_files(repo.working_tree_dir, "autokernel/x", {"f": "1"}, "a")
    b = delivery.commit_files(repo.working_tree_dir, "autokernel/x", {"f": "2"}, "b")
    assert (a.branch, b.branch) == ("autokernel/x", "autokernel/x-2")


def test_failure_before_commit_leaves_no_branch(repo, monkeypatch):
    monkeypatch.setattr(git.IndexFile, "commit", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        delivery.commit_files(repo.working_tree_dir, "autokernel/y", {"f": "1"}, "m")
    assert "autokernel/y" not in [h.name for h in repo.heads]
    assert repo.git.worktree("list").count("\n") == 0


def test_not_a_repo(tmp_path):
    with pytest.raises(UserError, match="not inside a git repository"):
        delivery.open_repo(tmp_path)


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
    url = delivery.open_pull_request(slug, "autokernel/x", "main", "t", "body", "tok",
                                     api_url=f"http://127.0.0.1:{srv.server_port}")
    srv.server_close()
    assert slug == "acme/engine" and url.endswith("/pull/1")
    assert seen["path"] == "/repos/acme/engine/pulls" and seen["auth"] == "Bearer tok"
    assert seen["body"]["head"] == "autokernel/x" and seen["body"]["base"] == "main"
