import pytest
import torch
from opcheck import check

from autokernel.ops import get

SPEC = get("rmsnorm")


@pytest.mark.parametrize("shape", SPEC.model_shapes + SPEC.odd_shapes, ids=str)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
def test_rmsnorm_matches_reference(shape, dtype):
    check("rmsnorm", shape, dtype)


@pytest.mark.parametrize("dist", ["wide", "near_constant", "sparse", "tiny"])
def test_rmsnorm_value_distributions(dist):
    check("rmsnorm", {"M": 5, "N": 576}, torch.float32, dist)


def test_rmsnorm_eps_in_wrong_place_is_caught():
    """The check itself must be able to fail: eps added outside the sqrt is a plausible bug."""
    gen = torch.Generator().manual_seed(1)
    kw = SPEC.make_inputs({"M": 4, "N": 576}, torch.float32, "cpu", gen, "tiny")
    from autokernel.ops.spec import upcast
    from autokernel.ops.tolerance import compare
    wrong = kw["x"] / (kw["x"].pow(2).mean(-1, keepdim=True).sqrt() + kw["eps"]) * kw["weight"]
    assert not compare(wrong, SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float32).ok
