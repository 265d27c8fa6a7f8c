import pytest
import torch
from opcheck import check

from autokernel.ops import get
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import compare
from kernels.embedding import embedding

SPEC = get("embedding")


@pytest.mark.parametrize("shape", SPEC.model_shapes + SPEC.odd_shapes, ids=str)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
def test_embedding_matches_reference(shape, dtype):
    check("embedding", shape, dtype)


@pytest.mark.parametrize("dist", ["wide", "near_constant", "sparse", "tiny"])
def test_embedding_value_distributions(dist):
    check("embedding", {"B": 2, "T": 3, "V": 50, "D": 576}, torch.float32, dist)


def test_embedding_is_an_exact_copy_for_int64_ids_of_any_rank():
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(97, 42, generator=gen, dtype=torch.bfloat16)
    for ids in (torch.randint(0, 97, (2, 3, 5), generator=gen), torch.tensor(96), torch.tensor([0, 96, 5])):
        out = embedding(ids, weight)
        assert out.shape == ids.shape + (42,) and torch.equal(out, weight[ids])


def test_embedding_off_by_one_row_is_caught():
    """The check itself must be able to fail: reading row id+1 (a 1-based table) is a plausible bug."""
    gen = torch.Generator().manual_seed(1)
    kw = SPEC.make_inputs({"B": 2, "T": 4, "V": 64, "D": 576}, torch.float32, "cpu", gen)
    wrong = kw["weight"][(kw["ids"].long() + 1) % 64]
    assert not compare(wrong, SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float32).ok
