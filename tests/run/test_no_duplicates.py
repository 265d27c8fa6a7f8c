"""No duplicate work or PRs (issue 23, item 3). A kernels/<op>.py that is already the tip of an autokernel/* branch
over the same base (a local branch, or only a remote's as in a fresh CI checkout) is answered from there: never
gated, confirmed or committed again, and the op ends already_delivered naming the branch. With --open-pr, a win
updates the open PR of the same op (its branch moved to the new commit under a lease; title and body replaced)
instead of opening another. Scripted model, stub evaluator (delivery_doubles.py), a fake GitHub, a bare remote."""
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import git
import pytest
import typer
from delivery_doubles import ScriptedModel, StubEvaluator, today_branch, turn, write_trace
from rich.console import Console
from typer.testing import CliRunner

from autokernel import git as delivery
from autokernel import paths, run
from autokernel.cli import run as run_cli
from autokernel.policy import Policy

ROOT = Path(__file__).parents[2]


@pytest.fixture
def clone(tmp_path):
    return git.Repo.clone_from(ROOT, tmp_path / "clone")


def source(clone, tag: str = "two rows per program") -> str:
    return (Path(clone.working_tree_dir) / "kernels" / "rmsnorm.py").read_text() + f"# {tag}\n"


class Stub(StubEvaluator):
    def __init__(self, op_dir, on_evaluate=None):
        super().__init__(op_dir)
        self.on_evaluate = on_evaluate

    def gate(self, candidate, deadline=None):
        if self.on_evaluate:
            self.on_evaluate(candidate.text)
        return super().gate(candidate, deadline)


def ctx_for(clone, llm, stubs: list, on_evaluate=None):
    def make(op_dir, *a):
        stubs.append(Stub(op_dir, on_evaluate))
        return stubs[-1]
    return run.Context(paths.Layout(Path(clone.working_tree_dir)), Policy(), Policy().agent, llm, make,
                       Console(file=io.StringIO(), width=300), yes=True)


def submits(*sources):
    return ScriptedModel([turn("", ("submit_candidate", {"source": s})) for s in sources]
                         + [turn("", ("finish", {"summary": "done"}))])


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_second_run_on_the_same_base_makes_no_new_branch(clone, tmp_path, where):
    src, stubs = source(clone), []
    trace = write_trace(tmp_path / "t")
    _, (first,) = run.pipeline(ctx_for(clone, submits(src), stubs), op="rmsnorm", resume=None, trace=trace)
    assert first.status == "committed" and first.branch == today_branch("rmsnorm")
    if where == "remote":  # a CI checkout: last night's branch exists only as origin/<branch>
        clone.git.update_ref(f"refs/remotes/origin/{first.branch}", first.sha)
        clone.git.branch("-D", first.branch)
    heads = sorted(h.name for h in clone.heads)
    ctx = ctx_for(clone, submits(src), stubs)
    _, (second,) = run.pipeline(ctx, op="rmsnorm", resume=None, trace=trace)
    assert second.status == "already_delivered" and second.sha == first.sha
    assert second.branch == (first.branch if where == "local" else f"origin/{first.branch}")
    assert stubs[-1].evaluated == [] and stubs[-1].confirmed == []  # not gated, not confirmed
    assert sorted(h.name for h in clone.heads) == heads  # no -2 branch


def test_the_answer_tells_the_model_where_and_does_not_count(clone, tmp_path):
    src, stubs = source(clone), []
    trace = write_trace(tmp_path / "t")
    run.pipeline(ctx_for(clone, submits(src), stubs), op="rmsnorm", resume=None, trace=trace)
    other = source(clone, "another idea")
    llm = submits(src, other)
    state, (o,) = run.pipeline(ctx_for(clone, llm, stubs), op="rmsnorm", resume=None, trace=trace)
    assert stubs[-1].evaluated == [other]  # the delivered source was answered, the new one judged and committed
    assert o.status == "committed" and o.branch == today_branch("rmsnorm") + "-2"
    t = json.loads((state.run_dir / "rmsnorm" / "transcript.json").read_text())
    answer = json.loads(next(m["content"] for m in t["messages"] if m["role"] == "tool"))
    assert answer["already_delivered"] and answer["branch"] == today_branch("rmsnorm")
    assert t["submitted"] == 1


def test_a_branch_made_during_the_session_is_not_committed_twice(clone, tmp_path):
    """The check before the confirming benchmark: the same kernel landed on a branch while the gate ran."""
    src, stubs = source(clone), []
    root = clone.working_tree_dir
    on_evaluate = lambda s: delivery.commit_files(root, "autokernel/elsewhere", {"kernels/rmsnorm.py": s}, "m")  # noqa: E731
    _, (o,) = run.pipeline(ctx_for(clone, submits(src), stubs, on_evaluate), op="rmsnorm", resume=None,
                           trace=write_trace(tmp_path / "t"))
    assert o.status == "already_delivered" and o.branch == "autokernel/elsewhere"
    assert stubs[-1].confirmed == [] and today_branch("rmsnorm") not in [h.name for h in clone.heads]


class FakeGitHub:
    """GET /repos/acme/engine/pulls lists `open`; POST opens, PATCH updates; every call recorded."""

    def __init__(self, open_prs):
        self.calls, self.open = [], open_prs
        gh = self

        class H(BaseHTTPRequestHandler):
            def reply(self, obj, code=200):
                out = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def do_GET(self):
                gh.calls.append(("GET", self.path, None))
                self.reply(gh.open)

            def do_POST(self):
                gh.calls.append(("POST", self.path, self.body()))
                self.reply({"html_url": "http://gh/acme/engine/pull/2", "number": 2}, 201)

            def do_PATCH(self):
                gh.calls.append(("PATCH", self.path, self.body()))
                self.reply({"html_url": "http://gh/acme/engine/pull/1", "number": 1})

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.parametrize("open_pr", [True, False])
def test_open_pr_updates_the_open_pr_of_the_same_op(clone, tmp_path, monkeypatch, open_pr):
    root = clone.working_tree_dir
    bare = git.Repo.init(tmp_path / "acme" / "engine.git", bare=True)
    clone.git.remote("set-url", "origin", bare.git_dir)
    clone.git.push("origin", f"HEAD:refs/heads/{clone.active_branch.name}")
    old = delivery.commit_files(root, "autokernel/2020-01-01-rmsnorm", {"kernels/rmsnorm.py": source(clone, "old")},
                                "autokernel: last night's")
    delivery.push(root, old.branch)
    clone.git.branch("-D", old.branch)  # a CI checkout: only the remote has it
    other_op = {"number": 9, "html_url": "http://gh/acme/engine/pull/9", "base": {"ref": clone.active_branch.name},
                "head": {"ref": "autokernel/2020-01-01-add_rmsnorm", "sha": "0" * 40,
                         "repo": {"full_name": "acme/engine"}}}
    mine = {**other_op, "number": 1, "html_url": "http://gh/acme/engine/pull/1",
            "head": {"ref": old.branch, "sha": old.sha, "repo": {"full_name": "acme/engine"}}}
    gh = FakeGitHub([other_op] + ([mine] if open_pr else []))
    monkeypatch.setenv("GITHUB_TOKEN", "tok")
    ctx = ctx_for(clone, submits(source(clone)), [])
    monkeypatch.setattr(run, "context", lambda **kw: ctx)
    app = typer.Typer()
    run_cli.register(app)
    out = tmp_path / "n"
    r = CliRunner().invoke(app, ["nightly", "--op", "rmsnorm", "--open-pr", "--github-api", gh.url, "--out", str(out),
                                 "--trace", str(write_trace(tmp_path / "t"))], catch_exceptions=False)
    gh.server.shutdown()
    assert r.exit_code == 0, r.output
    (o,) = json.loads((out / "summary.json").read_text())["outcomes"]
    methods = [c[0] for c in gh.calls]
    if open_pr:
        assert methods == ["GET", "PATCH"] and gh.calls[1][1] == "/repos/acme/engine/pulls/1"
        assert gh.calls[1][2]["title"].startswith("autokernel: faster rmsnorm")
        assert bare.commit(old.branch).hexsha == o["sha"]  # the PR's branch now carries the new commit
        assert today_branch("rmsnorm") not in [h.name for h in bare.heads]
        assert json.loads((out / "summary.json").read_text())["pull_requests"] == ["http://gh/acme/engine/pull/1"]
    else:
        assert methods == ["GET", "POST"] and gh.calls[1][2]["head"] == today_branch("rmsnorm")
        assert bare.commit(today_branch("rmsnorm")).hexsha == o["sha"] and bare.commit(old.branch).hexsha == old.sha


def test_a_second_nightly_says_where_the_win_already_is(clone, tmp_path, monkeypatch):
    app = typer.Typer()
    run_cli.register(app)
    trace = write_trace(tmp_path / "t")
    for night in (1, 2):
        monkeypatch.setattr(run, "context", lambda **kw: ctx_for(clone, submits(source(clone)), []))
        out = tmp_path / f"night-{night}"
        r = CliRunner().invoke(app, ["nightly", "--op", "rmsnorm", "--out", str(out), "--trace", str(trace)],
                               catch_exceptions=False)
        assert r.exit_code == 0, r.output
    assert [h.name for h in clone.heads if h.name.startswith("autokernel/")] == [today_branch("rmsnorm")]
    pr = (tmp_path / "night-2" / "pr.md").read_text()
    assert pr.startswith("# autokernel nightly: already delivered") and today_branch("rmsnorm") in pr
