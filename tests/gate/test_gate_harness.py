"""The trusted pieces on their own: the child's aten allowlist and poison, and the parent's judgement of outputs."""
import threading

import pytest
import torch

from autokernel.gate import child, judge, numeric
from autokernel.ops import get
from autokernel.ops.spec import upcast

POISON = numeric.poison_bits(0)


def run_guarded(fn):
    guard = child.Guard(POISON)
    try:
        with guard:
            out = fn()
    except child.Forbidden:
        return None, guard.violation
    return out, guard.violation


@pytest.mark.parametrize("fn", [
    lambda x: torch.empty_like(x), lambda x: torch.zeros(3), lambda x: torch.full((2,), 1.5),
    lambda x: x.reshape(-1).view(4, 4).t().contiguous(), lambda x: x[1:, :2].clone(),
    lambda x: x.unsqueeze(0).expand(2, 4, 4).permute(1, 0, 2), lambda x: torch.empty(4).copy_(x[0]),
    lambda x: x.new_empty(3).fill_(2.0), lambda x: x.split(2)[0].squeeze(),
])
def test_allocation_views_and_copies_are_allowed(fn):
    x = torch.randn(4, 4)
    _, violation = run_guarded(lambda: fn(x))
    assert violation is None


@pytest.mark.parametrize("fn", [
    lambda x: x * 2, lambda x: x + x, lambda x: x.sum(), lambda x: torch.exp(x), lambda x: x @ x,
    lambda x: x.softmax(-1), lambda x: float(x[0, 0]), lambda x: torch.ops.aten.mm(x, x), lambda x: x.half(),
    lambda x: torch.empty(4, dtype=torch.float16).copy_(x[0]), lambda x: torch.arange(3), lambda x: x > 0,
    lambda x: abs(x), lambda x: x[x > 0], lambda x: torch.empty(4).fill_(x[0, 0]), lambda x: torch.randn(2),
])
def test_compute_is_forbidden(fn):
    x = torch.randn(4, 4)
    out, violation = run_guarded(lambda: fn(x))
    assert out is None and violation and "aten." in violation


def test_fresh_allocations_hold_the_poison():
    out, _ = run_guarded(lambda: (torch.empty(8), torch.empty_like(torch.zeros(3, dtype=torch.float16)),
                                  torch.zeros(2)))
    a, h, z = out
    assert torch.all(a.view(torch.int32) == POISON["float32"])  # a quiet NaN: the sign bit is clear
    assert torch.isnan(h).all() and torch.equal(z, torch.zeros(2))


def test_snapshot_sees_flags_patches_and_threads():
    before = child.Snapshot(None)
    assert before.diff(child.Snapshot(None)) is None
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium" if old != "medium" else "high")
    try:
        assert before.diff(child.Snapshot(None))[0] == "runtime.global_state"
    finally:
        torch.set_float32_matmul_precision(old)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert before.diff(child.Snapshot(None))[0] == "runtime.thread"
    finally:
        stop.set()
        t.join()
    saved = torch.Tensor.__dict__.get("clone")
    torch.Tensor.clone = torch.Tensor.detach
    try:
        reason, detail = before.diff(child.Snapshot(None))
        assert reason == "runtime.global_state" and "torch.Tensor.clone" in detail
    finally:
        if saved is None:
            del torch.Tensor.clone
        else:
            torch.Tensor.clone = saved
    assert before.diff(child.Snapshot(None)) is None


def _judge(out, kw, spec):
    judge.judge_call([out], [spec.reference(**kw)], [spec.reference(**upcast(kw))], POISON, "test", {})


def test_overflow_to_inf_is_the_right_answer():
    """silu_mul in fp16 on wide inputs: products past 65504 are inf in any correct fp16 kernel."""
    spec = get("silu_mul")
    kw = spec.make_inputs({"M": 16, "N": 431}, torch.float16, "cpu", torch.Generator().manual_seed(1), "wide")
    ref = spec.reference(**upcast(kw))
    right = ref.to(torch.float16)
    assert torch.isinf(right).any()  # the case this test is about
    _judge(right, kw, spec)
    saturated = right.clone()
    saturated[torch.isinf(right)] = 0.0
    with pytest.raises(judge.Reject, match="not ±inf"):
        _judge(saturated, kw, spec)


def test_unwritten_elements_are_named():
    spec = get("rmsnorm")
    kw = spec.make_inputs({"M": 2, "N": 6}, torch.float32, "cpu", torch.Generator().manual_seed(1), "normal")
    out = spec.reference(**upcast(kw)).to(torch.float32)
    out.view(torch.int32)[1, 3:] = POISON["float32"]
    with pytest.raises(judge.Reject) as e:
        _judge(out, kw, spec)
    assert e.value.reason == "numeric.unwritten" and "3 of 12" in e.value.detail and "[1, 3]" in e.value.detail
