"""`autokernel run` end to end as a user runs it, no stub anywhere: a temp clone whose committed kernels/rmsnorm.py
is deliberately slow (tests/run/slow_rmsnorm.py), an OpenAI-compatible server on 127.0.0.1 playing the LLM (it
submits the project's one-block-per-row kernel), the real sandboxed gate with its end-to-end KL stage, the real
interleaved benchmark, and a commit on autokernel's branch. Slow: minutes on 2 CPU cores (small trace, one e2e prompt,
short benchmark)."""
import json
import subprocess
import sys
import time
from pathlib import Path

import git
import pytest
from delivery_doubles import today_branch, write_trace
from fake_llm_api import Call, FakeAPI, openai_turn

ROOT = Path(__file__).parents[2]

pytestmark = pytest.mark.slow
CLI = [str(Path(sys.executable).parent / "autokernel")]
POLICY = """agent:
  max_iterations: 2
  max_wall_s: 1200
bench:
  max_time_s: 8
  job_time_s: 0.3
e2e:
  prompts: ["What is the capital of France?"]
"""
# The checkout's own policies.yaml is POLICY; the run passes the user's --policy, USER_POLICY, which also has
# gate.max_rows at the interpreter's cap (1024): the CPU sweep a user's run makes, without the calls past it
# (numeric._reach: up to 30 interpreter seconds of rmsnorm at 1.5k-8k rows, each gate; tests/gate/test_gate_defence.py)
# and 4 greedy tokens end to end. A checkout may not lower either (autokernel.policy.CHECKOUT: trust rule 6).
USER_POLICY = POLICY.replace("e2e:\n", "e2e:\n  max_new_tokens: 4\n") + "gate:\n  max_rows: 1024\n"


@pytest.fixture
def slow_clone(tmp_path):
    """A clone whose base commit has the slow rmsnorm (committed: the user's checkout is clean)."""
    repo = git.Repo.clone_from(ROOT, tmp_path / "clone")
    wd = Path(repo.working_tree_dir)
    (wd / "kernels" / "rmsnorm.py").write_text((Path(__file__).parent / "slow_rmsnorm.py").read_text())
    (wd / "policies.yaml").write_text(POLICY)
    repo.index.add(["kernels/rmsnorm.py", "policies.yaml"])
    repo.index.commit("plant a slow rmsnorm", author=git.Actor("u", "u@x"), committer=git.Actor("u", "u@x"))
    return repo


def run_cli(args, cwd, tmp_path, timeout=1500):
    t0 = time.perf_counter()
    r = subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    wall = time.perf_counter() - t0
    (tmp_path / "stdout.txt").write_text(r.stdout)
    print(r.stdout[-4000:], r.stderr[-2000:], f"\nwall {wall:.0f} s", sep="\n")
    return r, wall


def assert_committed(repo, base: str, r):
    assert r.returncode == 0, r.stderr[-3000:]
    branch = today_branch("rmsnorm")
    c = repo.commit(branch)
    assert c.parents[0].hexsha == base
    files = sorted(c.stats.files)
    # the kernel, its evidence file and the profile the perf table was measured on (so the repro's --trace finds it)
    assert files[0] == "kernels/rmsnorm.py" and len(files) in (2, 3)
    assert all(f.startswith("traces/autokernel/") for f in files[1:])
    for needle in ("| shape | dtype | calls | before ms | after ms | speedup [CI] |", "interpreter timings",
                   "- KL mean ", "top-1 agreement", "Gate: passed static", "isolation ",
                   f"git show {base[:12]}:kernels/rmsnorm.py > /tmp/base_rmsnorm.py",
                   "autokernel bench rmsnorm kernels/rmsnorm.py --incumbent /tmp/base_rmsnorm.py"):
        assert needle in c.message, needle
    assert "BLOCK_N=256" not in c.tree["kernels/rmsnorm.py"].data_stream.read().decode()
    for f in files[1:]:
        json.loads(c.tree[f].data_stream.read())
    return c


def test_openai_agent_against_a_local_server_commits_the_win(slow_clone, tmp_path):
    fast = (ROOT / "kernels" / "rmsnorm.py").read_text()
    base = slow_clone.head.commit.hexsha
    script = [openai_turn("The incumbent walks each row in 256-wide chunks, twice. One block per row "
                          "(BLOCK_N = next power of two of N) reads it once.",
                          [Call("submit_candidate", {"source": fast})]),
              openai_turn("", [Call("finish", {"summary": "One program per row with the whole row in one block: "
                                                          "a single pass for the sum of squares and the store."})])]
    trace = write_trace(tmp_path / "trace-e2e")
    user = tmp_path / "mine.yaml"
    user.write_text(USER_POLICY)
    with FakeAPI(script) as api:
        r, wall = run_cli(["run", "--agent", "openai", "--base-url", f"{api.base_url}/v1", "--op", "rmsnorm",
                           "--yes", "--repo", slow_clone.working_tree_dir, "--trace", str(trace), "--policy",
                           str(user)], slow_clone.working_tree_dir, tmp_path)
    c = assert_committed(slow_clone, base, r)
    assert "One block per row" in c.message and "single pass" in c.message  # the model's rationale, fenced
    assert slow_clone.head.commit.hexsha == base and not slow_clone.is_dirty(untracked_files=False)
    (tmp_path / "commit-message.txt").write_text(c.message)
    pr = next(Path(slow_clone.working_tree_dir, "sandbox").glob("run-*/rmsnorm/delivery/pr.md"))
    print("\n--- commit message ---\n" + c.message + "\n--- PR body ---\n" + pr.read_text())

