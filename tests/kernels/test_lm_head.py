import pytest
import torch
from opcheck import check, verdict

from autokernel.ops import get
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import compare, references

SPEC = get("lm_head")


@pytest.mark.parametrize("shape", SPEC.model_shapes + SPEC.odd_shapes, ids=str)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
def test_lm_head_matches_reference(shape, dtype):
    out, = check("lm_head", shape, dtype)
    assert out.dtype == torch.float32


@pytest.mark.parametrize("dist", ["wide", "near_constant", "sparse", "tiny"])
def test_lm_head_value_distributions(dist):
    check("lm_head", {"M": 3, "V": 1823, "K": 576}, torch.float16, dist)


def test_lm_head_fp32_weight_with_half_activations():
    """A float32 weight against fp16 activations is multiplied in fp32, not rounded to fp16 first."""
    from kernels.lm_head import lm_head
    gen = torch.Generator().manual_seed(3)
    kw = {"x": torch.randn(2, 576, generator=gen).half(), "weight": torch.randn(300, 576, generator=gen) / 24}
    # judged as the gate judges (opcheck.verdict: with the float32 rounding floor): the bare rule holds a float32 dot
    # product to this machine's eager BLAS's summation order, which another CPU's need not share
    why = verdict([lm_head(**kw)], references(SPEC, kw))
    assert why is None, why


def test_lm_head_logits_rounded_to_half_are_caught():
    """Logits computed in the activations' fp16 and only then widened (docs/shortcuts.md #13) must fail."""
    kw = SPEC.make_inputs({"M": 4, "V": 1823, "K": 576}, torch.float16, "cpu", torch.Generator().manual_seed(1))
    wrong = (kw["x"] @ kw["weight"].T).float()
    assert not compare(wrong, SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float32).ok
