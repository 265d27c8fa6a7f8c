import pytest
import torch
from opcheck import check

from autokernel.ops import get
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import compare

SPEC = get("attention_decode")


@pytest.mark.parametrize("shape", SPEC.model_shapes + SPEC.odd_shapes, ids=str)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
def test_attention_decode_matches_reference(shape, dtype):
    check("attention_decode", shape, dtype)


@pytest.mark.parametrize("dist", ["wide", "near_constant", "sparse", "tiny"])
def test_attention_decode_value_distributions(dist):
    check("attention_decode", {"B": 2, "Hq": 9, "Hkv": 3, "S": 128, "L": 90, "D": 64}, torch.float32, dist)


def test_attention_decode_fully_padded_row_is_zero():
    """A sequence whose every cache position is padding gets exactly 0, not NaN."""
    from kernels.attention_decode import attention_decode
    kw = SPEC.make_inputs({"B": 2, "Hq": 9, "Hkv": 3, "S": 128, "L": 90, "D": 64}, torch.float16, "cpu",
                          torch.Generator().manual_seed(4))
    kw["kv_start"] = torch.tensor([70, 90], dtype=torch.int32)  # row 0 skips a whole key block
    out = attention_decode(**kw)
    assert torch.all(out[1] == 0) and torch.all(out[0].abs().sum(-1) > 0)
    c = compare(out, SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float16)
    assert c.ok, c.detail()


def _attend(kw, visible, kv_head=lambda h, group: h // group):
    """Decode attention as a kernel with the given mask visible(j, kv_start, kv_len) and head map would do it."""
    q, kc, vc = kw["q"], kw["k_cache"], kw["v_cache"]
    B, Hq, D = q.shape
    S = kc.shape[2]
    heads = torch.tensor([kv_head(h, Hq // kc.shape[1]) for h in range(Hq)])
    k, v = kc[:, heads], vc[:, heads]  # (B, Hq, S, D): the whole cache, the mask decides
    vis = visible(torch.arange(S)[None, :], kw["kv_start"].long()[:, None], kw["kv_len"]).expand(B, S)
    s = (q[:, :, None] @ k.transpose(-1, -2) * kw["scale"]).masked_fill(~vis[:, None, None], float("-inf"))
    p = torch.softmax(s, -1).masked_fill(~vis[:, None, None].any(-1, keepdim=True), 0.0)
    return (p @ v)[:, :, 0]


def _passes(visible, **how):
    kw = SPEC.make_inputs({"B": 3, "Hq": 9, "Hkv": 3, "S": 128, "L": 90, "D": 64}, torch.float32, "cpu",
                          torch.Generator().manual_seed(5))
    assert int(kw["kv_start"].max()) > 0  # some rows really are left-padded
    return compare(_attend(kw, visible, **how), SPEC.reference(**upcast(kw)), SPEC.reference(**kw), torch.float32).ok


def test_attention_decode_right_mask_passes():
    """The masked-attention helper below is itself right: only the planted bug makes the others fail."""
    assert _passes(lambda j, s, n: (s <= j) & (j < n))


def test_attention_decode_ignoring_kv_start_is_caught():
    assert not _passes(lambda j, s, n: j < n)


def test_attention_decode_kv_start_off_by_one_is_caught():
    assert not _passes(lambda j, s, n: (s < j) & (j < n))


def test_attention_decode_reading_one_past_kv_len_is_caught():
    assert not _passes(lambda j, s, n: (s <= j) & (j <= n))


def test_attention_decode_dropping_the_newest_key_is_caught():
    assert not _passes(lambda j, s, n: (s <= j) & (j < n - 1))


def test_attention_decode_wrong_gqa_head_mapping_is_caught():
    assert not _passes(lambda j, s, n: (s <= j) & (j < n), kv_head=lambda h, group: h % 3)
