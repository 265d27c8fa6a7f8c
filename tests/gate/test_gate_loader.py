"""The gate cannot be told from production by how a kernel is loaded (docs/design.md): the numeric harness and the
engine (the end-to-end job's, and the one `autokernel generate` runs) load kernels/<op>.py through one function,
autokernel.kernel_loader.load_kernel: module `kernels.<op>`, file `<op>.py`, the kernels package first (the
interpreter switch and its bf16 tl.dot fix), and in a sandbox one neutral argv and one set of environment keys."""
import re
import sys
from pathlib import Path

import torch

from autokernel import kernel_loader, sandbox
from autokernel.engine.optable import OpTable
from autokernel.gate import e2e_child, numeric
from autokernel.ops import get
from autokernel.policy import Policy

PROBE = Path(__file__).parent / "probe" / "rmsnorm.py"
SEEN = re.compile(r"probe ([0-9a-f]{16}) (\S+) (\S+) (\[.*?\]) (\d+)")


def _numeric_job(tmp_path: Path) -> str:
    job = tmp_path / "numeric"
    job.mkdir()
    spec = get("rmsnorm")
    planned = numeric.plan(spec, [{"M": 1, "N": 6}], [torch.float32], ["normal"])
    runtime, _ = numeric.run(spec, PROBE, job, Policy().sandbox, 1, planned)
    assert runtime.reason == "runtime.exception", runtime
    return runtime.detail


def _engine_job(tmp_path: Path) -> str:
    policy = Policy()
    payload = {"op": "rmsnorm", "candidate": PROBE.name, "model": policy.target.model, "backend": "reference",
               "weights": policy.target.weights, "seqs": [[1, 2]], "prompt_lens": [1], "max_new_tokens": 1}
    res = sandbox.run(e2e_child.run, payload, tmp_path / "e2e", policy.sandbox,
                      inputs={PROBE.name: PROBE.read_bytes()})
    assert not res.ok and res.reason == "sandbox.error", res
    return res.detail


def test_gate_and_engine_load_a_candidate_identically(tmp_path):
    gate, engine = SEEN.search(_numeric_job(tmp_path)), SEEN.search(_engine_job(tmp_path))
    assert gate and engine, (gate, engine)
    assert gate.group(2) == engine.group(2) == "kernels.rmsnorm"  # __name__
    assert gate.group(3) == engine.group(3) == "rmsnorm.py"  # __file__'s basename
    assert gate.group(4) == engine.group(4) == repr(list(kernel_loader.NEUTRAL_ARGV))  # sys.argv
    assert gate.group(5) == engine.group(5)  # as many environment variables
    assert gate.group(1) == engine.group(1)  # and the same digest of all four (environment keys included)


def test_the_engine_loads_its_own_kernels_through_the_loader():
    """In process (autokernel generate): kernels.<op> from kernels/<op>.py, the module the import system would give;
    an override named otherwise is refused rather than loaded under another name."""
    table = OpTable("triton")
    fn = table.launchers["rmsnorm"]
    mod = sys.modules["kernels.rmsnorm"]
    assert fn.__module__ == "kernels.rmsnorm" and Path(mod.__file__).name == "rmsnorm.py"
    assert kernel_loader.load_kernel("rmsnorm") is mod  # reused, not re-executed


def test_a_candidate_must_be_named_after_its_op(tmp_path):
    odd = tmp_path / "candidate.py"
    odd.write_text("def rmsnorm(x, weight, eps):\n    return x\n")
    try:
        kernel_loader.load_kernel("rmsnorm", odd)
    except kernel_loader.KernelLoadError as e:
        assert "rmsnorm.py" in str(e)
    else:
        raise AssertionError("a file not named rmsnorm.py was loaded as kernels.rmsnorm")
