"""The timing job's tamper check (job._TamperCheck) is the gate's snapshot (autokernel.harness.Snapshot): what the
gate's job would call runtime.global_state is bench.tampered here too, including the state the old bench-only check
never looked at (torch flags, the environment, the harness's own constants)."""
import os

import pytest
import torch

from autokernel.bench import job
from autokernel.harness import Reject
from autokernel.ops import get


def _tampered(guard) -> str:
    with pytest.raises(Reject) as e:
        guard("here")
    assert e.value.reason == "bench.tampered" and "(here)" in e.value.detail
    return e.value.detail


def test_the_bench_guard_sees_what_the_gate_sees(monkeypatch):
    guard = job._TamperCheck("rmsnorm", get("rmsnorm"))
    guard("clean")  # nothing changed: no rejection
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium" if old != "medium" else "high")
    try:
        assert "torch.float32_matmul_precision" in _tampered(guard)
    finally:
        torch.set_float32_matmul_precision(old)
    monkeypatch.setenv("AUTOKERNEL_TEST_TAMPER", "1")
    assert "AUTOKERNEL_TEST_TAMPER" in _tampered(guard)
    monkeypatch.delenv("AUTOKERNEL_TEST_TAMPER")
    monkeypatch.setattr(job, "KEEP", 0)  # fewer outputs kept for the parent to check
    assert "autokernel.bench.job.KEEP" in _tampered(guard)
    monkeypatch.undo()
    spec, reference = get("rmsnorm"), get("rmsnorm").reference
    object.__setattr__(spec, "reference", lambda **kw: None)  # the frozen spec, as a file in the job could
    try:
        assert "rmsnorm spec.reference" in _tampered(guard)
    finally:
        object.__setattr__(spec, "reference", reference)
    guard("restored")
    assert "AUTOKERNEL_TEST_TAMPER" not in os.environ
