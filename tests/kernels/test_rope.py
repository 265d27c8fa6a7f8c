import pytest
import torch
from opcheck import check

from autokernel.ops import get
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import compare
from kernels.rope import rope

SPEC = get("rope")


@pytest.mark.parametrize("shape", SPEC.model_shapes + SPEC.odd_shapes, ids=str)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
def test_rope_matches_reference(shape, dtype):
    check("rope", shape, dtype)


@pytest.mark.parametrize("dist", ["wide", "near_constant", "sparse", "tiny"])
def test_rope_value_distributions(dist):
    check("rope", {"B": 2, "T": 5, "H": 9, "D": 64}, torch.float32, dist)


def test_rope_reads_any_layout_and_returns_contiguous():
    """(B, H, T, D) storage transposed to (B, T, H, D), and plain contiguous x, give the same bits as a copy."""
    gen = torch.Generator().manual_seed(2)
    pos = torch.randint(0, 500, (2, 7), generator=gen, dtype=torch.int32)
    x = torch.randn(2, 3, 7, 64, generator=gen).transpose(1, 2)  # (B, T, H, D) view
    out = rope(x, pos, 100000.0)
    assert out.is_contiguous() and torch.equal(out, rope(x.contiguous(), pos, 100000.0))


def test_rope_position_zero_is_identity():
    x = torch.randn(1, 4, 3, 64, generator=torch.Generator().manual_seed(3))
    assert torch.equal(rope(x, torch.zeros(1, 4, dtype=torch.int32), 100000.0), x)


def _wrong_check(wrong, kw):
    return compare(wrong, SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float32).ok


def test_rope_neox_halves_layout_is_caught():
    """The check itself must be able to fail: rotating (x[i], x[i + D/2]) (NeoX/HF layout) instead of adjacent pairs."""
    gen = torch.Generator().manual_seed(1)
    kw = SPEC.make_inputs({"B": 2, "T": 6, "H": 3, "D": 64}, torch.float32, "cpu", gen)
    x, D = kw["x"], 64
    inv_freq = kw["theta"] ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
    angle = kw["positions"].float()[:, :, None, None] * inv_freq
    x0, x1 = x[..., :D // 2], x[..., D // 2:]
    wrong = torch.cat((x0 * angle.cos() - x1 * angle.sin(), x0 * angle.sin() + x1 * angle.cos()), dim=-1)
    assert not _wrong_check(wrong, kw)


def test_rope_one_position_for_the_whole_batch_is_caught():
    """Left-padded rows have their own positions; using row 0's for every row is a plausible bug."""
    gen = torch.Generator().manual_seed(4)
    kw = SPEC.make_inputs({"B": 3, "T": 4, "H": 3, "D": 64}, torch.float32, "cpu", gen)
    wrong = SPEC.reference(kw["x"], kw["positions"][:1].expand(3, 4), kw["theta"])
    assert not _wrong_check(wrong, kw)


def test_rope_angles_stay_exact_at_long_context_positions():
    """Angles reduced in float64: at positions ~1e5 a float32 pos * inv_freq would be off by ~1e-2 rad."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 8, 3, 64, generator=gen)
    pos = torch.randint(90_000, 110_000, (1, 8), generator=gen, dtype=torch.int32)
    err = (rope(x, pos, 100000.0).double() - SPEC.reference(x.double(), pos, 100000.0)).abs().max()
    assert err < 1e-6 * x.abs().max()
