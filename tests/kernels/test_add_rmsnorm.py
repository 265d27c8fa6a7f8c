import pytest
import torch
from opcheck import check

from autokernel.ops import get
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import compare
from kernels.add_rmsnorm import add_rmsnorm

SPEC = get("add_rmsnorm")


@pytest.mark.parametrize("shape", SPEC.model_shapes + SPEC.odd_shapes, ids=str)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
def test_add_rmsnorm_matches_reference(shape, dtype):
    check("add_rmsnorm", shape, dtype)


@pytest.mark.parametrize("dist", ["wide", "near_constant", "sparse", "tiny"])
def test_add_rmsnorm_value_distributions(dist):
    check("add_rmsnorm", {"M": 5, "N": 576}, torch.float32, dist)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_add_rmsnorm_h_is_eager_exact_and_shapes_kept(dtype):
    """h is one rounded add: it must equal eager bit for bit, on (B, T, N) inputs too. Not bfloat16 here: the
    Triton interpreter casts float32 -> bfloat16 by truncation (GPUs round to nearest), so h is 1 ulp off there."""
    gen = torch.Generator().manual_seed(2)
    x, r = torch.randn(2, 3, 576, generator=gen).to(dtype), torch.randn(2, 3, 576, generator=gen).to(dtype)
    w = torch.ones(576, dtype=dtype)
    y, h = add_rmsnorm(x, r, w, 1e-5)
    assert y.shape == h.shape == x.shape and torch.equal(h, r + x)


def test_add_rmsnorm_normalising_the_unsummed_input_is_caught():
    """The check itself must be able to fail: a kernel that stores h but normalises x alone is a plausible bug."""
    gen = torch.Generator().manual_seed(1)
    kw = SPEC.make_inputs({"M": 4, "N": 576}, torch.float32, "cpu", gen)
    x = kw["x"]
    wrong = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + kw["eps"]) * kw["weight"]
    y64, _ = SPEC.reference(**upcast(kw))
    assert not compare(wrong, y64, SPEC.reference(**kw)[0], torch.float32).ok
