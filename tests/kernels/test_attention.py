import pytest
import torch
from opcheck import check

from autokernel.ops import get
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import compare

SPEC = get("attention")


@pytest.mark.parametrize("shape", SPEC.model_shapes + SPEC.odd_shapes, ids=str)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
def test_attention_matches_reference(shape, dtype):
    check("attention", shape, dtype)


@pytest.mark.parametrize("dist", ["wide", "near_constant", "sparse", "tiny"])
def test_attention_value_distributions(dist):
    check("attention", {"B": 2, "Hq": 6, "Hkv": 2, "T": 40, "D": 64}, torch.float32, dist)


def test_attention_pad_rows_are_exactly_zero():
    from kernels.attention import attention
    kw = SPEC.make_inputs({"B": 2, "Hq": 3, "Hkv": 1, "T": 100, "D": 64}, torch.float16, "cpu",
                          torch.Generator().manual_seed(4))
    kw["kv_start"] = torch.tensor([0, 70], dtype=torch.int32)  # 70 > BLOCK_N: a whole key block is padding
    out = attention(**kw)
    assert torch.all(out[1, :, :70] == 0)
    assert torch.all(out[1, :, 70:].abs().sum(-1) > 0) and torch.all(out[0].abs().sum(-1) > 0)


def _attend(kw, visible, kv_head=lambda h, group: h // group):
    """Attention as a kernel with the given mask visible(i, j, kv_start) and head mapping would compute it."""
    q, k, v = kw["q"], kw["k"], kw["v"]
    B, Hq, T, D = q.shape
    heads = torch.tensor([kv_head(h, Hq // k.shape[1]) for h in range(Hq)])
    k, v = k[:, heads], v[:, heads]
    pos = torch.arange(T)
    vis = visible(pos[:, None], pos[None, :], kw["kv_start"].long()[:, None, None])
    vis = vis.expand(B, T, T)[:, None]  # (B, 1, T, T)
    s = (q @ k.transpose(-1, -2) * kw["scale"]).masked_fill(~vis, float("-inf"))
    p = torch.softmax(s, -1).masked_fill(~vis.any(-1, keepdim=True), 0.0)
    return p @ v


def _passes(visible, **how):
    kw = SPEC.make_inputs({"B": 3, "Hq": 9, "Hkv": 3, "T": 40, "D": 64}, torch.float32, "cpu",
                          torch.Generator().manual_seed(5))
    assert int(kw["kv_start"].max()) > 0  # some rows really are left-padded
    return compare(_attend(kw, visible, **how), SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float32).ok


def test_attention_right_mask_passes():
    """The masked-attention helper below is itself right: only the planted bug makes the others fail."""
    assert _passes(lambda i, j, s: (s <= j) & (j <= i))


def test_attention_strict_causal_mask_is_caught():
    assert not _passes(lambda i, j, s: (s <= j) & (j < i))


def test_attention_ignoring_kv_start_is_caught():
    assert not _passes(lambda i, j, s: j <= i)


def test_attention_kv_start_off_by_one_is_caught():
    assert not _passes(lambda i, j, s: (s < j) & (j <= i))


def test_attention_wrong_gqa_head_mapping_is_caught():
    """Query head h reads kv head h // group, not h % Hkv (the interleaved mapping)."""
    assert not _passes(lambda i, j, s: (s <= j) & (j <= i), kv_head=lambda h, group: h % 3)
