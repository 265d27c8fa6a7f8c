"""The trusted pieces on their own: the child's aten allowlist and poison, and the parent's judgement of outputs."""
import threading

import pytest
import torch

from autokernel import harness
from autokernel.gate import child, judge, numeric
from autokernel.ops import get
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import references
from autokernel.policy import Policy

POISON = numeric.poison_bits(0)


def run_guarded(fn):
    watch = child.AtenWatch(POISON)
    try:
        with watch:
            out = fn()
    except child.Forbidden:
        return None, watch.violation
    return out, watch.violation


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


def _diff(before: harness.Snapshot):
    d = before.diff(before.again())
    return (d.reason, d.detail) if d else None


def test_snapshot_sees_flags_patches_and_threads():
    before = harness.Snapshot()
    assert _diff(before) is None
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium" if old != "medium" else "high")
    try:
        assert _diff(before)[0] == "runtime.global_state"
    finally:
        torch.set_float32_matmul_precision(old)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert _diff(before)[0] == "runtime.thread" and before.new_threads() == [t]
    finally:
        stop.set()
        t.join()
    saved = torch.Tensor.__dict__.get("clone")
    torch.Tensor.clone = torch.Tensor.detach
    try:
        reason, detail = _diff(before)
        assert reason == "runtime.global_state" and "torch.Tensor.clone" in detail
    finally:
        if saved is None:
            del torch.Tensor.clone
        else:
            torch.Tensor.clone = saved
    assert _diff(before) is None


def test_snapshot_sees_deletions_shadowing_and_the_harness_own_scalars():
    """Held by object, not id(): a deleted library function, an attribute added to a class (shadowing a base's
    method), a harness constant changed (strict namespaces compare scalars too)."""
    before = harness.Snapshot(strict=("autokernel.gate.child",))
    saved = torch.nn.functional.relu
    del torch.nn.functional.relu
    try:
        assert "torch.nn.functional.relu" in _diff(before)[1]
    finally:
        torch.nn.functional.relu = saved
    torch.UntypedStorage.extra = lambda self: 0
    try:
        assert "torch.UntypedStorage.extra" in _diff(before)[1]
    finally:
        del torch.UntypedStorage.extra
    keep = child.KEEP_OUTPUTS
    child.KEEP_OUTPUTS = 0
    try:
        assert "autokernel.gate.child.KEEP_OUTPUTS" in _diff(before)[1]
    finally:
        child.KEEP_OUTPUTS = keep
    assert _diff(before) is None


def _judge(out, kw, spec):
    judge.judge_call([out], references(spec, kw), POISON, "test", {})


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
    kw["x"] = kw["x"].reshape(2, 6)  # (M, N): the rows this test names (make_inputs may draw (1, M, N))
    out = spec.reference(**upcast(kw)).to(torch.float32)
    out.view(torch.int32)[1, 3:] = POISON["float32"]
    with pytest.raises(judge.Reject) as e:
        _judge(out, kw, spec)
    assert e.value.reason == "numeric.unwritten" and "3 of 12" in e.value.detail and "[1, 3]" in e.value.detail


# --- program order: the interpreter runs a grid's programs in the order a call asks for ------------------------------

def test_program_order_reorders_the_interpreters_grid():
    """A kernel that logs the order its programs run in (an atomic ticket): asc, desc and a seeded shuffle."""
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder

    @triton.jit
    def log_order(ticket_ptr, log_ptr):
        tl.store(log_ptr + tl.atomic_add(ticket_ptr, 1), tl.program_id(0) * 10 + tl.program_id(1))

    saved = {m: InterpreterBuilder.__dict__[m] for m in ("set_grid_dim", "set_grid_idx")}
    order = child.ProgramOrder()
    order.install()
    try:
        def run(mode, seed=0):
            order.set(mode, seed)
            ticket, log = torch.zeros(1, dtype=torch.int32), torch.empty(12, dtype=torch.int32)
            log_order[(3, 4)](ticket, log)
            return log.tolist()
        every = sorted(10 * x + y for x in range(3) for y in range(4))
        assert run("asc") == every and run("desc") == every[::-1]
        shuffled = [run("shuffle", s) for s in (1, 2)]
        assert all(sorted(s) == every for s in shuffled) and shuffled[0] != shuffled[1] != every
        assert run("shuffle", 1) == shuffled[0]  # seeded: a verdict reproduces
    finally:
        for m, f in saved.items():
            setattr(InterpreterBuilder, m, f)


# --- parent-side judgement: nothing the child says is taken as truth ------------------------------------------------

def _record(cid="k0000", launches=1, ops=None, outputs=(torch.zeros(2),)):
    import io
    buf = io.BytesIO()
    torch.save(list(outputs), buf)
    return {"id": cid, "launches": launches, "ops": ops or {"empty": 1}, "outputs": buf.getvalue(), "seconds": 0.1}


@pytest.mark.parametrize("data", [
    {}, {"calls": "all fine"}, {"calls": [_record("k9999")]}, {"calls": [_record(), _record()]},
    {"calls": [{**_record(), "launches": "1"}]}, {"calls": [{**_record(), "ops": {"mm": "0"}}]},
])
def test_records_the_gate_did_not_ask_for_are_rejected(data):
    with pytest.raises(judge.Reject) as e:
        judge.records(data, [{"id": "k0000"}])
    assert e.value.reason == "runtime.incomplete"


def test_each_call_needs_a_launch_and_allowlisted_ops_only():
    judge.check_runtime(_record(), "here", child.ALLOWED_OPS)
    with pytest.raises(judge.Reject, match="launched none"):
        judge.check_runtime(_record(launches=0), "here", child.ALLOWED_OPS)
    with pytest.raises(judge.Reject) as e:
        judge.check_runtime(_record(ops={"empty": 1, "mul": 1}), "here", child.ALLOWED_OPS)
    assert e.value.reason == "runtime.torch_compute" and "aten.mul" in e.value.detail


def test_layout_is_the_references():
    spec = get("rmsnorm")
    kw = spec.make_inputs({"M": 4, "N": 6}, torch.float32, "cpu", torch.Generator().manual_seed(1), "normal")
    kw["x"] = kw["x"].reshape(4, 6)  # 2-D, so that the transposed layout below is one
    right = spec.reference(**upcast(kw)).to(torch.float32)
    for wrong in (right.t().contiguous().t(), right[:3], right.to(torch.float64), right.reshape(24)):
        with pytest.raises(judge.Reject) as e:
            _judge(wrong, kw, spec)
        assert e.value.reason == "numeric.bad_output"


class _Forged:
    """A sandbox result as a candidate that took over the harness would send it: ok, and whatever data it likes."""

    def __init__(self, data):
        self.ok, self.reason, self.detail, self.wall_s, self.isolation, self.data = True, None, "", 0.1, "test", data


@pytest.mark.parametrize("data, reason", [
    ({"failure": None, "calls": [], "ops": {}}, "runtime.incomplete"),  # "nothing failed", and nothing ran
    ({"failure": {"reason": "numeric.passed", "detail": "all good"}, "calls": []}, "runtime.incomplete"),
    ({"failure": None, "calls": "everything"}, "runtime.incomplete"),
])
def test_a_forged_clean_frame_is_not_a_pass(tmp_path, data, reason):
    spec = get("rmsnorm")
    (tmp_path / "rmsnorm.py").write_text("")
    planned = numeric.plan(spec, [{"M": 1, "N": 6}], [torch.float32], ["normal"])
    runtime, num = numeric.run(spec, tmp_path / "rmsnorm.py", tmp_path, Policy().sandbox, 3, planned,
                               sandbox_run=lambda *a, **k: _Forged(data))
    assert not runtime.passed and runtime.reason == reason and num is None


def test_a_stale_output_is_caching_and_a_wrong_one_is_mismatch():
    """The parent names a refill's wrong answer a cache only when it is the answer for the inputs' earlier values."""
    spec = get("rmsnorm")
    case = numeric.make_case(spec, 0, ({"M": 3, "N": 8}, torch.float32, "normal", 3), seed=11)
    calls = [{"id": f"k{i}", "mode": m, "values": v, "order": "asc"} for i, (m, v) in enumerate(case.steps)]
    right = {v: spec.reference(**upcast(getattr(case, v))).to(torch.float32) for v in "abt"}
    outs = {c["id"]: [right[c["values"]]] for c in calls}
    judge.judge_case(spec, case, calls, outs, POISON, {}, bitwise=True)
    refill_b = next(c["id"] for c in calls if c["values"] == "b")
    with pytest.raises(judge.Reject) as e:
        judge.judge_case(spec, case, calls, {**outs, refill_b: [right["a"]]}, POISON, {}, bitwise=True)
    assert e.value.reason == "numeric.caching"
    with pytest.raises(judge.Reject) as e:
        judge.judge_case(spec, case, calls, {**outs, refill_b: [right["b"] * 1.01]}, POISON, {}, bitwise=True)
    assert e.value.reason == "numeric.mismatch"
    copy = next(c["id"] for c in calls if c["mode"] == "copy")
    off_by_one_ulp = [torch.nextafter(right["a"], torch.full_like(right["a"], 1e9))]
    with pytest.raises(judge.Reject) as e:
        judge.judge_case(spec, case, calls, {**outs, copy: off_by_one_ulp}, POISON, {}, bitwise=True)
    assert e.value.reason == "numeric.nondeterministic"
    judge.judge_case(spec, case, calls, {**outs, copy: off_by_one_ulp}, POISON, {}, bitwise=False)  # policy: allowed
