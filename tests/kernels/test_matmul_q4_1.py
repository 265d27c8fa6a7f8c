import pytest
import torch
from opcheck import check

from autokernel.ops import get
from autokernel.ops.matmul_q4_1 import dequantize
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import compare

SPEC = get("matmul_q4_1")


@pytest.mark.parametrize("shape", SPEC.model_shapes + SPEC.odd_shapes, ids=str)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
def test_matmul_q4_1_matches_reference(shape, dtype):
    check("matmul_q4_1", shape, dtype)


@pytest.mark.parametrize("dist", ["wide", "near_constant", "sparse", "tiny"])
def test_matmul_q4_1_value_distributions(dist):
    check("matmul_q4_1", {"M": 5, "N": 192, "K": 576}, torch.float32, dist)


def test_dequantize_follows_the_gguf_layout():
    """Block b, weight j of row n is nibble j // 16 of byte b * 16 + j % 16, times d plus m (ggml's Q4_1)."""
    qs = torch.tensor([[0x21, 0x43] + [0] * 14 + [0xF0] + [0] * 15], dtype=torch.uint8)  # one row, K = 64
    d = torch.tensor([[0.5, 2.0]], dtype=torch.float64)
    m = torch.tensor([[-1.0, 3.0]], dtype=torch.float64)
    w = dequantize(qs, d, m)
    assert w.shape == (1, 64)
    assert w[0, :2].tolist() == [0.5 * 1 - 1, 0.5 * 3 - 1]  # low nibbles of bytes 0, 1
    assert w[0, 16:18].tolist() == [0.5 * 2 - 1, 0.5 * 4 - 1]  # high nibbles of bytes 0, 1
    assert w[0, 32].item() == 3.0 and w[0, 48].item() == 2.0 * 15 + 3  # block 1: byte 16 = 0xF0


def _wrong_vs_check(wrong_w):
    """Does a kernel that dequantizes with `wrong_w(qs, d, m)` (N, K) fail the check?"""
    kw = SPEC.make_inputs({"M": 4, "N": 192, "K": 576}, torch.float32, "cpu", torch.Generator().manual_seed(1))
    wrong = kw["x"] @ wrong_w(kw["qs"], kw["d"].float(), kw["m"].float()).T
    return compare(wrong, SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float32).ok


def test_matmul_q4_1_interleaved_nibbles_are_caught():
    """Q4_0/Q4_1 confusion: reading weight 2i, 2i + 1 from byte i's low, high nibble must fail."""
    def interleaved(qs, d, m):
        codes = torch.stack([qs & 0xF, qs >> 4], dim=-1).reshape(qs.shape[0], -1, 32)
        return (d[..., None] * codes + m[..., None]).reshape(qs.shape[0], -1)
    assert not _wrong_vs_check(interleaved)


def test_matmul_q4_1_dropped_min_is_caught():
    """Treating Q4_1 as Q4_0-style scale-only (W = d * (code - 8)) must fail."""
    assert not _wrong_vs_check(lambda qs, d, m: dequantize(qs, d, torch.zeros_like(m)) - 8 * d.repeat_interleave(32, 1))
