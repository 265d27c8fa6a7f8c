import pytest
import torch
from opcheck import check

from autokernel.ops import get
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import compare
from kernels.softmax import softmax

SPEC = get("softmax")


@pytest.mark.parametrize("shape", SPEC.model_shapes + SPEC.odd_shapes, ids=str)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
def test_softmax_matches_reference(shape, dtype):
    check("softmax", shape, dtype)


@pytest.mark.parametrize("dist", ["wide", "near_constant", "sparse", "tiny"])
def test_softmax_value_distributions(dist):
    check("softmax", {"M": 2, "V": 3001}, torch.float32, dist)


def test_softmax_peaked_rows_and_strided_rows():
    """A near one-hot row (the max in the last, partial chunk) and rows of a (B, T, V) view, as the engine slices."""
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 2500, generator=gen)
    logits[0, -1, 2499] = 60.0
    last = logits[:, -1, :]  # (B, V), row stride T * V
    out = softmax(last, 0.7)
    assert compare(out, SPEC.reference(last.double(), 0.7), SPEC.reference(last, 0.7), torch.float32).ok
    assert out[0, 2499] > 0.99 and torch.allclose(out.sum(-1), torch.ones(2))


def _large_logits():
    gen = torch.Generator().manual_seed(1)
    kw = SPEC.make_inputs({"M": 2, "V": 3001}, torch.float32, "cpu", gen, "wide")
    kw["logits"] = kw["logits"] * 10.0  # up to ~6e3 / temperature: exp overflows float32 without the max shift
    return kw


def test_softmax_on_large_logits():
    kw = _large_logits()
    out = softmax(**kw)
    assert compare(out, SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float32).ok


def test_softmax_without_max_subtraction_is_caught():
    """The check itself must be able to fail: exp(z) / sum(exp(z)) overflows to inf / inf = nan on large logits."""
    kw = _large_logits()
    z = kw["logits"] / kw["temperature"]
    wrong = torch.exp(z) / torch.exp(z).sum(-1, keepdim=True)
    assert not compare(wrong, SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float32).ok


def test_softmax_ignoring_temperature_is_caught():
    gen = torch.Generator().manual_seed(3)
    kw = {**SPEC.make_inputs({"M": 2, "V": 3001}, torch.float32, "cpu", gen), "temperature": 0.5}  # not the drawn
    wrong = torch.softmax(kw["logits"], -1)  # one: a draw of 1.0 would make this right
    assert not compare(wrong, SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float32).ok
