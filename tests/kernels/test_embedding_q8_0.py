import pytest
import torch
from opcheck import check

from autokernel.ops import get
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import compare
from kernels.embedding_q8_0 import embedding_q8_0

SPEC = get("embedding_q8_0")


@pytest.mark.parametrize("shape", SPEC.model_shapes + SPEC.odd_shapes, ids=str)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
def test_embedding_q8_0_matches_reference(shape, dtype):
    check("embedding_q8_0", shape, dtype)


@pytest.mark.parametrize("dist", ["wide", "near_constant", "sparse", "tiny"])
def test_embedding_q8_0_value_distributions(dist):
    check("embedding_q8_0", {"B": 2, "T": 3, "V": 50, "D": 576}, torch.float32, dist)


def test_embedding_q8_0_is_exact_in_float32_for_int64_ids():
    """An fp16 scale times an int8 quant has at most 18 significant bits: float32 holds it exactly."""
    gen = torch.Generator().manual_seed(2)
    kw = SPEC.make_inputs({"B": 2, "T": 3, "V": 40, "D": 96}, torch.float32, "cpu", gen)
    kw["ids"] = kw["ids"].long()
    assert torch.equal(embedding_q8_0(**kw), SPEC.reference(**upcast(kw)).float())


def test_embedding_q8_0_wrong_block_scale_is_caught():
    """The check itself must be able to fail: pairing quants with the scale of the wrong 32-block (j // 16)."""
    gen = torch.Generator().manual_seed(1)
    kw = SPEC.make_inputs({"B": 2, "T": 4, "V": 64, "D": 576}, torch.float32, "cpu", gen)
    ids = kw["ids"].long()
    cols = torch.arange(576)
    wrong = kw["scales"][ids][..., (cols // 16) % (576 // 32)].float() * kw["qs"][ids].float()
    assert not compare(wrong, SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float32).ok


def test_embedding_q8_0_dequantizing_in_fp16_is_caught_for_float32_output():
    """fp16 products lose bits that a float32 output keeps; eager float32 is exact, so the gate must notice."""
    gen = torch.Generator().manual_seed(3)
    kw = SPEC.make_inputs({"B": 2, "T": 4, "V": 64, "D": 576}, torch.float32, "cpu", gen)
    ids = kw["ids"].long()
    wrong = (kw["scales"][ids].repeat_interleave(32, -1) * kw["qs"][ids].half()).float()
    assert not compare(wrong, SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float32).ok
