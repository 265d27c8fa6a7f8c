"""`autokernel run --repo` on the toy target with its planted slow kernel (test_target_run.py, whose checkout, policy
and commit checks this uses), an OpenAI-compatible server on 127.0.0.1 playing the LLM: its eps-pinning cheat is
judged and rejected, its one-block rewrite committed. A file of its own so that pytest-xdist's loadfile runs it beside
the offline search's test, not after it. Slow: minutes on 2 CPU cores."""
import textwrap

import pytest
from fake_llm_api import Call, FakeAPI, openai_turn
from test_target_gate import NORM
from test_target_run import USER_POLICY, assert_committed, run, slow_checkout

pytestmark = pytest.mark.slow

# The one-block rewrite, its helper inlined: the slow incumbent has no plain helper function for it to keep
FAST_NORM = textwrap.dedent(NORM.replace("def _block(n):\n    return triton.next_power_of_2(n)\n\n\n", "")
                            .replace("BLOCK=_block(x.shape[-1])", "BLOCK=triton.next_power_of_2(x.shape[-1])"))


@pytest.fixture
def slow_target(tmp_path):
    return slow_checkout(tmp_path)


def test_an_llm_through_a_local_server_commits_its_rewrite_and_its_cheat_is_rejected(slow_target, tmp_path):
    base = slow_target.head.commit.hexsha
    cheat = FAST_NORM.replace("_norm_kernel[(rows,)](x, y, eps,", "_norm_kernel[(rows,)](x, y, 1e-5,")
    assert cheat != FAST_NORM
    script = [openai_turn("Pin eps to what production sends.", [Call("submit_candidate", {"source": cheat})]),
              openai_turn("One block per row, one pass.", [Call("submit_candidate", {"source": FAST_NORM})]),
              openai_turn("", [Call("finish", {"summary": "the whole row in one block"})])]
    user = tmp_path / "mine.yaml"  # the user's own policy: the gate's rows at the interpreter's cap (test_target_run)
    user.write_text(USER_POLICY)
    with FakeAPI(script) as api:
        r = run(["--repo", slow_target.working_tree_dir, "--agent", "openai", "--base-url", f"{api.base_url}/v1",
                 "--policy", str(user)], tmp_path)
    c = assert_committed(slow_target, base, r)
    assert c.tree["toyt/ops/norm.py"].data_stream.read().decode() == FAST_NORM
    transcript = next((tmp_path / "cache").glob("autokernel/run/*/norm/transcript.json")).read_text()
    assert "numeric.mismatch" in transcript  # the pinned eps was judged and rejected before the rewrite won
