"""A checkout and a venv under /tmp (CI clones live there) get the full sandbox, not a silent fallback.

bubblewrap used to bind the interpreter and the project BEFORE mounting its private /tmp, which then hid them: the
probe failed and `isolation: auto` quietly ran every candidate as a plain subprocess. Here the gate runs from a copy
of the project under /tmp with a venv under /tmp (hard links of this one: cheap), in a separate interpreter.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autokernel import sandbox
from autokernel.paths import INSTALLED
from autokernel.policy import Sandbox
from autokernel.sandbox import bwrap

# gate.max_rows 0: no production-range sweep and no calls past the CPU row cap (tens of interpreter seconds that prove
# nothing about isolation; each of the gate's jobs still runs in the sandbox)
SCRIPT = """
import json, torch, autokernel
from autokernel.gate import verify
from autokernel.paths import INSTALLED_LAYOUT
from autokernel.policy import Policy
v = verify("rmsnorm", "kernels/rmsnorm.py", stages=[], dtypes=[torch.float32], dists=["normal"], run_dir={runs!r},
           kernels_dir=INSTALLED_LAYOUT.kernels, policy=Policy(gate={{"max_rows": 0}}))
d = json.loads(v.to_json())
iso = [s.get("metrics", s).get("isolation") for s in d["stages"] if "isolation" in json.dumps(s)]
print(json.dumps({{"file": autokernel.__file__, "verdict": v.verdict, "isolation": iso}}))
"""


def _full() -> str:
    try:
        return sandbox.preflight(Sandbox(), untrusted_author=True)
    except Exception as e:  # noqa: BLE001 -- the reason to skip
        return str(e)


def _venv_under(root: Path) -> Path:
    """This interpreter's venv as a venv under `root` (hard links), or this one if it already is under /tmp."""
    if sys.prefix.startswith("/tmp/"):
        return Path(sys.executable)
    dst = root / "venv"
    p = subprocess.run(["cp", "-al", sys.prefix, str(dst)], capture_output=True)
    if p.returncode != 0:
        pytest.skip(f"cannot hard-link the venv under /tmp: {p.stderr.decode()[:200]}")
    return dst / "bin" / Path(sys.executable).name


@pytest.mark.slow
@pytest.mark.skipif(_full() != "bwrap+cgroup+seccomp" and not os.environ.get("AUTOKERNEL_REQUIRE_ISOLATION"),
                    reason=f"needs full isolation here: {_full()}")
def test_gate_from_a_checkout_and_venv_under_tmp_is_fully_isolated():
    root = Path(tempfile.mkdtemp(prefix="ak-tmp-checkout-", dir="/tmp"))
    try:
        repo = root / "repo"
        for pkg in bwrap.PROJECT_PACKAGES:
            shutil.copytree(INSTALLED / pkg, repo / pkg, ignore=shutil.ignore_patterns("__pycache__"))
        python = _venv_under(root)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        p = subprocess.run([str(python), "-B", "-c", SCRIPT.format(runs=str(root / "runs"))], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        out = json.loads(p.stdout.strip().splitlines()[-1])
        assert out["file"].startswith(str(repo)), out  # the copy under /tmp, not this checkout
        assert out["verdict"] == "accepted", p.stdout[-3000:]
        assert out["isolation"] and set(out["isolation"]) == {"bwrap+cgroup+seccomp"}, out
    finally:
        shutil.rmtree(root, ignore_errors=True)
