"""Suite-wide set-up. The helper modules of the test folders (opcheck, tiny_gguf, agent_helpers, fake_llm_api,
delivery_doubles) are importable by name through pyproject's [tool.pytest.ini_options] pythonpath.

The suite runs on pytest-xdist workers (pyproject: `-n auto --dist loadgroup`): a session fixture is set up once per
worker, tests that share state outside their tmp_path are kept on one worker with `pytest.mark.xdist_group`, and
the modules with slow tests are collected first so that no minutes-long test starts last."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autokernel import device

device.ensure_interpreter()  # no GPU here: the kernels run through the Triton interpreter (before triton is imported)
# 2 cores shared with sandboxed children: oversubscribed OpenMP spins (7x slower measured)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No user config (autokernel.paths.user_config): a developer's ~/.config/autokernel/policies.yaml must not change what
# the suite runs; the tests of the trust rule set their own.
os.environ["AUTOKERNEL_CONFIG"] = ""

ROOT = Path(__file__).resolve().parents[1]
# The suite's one profile of the real model: two prompts, a batched prefill and one decode step, reference kernels
# (the real shapes and call counts are the point, not the interpreter's speed).
SMOLLM2_WORKLOAD = "chat: false\nbatch: 2\ndecode_steps: 1\nprompts: [Hi, The capital of France is]\n"


@pytest.fixture(scope="session")
def smollm2_trace(tmp_path_factory) -> Path:
    """`autokernel profile` as a user runs it, on the embedded SmolLM2-135M: the trace directory it writes. Shared by
    tests/profile/test_real_model.py (the shape corpus) and tests/run/test_run.py (run and nightly --trace)."""
    d = tmp_path_factory.mktemp("smollm2")
    (d / "workload.yaml").write_text(SMOLLM2_WORKLOAD)
    cli = Path(sys.executable).parent / "autokernel"  # the installed console script, as a user runs it
    r = subprocess.run([str(cli), "profile", "--kernels", "reference", "--timed-calls", "0",
                        "--workload", str(d / "workload.yaml"), "--out", str(d / "traces")],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (run_dir,) = (d / "traces").iterdir()
    return run_dir


def pytest_collection_modifyitems(config, items):
    """Modules with a slow test first (order otherwise kept, each module's tests together): the xdist workers take
    tests in this order, so the minutes-long end-to-end tests start early and short ones fill in around them."""
    def module(item):
        return item.nodeid.split("::")[0]

    slow = {module(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: module(item) not in slow)
