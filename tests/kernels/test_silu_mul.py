import pytest
import torch
from opcheck import check

from autokernel.ops import get
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import compare
from kernels.silu_mul import silu_mul

SPEC = get("silu_mul")
# exp(-gate) overflows to inf for gate < -88 by design (gate / inf = -0); numpy, under the interpreter, warns.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


@pytest.mark.parametrize("shape", SPEC.model_shapes + SPEC.odd_shapes, ids=str)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
def test_silu_mul_matches_reference(shape, dtype):
    check("silu_mul", shape, dtype)


@pytest.mark.parametrize("dist", ["wide", "near_constant", "sparse", "tiny"])
def test_silu_mul_value_distributions(dist):
    check("silu_mul", {"M": 5, "N": 1536}, torch.float32, dist)


def test_silu_mul_on_halves_of_a_fused_gate_up_and_extreme_gates():
    """Strided views (chunks of a fused (M, 2N) projection) and gates far past exp's range stay finite and right."""
    gu = torch.randn(3, 2 * 100, generator=torch.Generator().manual_seed(2)) * 40.0  # exp(-g) overflows for g < -88
    gu[0, :4] = torch.tensor([-1e4, -100.0, 100.0, 1e4])
    gate, up = gu.chunk(2, dim=-1)
    out = silu_mul(gate, up)
    ref = SPEC.reference(gate.double(), up.double())
    assert torch.isfinite(out).all() and compare(out, ref, SPEC.reference(gate, up), torch.float32).ok


def test_silu_mul_sigmoid_for_silu_is_caught():
    """The check itself must be able to fail: sigmoid(gate) * up (dropping silu's factor of gate) is a plausible bug."""
    gen = torch.Generator().manual_seed(1)
    kw = SPEC.make_inputs({"M": 4, "N": 1536}, torch.float32, "cpu", gen)
    wrong = torch.sigmoid(kw["gate"]) * kw["up"]
    assert not compare(wrong, SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float32).ok
