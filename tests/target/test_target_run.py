"""`autokernel run --repo` on a target checkout, end to end as a user runs it (autokernel/target/run.py): the toy
target of test_target_gate.py with a planted slow kernel (its rows walked in 8-wide chunks, twice), committed in a
git repository; the offline search (here), and an OpenAI-compatible server on 127.0.0.1 playing the LLM
(test_target_run_llm.py: a file of its own, so that pytest-xdist's loadfile runs the two on different workers), each
through the real sandboxed gate (e2e included) and benchmark to one commit on an autokernel/* branch holding only the
op's file. Slow: minutes on 2 CPU cores."""
import datetime
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import git
import pytest
from test_target_gate import checkout

pytestmark = pytest.mark.slow
CLI = [str(Path(sys.executable).parent / "autokernel")]
SLOW_NORM = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _norm_kernel(x_ptr, y_ptr, eps, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0).to(tl.float32)
        acc += x * x
    r = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n + eps)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * n + offs, (x * r).to(y_ptr.dtype.element_ty), mask=m)


def norm(x, eps):
    x = x.contiguous()
    y = torch.empty_like(x)
    rows = x.numel() // x.shape[-1]
    _norm_kernel[(rows,)](x, y, eps, x.shape[-1], BLOCK=8)
    return y
'''
# The checkout's own policy; the runs pass the user's --policy (USER_POLICY) with gate.max_rows at the interpreter's
# cap (1024): the calls past it (numeric._past_cap, up to 4309 rows: 20 s of the gate's 37 s measured) vouch for rows
# this toy engine never sends; they are tests/gate/test_gate_defence.py's. A checkout may not lower it (trust rule 6).
POLICY = "agent:\n  max_iterations: 2\n  max_wall_s: 1500\nbench:\n  max_time_s: 8\n  job_time_s: 0.3\n"
USER_POLICY = POLICY + "gate:\n  max_rows: 1024\n"


def slow_checkout(tmp_path: Path) -> git.Repo:
    root = checkout(tmp_path / "toyt")
    (root / "toyt/ops/norm.py").write_text(textwrap.dedent(SLOW_NORM))
    (root / "policies.yaml").write_text(POLICY)
    repo = git.Repo.init(root)
    repo.index.add([str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".git" not in p.parts])
    repo.index.commit("a target with a slow norm", author=git.Actor("u", "u@x"), committer=git.Actor("u", "u@x"))
    return repo


@pytest.fixture
def slow_target(tmp_path):
    return slow_checkout(tmp_path)


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "AUTOKERNEL_CONFIG": "",
           "OPENAI_API_KEY": "sk-test"}
    r = subprocess.run(CLI + ["run", *args, "--yes"], capture_output=True, text=True, timeout=1800, env=env)
    print(r.stdout[-4000:], r.stderr[-2000:], sep="\n")
    return r


def assert_committed(repo: git.Repo, base: str, r) -> git.Commit:
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    c = repo.commit(f"autokernel/{datetime.date.today().isoformat()}-norm")
    assert c.parents[0].hexsha == base
    assert sorted(c.stats.files) == ["toyt/ops/norm.py"]  # only the op's file
    for needle in ("| shape | dtype | calls | before ms | after ms | speedup [CI] |", "interpreter",
                   "KL mean", "Gate: static pass; runtime pass; numeric pass; e2e pass"):
        assert needle in c.message, needle
    assert repo.head.commit.hexsha == base and not repo.is_dirty(untracked_files=True)  # the work tree untouched
    return c


def test_offline_search_commits_a_faster_launch_configuration(slow_target, tmp_path):
    base = slow_target.head.commit.hexsha
    one = tmp_path / "one.yaml"  # one candidate (the search's first step, BLOCK 8 -> 16, is the win): CI time
    one.write_text(USER_POLICY.replace("max_iterations: 2", "max_iterations: 1"))
    r = run(["--repo", slow_target.working_tree_dir, "--agent", "search", "--policy", str(one)], tmp_path)
    c = assert_committed(slow_target, base, r)
    assert "BLOCK=8)" not in c.tree["toyt/ops/norm.py"].data_stream.read().decode()


@pytest.mark.parametrize("flag", [["--resume", "sandbox/run-x"], ["--trace", "traces/x"], ["--cluster", "ray://h:1"]])
def test_flags_of_autokernels_own_layout_are_refused_for_a_target(tmp_path, flag):
    """`run --repo TARGET --resume DIR` started a new run from scratch, the flag silently ignored (so did --trace and
    --cluster): exit 2 naming the flag, before any of the checkout's code runs."""
    root = checkout(tmp_path / "co")
    r = subprocess.run(CLI + ["run", "--repo", str(root), *flag], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.returncode == 2 and f"{flag[0]} applies to autokernel's own layout" in r.stderr, (r.stdout, r.stderr)


@pytest.mark.parametrize("change", ["declaration", "op_file"])
def test_an_uncommitted_declaration_or_op_file_is_refused_before_the_workload(tmp_path, change):
    """A run with the references filled in an uncommitted autokernel.toml committed a win whose Reproduce line
    (`autokernel verify --repo`, on the branch) failed: HEAD's declaration had no [ops.norm]. The declaration, like
    the op's file, must be HEAD's: exit 2 naming it, before the workload runs, nothing written."""
    repo = slow_checkout(tmp_path)
    root = Path(repo.working_dir)
    rel = "autokernel.toml" if change == "declaration" else "toyt/ops/norm.py"
    (root / rel).write_text((root / rel).read_text() + "\n# an uncommitted edit\n")
    before = (repo.head.commit.hexsha, repo.git.status("--porcelain"), sorted(h.name for h in repo.heads))
    policy = tmp_path / "mine.yaml"
    policy.write_text(USER_POLICY)
    r = run(["--repo", str(root), "--agent", "search", "--op", "norm", "--policy", str(policy)], tmp_path)
    assert r.returncode == 2 and f"{rel} differs from HEAD's copy" in r.stdout + r.stderr, (r.stdout, r.stderr)
    assert "profiling" not in r.stdout and not (tmp_path / "cache" / "autokernel" / "run").exists()
    assert (repo.head.commit.hexsha, repo.git.status("--porcelain"), sorted(h.name for h in repo.heads)) == before
