"""The gate on the Liger-Kernel example (examples/liger): Liger's own kernels accepted, a cheat and a wrong rewrite of
them rejected with the project's reason codes, through `autokernel verify --repo` (autokernel/target/gate.py).

Needs liger-kernel and transformers (README command 2 installs them; CI sets AUTOKERNEL_REQUIRE_LIGER=1 so the suite
fails rather than skips without them)."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = [str(Path(sys.executable).parent / "autokernel")]
HAVE_LIGER = all(importlib.util.find_spec(m) is not None for m in ("liger_kernel", "transformers"))
REQUIRED = os.environ.get("AUTOKERNEL_REQUIRE_LIGER") == "1"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_LIGER and not REQUIRED, reason=(
    "liger-kernel and transformers are not installed (README command 2 installs them: pyproject's [liger] extra and "
    "transformers --no-deps)"))]


@pytest.fixture(scope="module")
def liger(tmp_path_factory):
    """The example checkout with its completed declaration, committed (what a team that vendors Liger has)."""
    assert HAVE_LIGER, "AUTOKERNEL_REQUIRE_LIGER=1 and liger-kernel or transformers is not importable"
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    base = tmp_path_factory.mktemp("liger")
    ck = base / "llama_liger"
    env = {**os.environ, "PYTHON": sys.executable, "AUTOKERNEL_CONFIG": ""}
    r = subprocess.run(["bash", str(ROOT / "examples/liger/make_checkout.sh"), str(ck)], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    shutil.copy(ROOT / "examples/liger/autokernel.toml", ck / "autokernel.toml")
    subprocess.run(["git", "-C", str(ck), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam",
                    "declaration"], check=True)
    return ck


def verify(ck: Path, tmp_path: Path, op: str, source: str, *extra: str) -> tuple[int, dict]:
    cand = tmp_path / f"{op}.py"
    cand.write_text(source)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "AUTOKERNEL_CONFIG": ""}
    r = subprocess.run(CLI + ["verify", "--repo", str(ck), op, str(cand), "--json", *extra], capture_output=True,
                       text=True, timeout=900, env=env)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    assert subprocess.run(["git", "-C", str(ck), "status", "--porcelain"], capture_output=True, text=True
                          ).stdout == "", "verify wrote into the checkout"
    return r.returncode, json.loads(r.stdout)


def failure(v: dict) -> tuple[str, str]:
    bad = next(s for s in v["stages"] if not s["passed"])
    return bad["reason"], bad["detail"]


def test_liger_rope_is_accepted_end_to_end(liger, tmp_path):
    """In-place outputs (q and k), the declared cos/sin rule, views as outputs, and the engine with it swapped in.
    Policy gate.max_rows at the interpreter's cap (1024): the calls past it (numeric._reach, up to 30 interpreter
    seconds) prove none of these; tests/gate/test_gate_defence.py has them."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("gate:\n  max_rows: 1024\n")
    rc, v = verify(liger, tmp_path, "rope", (liger / "llama_liger/ops/rope.py").read_text(), "--policy", str(policy))
    assert rc == 0, v
    assert [s["name"] for s in v["stages"]] == ["static", "runtime", "numeric", "e2e"]
    assert v["stages"][-1]["metrics"]["top1"] == 1.0
    assert v["stages"][-1]["metrics"]["calls_judged"] >= 1  # Liger's rope calls in the HF engine, judged in place


def test_liger_swiglu_exact_only_at_production_gate_multiplier_is_rejected(liger, tmp_path):
    """The workload always sends gate_multiplier = 1.0; the gate draws it per case."""
    src = (liger / "llama_liger/ops/swiglu.py").read_text()
    old = "            float(gate_multiplier),\n            n_cols=n_cols,"
    assert old in src
    rc, v = verify(liger, tmp_path, "swiglu", src.replace(old, "            1.0,\n            n_cols=n_cols,"))
    assert rc == 1 and failure(v)[0] == "numeric.mismatch", v


def test_liger_rms_norm_without_eps_is_rejected(liger, tmp_path):
    """A wrong rewrite: rstd without eps is right on most inputs, wrong on small ones (the gate's tiny values)."""
    src = (liger / "llama_liger/ops/rms_norm.py").read_text()
    old = "rstd = rsqrt(mean_square + eps)"
    assert src.count(old) == 2  # the row kernel and the block kernel
    rc, v = verify(liger, tmp_path, "rms_norm", src.replace(old, "rstd = rsqrt(mean_square)"))
    assert rc == 1 and failure(v)[0] == "numeric.mismatch", v


def test_liger_swiglu_importing_what_liger_does_not_is_refused(liger, tmp_path):
    src = (liger / "llama_liger/ops/swiglu.py").read_text()
    rc, v = verify(liger, tmp_path, "swiglu", "import os\n" + src)
    assert rc == 1 and failure(v)[0] == "static.forbidden_import", v
