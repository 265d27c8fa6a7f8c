"""The end-to-end stage on the live SmolLM2: the incumbent passes, a known-bad perturbation fails, the repetition
guard fires on a run the baseline did not have. Prints the calibrated noise floor."""
import io
import shutil
from pathlib import Path

import pytest

from autokernel.gate import e2e
from autokernel.policy import Policy

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def job(tmp_path_factory):
    d = ROOT / "sandbox" / "tests" / tmp_path_factory.mktemp("e2e").name  # inside the project: bwrap binds it
    d.mkdir(parents=True, exist_ok=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_incumbent_passes_and_floor_is_reported(job):
    shutil.copy(ROOT / "kernels" / "rmsnorm.py", job / "rmsnorm.py")
    r = e2e.stage("rmsnorm", job / "rmsnorm.py", Policy())
    print(f"e2e incumbent rmsnorm: {r.detail}; noise floor {r.metrics.get('noise_floor')}")
    assert r.passed, r.detail
    assert r.metrics["kl_max"] <= Policy().e2e.kl_max_max and r.metrics["top1"] >= Policy().e2e.top1_min


def test_known_bad_perturbation_fails(job):
    """eps 1000x too large inside the norm: each layer barely changes, the model's distributions do."""
    src = (ROOT / "kernels" / "add_rmsnorm.py").read_text()
    assert src.count("+ eps") >= 1
    (job / "add_rmsnorm.py").write_text(src.replace("+ eps", "+ eps * 1000.0"))
    r = e2e.stage("add_rmsnorm", job / "add_rmsnorm.py", Policy())
    print(f"e2e perturbed add_rmsnorm: {r.reason}: {r.detail}")
    assert not r.passed and r.reason in ("e2e.kl_exceeded", "e2e.top1")


def test_repetition_guard(monkeypatch, job):
    """KL within bounds but a 4-token run the baseline never had: the race signature."""
    import torch
    base = {"seqs": [[1, 2, 3]], "prompt_lens": [2], "new": [[5, 6, 7, 8]], "logits": torch.zeros(1, 3, 4),
            "mask": torch.ones(1, 3, dtype=torch.bool), "floor": torch.tensor([0.0, 0.0, 0.0, 1.0])}
    monkeypatch.setattr(e2e, "baseline", lambda policy, *a, **k: base)
    buf = io.BytesIO()
    torch.save(torch.zeros(1, 3, 4), buf)  # logits travel in the result, as torch.save bytes (autokernel.sandbox)

    class Res:
        ok, reason, detail, data = True, None, "", {"new": [[9, 9, 9, 9]], "logits": buf.getvalue()}

    def fake_run(entry, payload, job_dir, limits, **kw):
        return Res()

    monkeypatch.setattr(e2e.sandbox, "run", fake_run)
    (job / "x.py").write_text("")
    r = e2e.stage("rmsnorm", job / "x.py", Policy())
    assert not r.passed and r.reason == "e2e.degenerate_repetition", r


def test_job_limits_follow_the_candidates_measured_speed():
    """A slow but correct candidate gets the time its e2e job needs (issue: a matmul_q4_1 rewrite was killed at the
    300 s default): op calls counted by the baseline x the numeric stage's per-call times, times the policy factor."""
    policy = Policy()
    base = {"calls": {"rmsnorm": {"M=3,N=576": 2000, "M=120,N=576": 30}}, "model_s": 20.0}
    fast = {"call_s": {"M=1,N=576": 0.002, "M=96,N=576": 0.05}}
    limits, predicted = e2e.job_limits("rmsnorm", policy, base, fast)
    assert limits.timeout_s == policy.sandbox.timeout_s and 20.0 < predicted < 100.0
    slow = {"call_s": {"M=1,N=576": 0.2, "M=96,N=576": 5.0}}  # 100x slower under the interpreter
    limits, predicted = e2e.job_limits("rmsnorm", policy, base, slow)
    assert predicted > 400.0 and limits.timeout_s >= policy.gate.e2e_timeout_factor * predicted
    assert limits.cpu_s >= limits.timeout_s and policy.sandbox.timeout_s == 300.0  # the policy itself is untouched
    assert e2e.job_limits("rmsnorm", policy, {}, slow) == (policy.sandbox, None)  # an old baseline: the policy's
