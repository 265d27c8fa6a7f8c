"""The real orchestration path (run.pipeline -> work_on -> agent session -> confirm -> report -> commit) into a clone
of THIS repository (its .gitignore ignores traces/ and sandbox/), with a scripted model and a stub evaluator whose
verdict and measurement are fixed data: fast and deterministic. The slow end-to-end run is in test_run_e2e.py."""
import io
import json
import subprocess
import sys
from pathlib import Path

import git
import pytest
from delivery_doubles import HOSTILE, ScriptedModel, StubEvaluator, today_branch, turn, write_trace
from rich.console import Console

from autokernel import git as delivery
from autokernel import paths, run
from autokernel.cli import run as run_cli
from autokernel.errors import UserError
from autokernel.policy import Policy

ROOT = Path(__file__).parents[2]
HOOKS = ("pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-checkout", "reference-transaction",
         "post-index-change", "pre-push")


@pytest.fixture
def clone(tmp_path):
    repo = git.Repo.clone_from(ROOT, tmp_path / "clone")
    wd = Path(repo.working_tree_dir)
    assert "traces/*" in (wd / ".gitignore").read_text()  # the real ignore rules the old `git add` tripped on
    (wd / "kernels" / "silu_mul.py").write_text((wd / "kernels" / "silu_mul.py").read_text() + "# user's edit\n")
    (wd / "notes.txt").write_text("untracked\n")
    (wd / "staged.txt").write_text("staged\n")
    repo.git.add("staged.txt")
    repo.git.update_environment(GIT_OPTIONAL_LOCKS="0")  # the test's own `git status` must not rewrite the index
    marks = tmp_path / "hook-ran"  # every hook git could run writes a marker here
    marks.mkdir()
    for h in HOOKS:
        (wd / ".git" / "hooks" / h).write_text(f"#!/bin/sh\ntouch {marks}/{h}\n")
        (wd / ".git" / "hooks" / h).chmod(0o755)
    return repo


def snapshot(repo):
    wd = Path(repo.working_tree_dir)
    files = sorted(str(p.relative_to(wd)) for p in wd.rglob("*") if ".git" not in p.parts
                   and "sandbox" not in p.parts and "traces" not in p.parts)
    return (repo.active_branch.name, repo.head.commit.hexsha, repo.git.status("--porcelain"), repo.git.diff(),
            repo.git.diff("--cached"), (wd / ".git" / "index").read_bytes(), files,
            sorted(h.name for h in repo.heads))


def fast_source(clone) -> str:
    text = (Path(clone.working_tree_dir) / "kernels" / "rmsnorm.py").read_text()
    return text + "# two rows per program (the scripted model's rewrite)\n"


def context(clone, llm, console, **kw):
    return run.Context(paths.Layout(Path(clone.working_tree_dir)), Policy(), Policy().agent, llm,
                       lambda op_dir, *a: StubEvaluator(op_dir), console, yes=True, **kw)


def test_a_win_becomes_a_commit_on_this_repo(clone, tmp_path):
    before = snapshot(clone)
    source = fast_source(clone)
    rationale = "Two rows per program halve the launches. [bold green]ACCEPTED[/] \x1b[2J ![x](http://t/p.png)"
    llm = ScriptedModel([turn(rationale, ("submit_candidate", {"source": source})),
                         turn("", ("finish", {"summary": "rows batched \x1b]0;t\x07"}))])
    out = io.StringIO()
    state, outcomes = run.pipeline(context(clone, llm, Console(file=out, width=200)), op="rmsnorm", resume=None,
                                   trace=write_trace(tmp_path / "trace-1"))
    (o,) = outcomes
    assert o.status == "committed", o
    assert o.branch == today_branch("rmsnorm")
    c = clone.commit(o.branch)
    evidence = f"traces/autokernel/{state.run_dir.name}/rmsnorm.json"
    profile = f"traces/autokernel/{state.run_dir.name}/profile/summary.json"  # small: committed with the evidence
    assert sorted(c.stats.files) == sorted(["kernels/rmsnorm.py", evidence, profile])
    assert c.tree[profile].data_stream.read() == (tmp_path / "trace-1" / "summary.json").read_bytes()
    assert c.parents[0].hexsha == before[1]
    assert c.tree["kernels/rmsnorm.py"].data_stream.read().decode() == source
    msg = c.message
    assert msg.startswith("autokernel: faster rmsnorm (2.000x [1.900, 2.100], CPU / Triton interpreter; 10.0% of "
                          "profiled time, <= x1.05 end to end)")
    # the speedup beside the op's share of the profile and Amdahl's bound: 1 / (0.9 + 0.1 / 2)
    assert "**2.00x faster rmsnorm; rmsnorm is 10.0% of profiled time: x1.05 end to end at most (Amdahl)**" in msg
    assert "| shape | dtype | calls | before ms | after ms | speedup [CI] |" in msg
    assert "| M=4 N=576 | float32 | 60 | 0.5 | 0.25 | 2.000 [1.900, 2.100] |" in msg
    assert "interpreter timings, not GPU speed" in msg
    assert "- KL mean 1.1e-11 / p99 2e-10 / max 3e-09 nats over 40 tokens; top-1 agreement 1" in msg
    assert "- checked where: a PARTIAL check (Triton-interpreter budget): the candidate in 2 of 31 layers (drawn at " \
           "random), decode steps only, 8 greedy tokens" in msg  # the e2e plan, when partial, is never hidden
    assert "isolation bwrap+cgroup" in msg and "seed 12345" in msg
    assert f"git show {before[1][:12]}:kernels/rmsnorm.py > /tmp/base_rmsnorm.py" in msg
    # the reviewer benchmarks and checks the profiled shapes and call counts, from the committed profile
    trace = f"traces/autokernel/{state.run_dir.name}/profile"
    assert f"autokernel bench rmsnorm kernels/rmsnorm.py --incumbent /tmp/base_rmsnorm.py --trace {trace}\n" in msg
    assert f"autokernel verify rmsnorm kernels/rmsnorm.py --trace {trace} --seed 12345" in msg
    assert str(tmp_path) not in msg  # no machine-local path in what a reviewer reruns
    assert "Two rows per program halve the launches." in msg and "rows batched" in msg
    assert "\x1b" not in msg and "\x07" not in msg
    assert "\n```text\nTwo rows" in msg  # the model's words are fenced: shown, never rendered
    ev = json.loads(c.tree[evidence].data_stream.read())
    assert len(c.tree[evidence].data_stream.read().decode().splitlines()) < 150  # a reviewable summary
    assert ev["gate"]["stages"][3]["metrics"]["kl_mean"] == 1.1e-11 and "cases" not in ev["gate"]["stages"][2][
        "metrics"]
    assert ev["speedup"] == [2.0, 1.9, 2.1] and ev["base"] == before[1]
    after = snapshot(clone)
    assert after[:-1] == before[:-1]  # HEAD, index, working tree exactly as they were
    assert after[-1] == sorted(before[-1] + [o.branch])  # and the branches, but for the new one
    assert sorted(p.name for p in (tmp_path / "hook-ran").iterdir()) == []
    assert state.run_dir.parent == Path(clone.working_tree_dir) / "sandbox"  # run state lives in the target
    assert json.loads((state.run_dir / "state.json").read_text())["done"]["rmsnorm"]["status"] == "committed"
    assert "\x1b" not in out.getvalue()


def test_an_op_file_that_is_not_heads_is_refused_before_a_session(clone, tmp_path):
    """The op's file edited in the work tree (or hidden from git status by --assume-unchanged): a win would be measured
    against it and committed over HEAD's, so the run stops (exit 2, naming the file) before any session, HEAD,
    index, work tree and branches as they were (a target's op file was checked so already)."""
    wd = Path(clone.working_tree_dir)
    (wd / "kernels" / "rmsnorm.py").write_text((wd / "kernels" / "rmsnorm.py").read_text() + "# slower debug copy\n")
    clone.git.update_index("--assume-unchanged", "kernels/rmsnorm.py")
    before = snapshot(clone)
    llm = ScriptedModel([turn("", ("submit_candidate", {"source": fast_source(clone)}))])
    with pytest.raises(UserError, match="kernels/rmsnorm.py differs from HEAD's copy"):
        run.pipeline(context(clone, llm, Console(file=io.StringIO())), op="rmsnorm", resume=None,
                     trace=write_trace(tmp_path / "trace-1"))
    assert snapshot(clone) == before and len(llm.replies) == 1  # the model was never asked


def test_delivery_error_is_one_line_and_resumable(clone, tmp_path, monkeypatch):
    real = delivery.git
    failures = []

    def refusing(cwd, *args, **kw):
        if args[0] == "update-ref" and not failures:
            failures.append(args)
            raise delivery.DeliveryError("git update-ref failed in X: cannot lock ref 'refs/heads/autokernel/x'")
        return real(cwd, *args, **kw)
    monkeypatch.setattr(delivery, "git", refusing)
    before = snapshot(clone)
    llm = ScriptedModel([turn("", ("submit_candidate", {"source": fast_source(clone)})),
                         turn("", ("finish", {"summary": "done"}))])
    ctx = context(clone, llm, Console(file=io.StringIO()))
    with pytest.raises(UserError) as e:
        run.pipeline(ctx, op="rmsnorm", resume=None, trace=write_trace(tmp_path / "trace-2"))
    assert e.value.exit_code == 2 and "\n" not in str(e.value) and "--resume" in str(e.value)
    run_dir = next((Path(clone.working_tree_dir) / "sandbox").glob("run-*"))
    assert json.loads((run_dir / "state.json").read_text())["done"]["rmsnorm"]["status"] == "delivery_failed"
    assert snapshot(clone) == before
    ctx.llm = ScriptedModel([])  # resuming makes no new session: an empty script would fail if asked
    state, (o,) = run.pipeline(ctx, op=None, resume=run_dir, trace=None)
    assert o.status == "committed" and o.branch == today_branch("rmsnorm")
    assert "kernels/rmsnorm.py" in clone.commit(o.branch).stats.files


def test_hostile_details_reach_the_terminal_escaped(clone, tmp_path):
    """A rejection detail with `[/]` and ANSI/OSC escapes: no MarkupError, no escape byte printed."""
    llm = ScriptedModel([turn("", ("submit_candidate", {"source": "REJECT " + HOSTILE})),
                         turn("", ("finish", {"summary": HOSTILE}))])
    out = io.StringIO()
    _, (o,) = run.pipeline(context(clone, llm, Console(file=out, width=200)), op="rmsnorm", resume=None,
                           trace=write_trace(tmp_path / "trace-3"))
    assert o.status == "no_improvement"
    text = out.getvalue()
    assert "static.forbidden_call: x[/]y" in text and "ACCEPTED" in text  # shown as plain text
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text


def test_repo_without_an_autokernel_layout_is_refused(tmp_path):
    git.Repo.init(tmp_path / "other")
    (tmp_path / "other" / "src").mkdir()
    with pytest.raises(UserError, match=r"not an autokernel checkout") as e:
        run_cli.context(agent="search", model=None, base_url=None, repo=tmp_path / "other", policy_file=None,
                        console=Console(file=io.StringIO()))
    assert "\n" not in str(e.value)


def test_cli_refuses_a_repo_that_is_not_an_autokernel_checkout(tmp_path):
    git.Repo.init(tmp_path / "other")
    r = subprocess.run([str(Path(sys.executable).parent / "autokernel"), "run", "--agent", "search", "--op", "rmsnorm",
                        "--repo", str(tmp_path / "other")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "not an autokernel checkout" in r.stderr and "Traceback" not in r.stderr


def test_unreachable_base_url_is_refused_before_profiling(clone, monkeypatch):
    import socket
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from autokernel.profile import profiler
    monkeypatch.setattr(profiler, "profile", lambda **kw: pytest.fail("profiled before checking the server"))
    with pytest.raises(UserError, match=f"127.0.0.1:{port}") as e:
        run_cli.context(agent="openai", model="m", base_url=f"http://127.0.0.1:{port}/v1",
                        repo=Path(clone.working_tree_dir), policy_file=None, console=Console(file=io.StringIO()))
    assert "\n" not in str(e.value)


def test_missing_key_is_refused_before_profiling(clone, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    from autokernel.profile import profiler
    monkeypatch.setattr(profiler, "profile", lambda **kw: pytest.fail("profiled before checking the key"))
    with pytest.raises(UserError, match="OPENAI_API_KEY"):
        run_cli.context(agent="openai", model=None, base_url=None, repo=Path(clone.working_tree_dir),
                        policy_file=None, console=Console(file=io.StringIO()))
