"""One output comparison (autokernel.ops.tolerance.compare_outputs): the gate's numeric stage, the benchmark's
re-check of timed outputs and the kernel tests' opcheck reach the same verdict on every crafted output, so the
benchmark can never pass what the gate rejects, nor reject what the gate passed."""
import opcheck
import pytest
import torch

from autokernel import harness
from autokernel.bench import rounds
from autokernel.gate import judge, numeric
from autokernel.ops import get
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import References

POISON = numeric.poison_bits(5)


def _gate(outs, ref64, eager) -> str | None:
    try:
        judge.judge_call(outs, References(ref64, eager, [None] * len(ref64)), POISON, "test", {})
    except judge.Reject as r:
        return r.reason
    return None


def _bench(outs, ref64, eager) -> str | None:
    rnd = rounds.Round(None, [{"shape": {}, "dtype": "float32"}], seed=0, reps=1)
    rnd._refs[(0, 0)] = References(ref64, eager, [None] * len(ref64))  # what the parent computed from its own seed
    why = rounds._check_outputs(rnd, 0, [{"case": 0, "rep": 0, "outputs": outs}])
    return why or None


def _opcheck(outs, ref64, eager) -> str | None:
    return opcheck.verdict(outs, References(ref64, eager, [None] * len(ref64)))


def _case(op: str, shape: dict, dtype: torch.dtype, dist: str, seed: int = 1):
    spec = get(op)
    kw = spec.make_inputs(shape, dtype, "cpu", torch.Generator().manual_seed(seed), dist)
    if op == "rmsnorm":  # (M, N) rows, as the crafted outputs below index them (make_inputs may draw (1, M, N))
        kw["x"] = kw["x"].reshape(shape["M"], shape["N"])
    return spec.reference(**upcast(kw)), spec.reference(**{k: v.clone() if isinstance(v, torch.Tensor) else v
                                                           for k, v in kw.items()})


def _ulps(ref64: torch.Tensor, dtype: torch.dtype, k: float) -> torch.Tensor:
    """The truth moved by k units in the last place of the output's scale, everywhere."""
    return (ref64 + k * torch.finfo(dtype).eps * ref64.abs().max()).to(dtype)


def _poisoned(right: torch.Tensor) -> torch.Tensor:
    """Row 0 never written past its first element: it still holds the allocation poison (gate/child.py's AtenWatch)."""
    out = right.clone()
    harness.fill_poison(out[0, 1:], POISON)
    return out


def _crafted():
    """(name, outputs, ref64, eager, the gate's reason or None for a pass)."""
    r32, e32 = _case("rmsnorm", {"M": 3, "N": 64}, torch.float32, "normal")
    right = r32.to(torch.float32)
    inf_at = right.clone()
    inf_at[1, 5] = float("inf")
    nan_at = right.clone()
    nan_at[2, 0] = float("nan")
    yield "right", [right], r32, e32, None
    yield "off by 1 ulp of scale", [_ulps(r32, torch.float32, 1)], r32, e32, None
    yield "off by 64 ulps of scale", [_ulps(r32, torch.float32, 64)], r32, e32, "numeric.mismatch"
    yield "inf where the reference is finite", [inf_at], r32, e32, "numeric.nonfinite"
    yield "NaN where the reference is finite", [nan_at], r32, e32, "numeric.nonfinite"
    yield "poison left in place", [_poisoned(right)], r32, e32, "numeric.unwritten"
    yield "not contiguous", [right.t().contiguous().t()], r32, e32, "numeric.bad_output"
    yield "wrong dtype", [r32], r32, e32, "numeric.bad_output"
    yield "two outputs for one", [right, right], r32, e32, "numeric.bad_output"
    # fp16 silu_mul on wide inputs: products past 65504 are inf in any correct kernel, not finite
    r16, e16 = _case("silu_mul", {"M": 16, "N": 431}, torch.float16, "wide")
    overflow = r16.to(torch.float16)
    assert torch.isinf(overflow).any()  # the case this is about
    saturated = overflow.clone()
    saturated[torch.isinf(overflow)] = 0.0
    yield "overflow to inf", [overflow], r16, e16, None
    yield "overflow saturated to 0", [saturated], r16, e16, "numeric.mismatch"
    # fp16 rmsnorm on wide rows: eager's x.pow(2) overflows, so 2x its error would pass anything
    rb, eb = _case("rmsnorm", {"M": 8, "N": 576}, torch.float16, "wide", seed=0)
    yield "broken eager, right", [rb.to(torch.float16)], rb, eb, None
    yield "broken eager, 1% off", [(rb * 1.01).to(torch.float16)], rb, eb, "numeric.mismatch"


@pytest.mark.parametrize("name, outs, ref64, eager, want", list(_crafted()), ids=lambda x: x if type(x) is str else "")
def test_gate_bench_and_opcheck_agree(name, outs, ref64, eager, want):
    ref64, eager = [ref64], [eager]  # one output's references, as every caller holds them
    gate, bench, kernel_test = _gate(outs, ref64, eager), _bench(outs, ref64, eager), _opcheck(outs, ref64, eager)
    assert gate == want, (name, gate)
    assert (bench is None) == (want is None), (name, bench)
    assert (kernel_test is None) == (want is None), (name, kernel_test)
    if want not in (None, "numeric.unwritten"):  # the bench and the tests poison nothing: NaN is what they see there
        assert kernel_test.startswith(want), (name, kernel_test)
