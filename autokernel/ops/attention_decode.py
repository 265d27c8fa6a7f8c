"""attention_decode: one new query per sequence against the KV cache, grouped-query heads, left-padded rows
(SmolLM2-135M: 9 query heads share 3 kv heads, head dim 64)."""
import torch

from autokernel.ops.attention import draw_padding, draw_scale, softmax_rounding
from autokernel.ops.smollm2 import HEAD_DIM, N_HEAD, N_HEAD_KV
from autokernel.ops.spec import OpSpec, Shape, elem_size, sample

STALE = 20.0  # what sits in the cache past kv_len: large, so a kernel that reads it is visibly wrong


def _visible_kv(q, k_cache, v_cache, kv_start, kv_len) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k and v (B, Hq, L, D), each query head's kv head's filled positions; visible (B, 1, 1, L)."""
    group = q.shape[1] // k_cache.shape[1]
    k = k_cache[:, :, :kv_len].repeat_interleave(group, dim=1)
    v = v_cache[:, :, :kv_len].repeat_interleave(group, dim=1)
    visible = torch.arange(kv_len, device=q.device)[None, :] >= kv_start.to(q.device)[:, None]  # (B, L)
    return k, v, visible[:, None, None, :]


def reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_start: torch.Tensor,
              kv_len: int, scale: float) -> torch.Tensor:
    k, v, visible = _visible_kv(q, k_cache, v_cache, kv_start, kv_len)
    s = (q[:, :, None, :] @ k.transpose(-1, -2)) * scale  # (B, Hq, 1, L)
    p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)
    p = p.masked_fill(~visible.any(-1, keepdim=True), 0.0)  # a sequence with no visible key: output 0, not NaN
    return (p @ v)[:, :, 0]


def rounding(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_start: torch.Tensor,
             kv_len: int, scale: float) -> torch.Tensor:
    return softmax_rounding(q[:, :, None, :], *_visible_kv(q, k_cache, v_cache, kv_start, kv_len), scale)[:, :, 0]


def make_inputs(shape: Shape, dtype, device, gen, dist="normal"):
    """Caches hold `dist` values up to kv_len and stale large ones after it; left padding as
    autokernel/ops/attention.py draw_padding makes it, one row wholly padded in one case in two."""
    B, Hq, Hkv, S, L, D = shape["B"], shape["Hq"], shape["Hkv"], shape["S"], shape["L"], shape["D"]
    assert 0 < L <= S, shape
    q = sample((B, Hq, D), dtype, device, gen, dist)
    caches = []
    for _ in range(2):
        c = sample((B, Hkv, S, D), dtype, device, gen, dist)
        c[:, :, L:] = sample((B, Hkv, S - L, D), dtype, device, gen) + STALE
        caches.append(c)
    kv_start = draw_padding(B, L, gen, wholly=True)  # a sequence all padding (output 0): drawn, so it is covered
    return {"q": q, "k_cache": caches[0], "v_cache": caches[1], "kv_start": kv_start.to(device), "kv_len": L,
            "scale": draw_scale(D, gen)}


def shape_of(q, k_cache, v_cache, kv_start, kv_len, scale) -> Shape:
    B, Hq, D = q.shape
    return {"B": B, "Hq": Hq, "Hkv": k_cache.shape[1], "S": k_cache.shape[2], "L": kv_len, "D": D}


SPEC = OpSpec(
    name="attention_decode",
    reference=reference,
    rounding=rounding,
    make_inputs=make_inputs,
    shape_of=shape_of,
    flops=lambda s: 4 * s["B"] * s["Hq"] * s["L"] * s["D"],
    bytes_moved=lambda s, dt: (2 * s["Hkv"] * s["L"] + 2 * s["Hq"]) * s["B"] * s["D"] * elem_size(dt),
    model_shapes=({"B": 1, "Hq": N_HEAD, "Hkv": N_HEAD_KV, "S": 256, "L": 200, "D": HEAD_DIM},
                  {"B": 4, "Hq": N_HEAD, "Hkv": N_HEAD_KV, "S": 256, "L": 77, "D": HEAD_DIM}),
    odd_shapes=({"B": 3, "Hq": 6, "Hkv": 2, "S": 300, "L": 257, "D": 48}, {"B": 2, "Hq": 4, "Hkv": 2, "S": 8, "L": 1,
                "D": 16}, {"B": 2, "Hq": 5, "Hkv": 5, "S": 100, "L": 100, "D": 64}),
    # The batch is swept past the traced shape's budget at a short context (cheap), so it reaches production's decode
    # batches (the grid is B x Hkv programs: a persistent grid that stops after a fixed number of (batch, head) pairs
    # was accepted while the batch stayed within that budget, 9); a secret context of 3-24 positions first (a kernel
    # reading two positions for batches past the heads count was exact at the two-position base), then 3, then 2 for
    # the largest batches; the context grows in the production range.
    extra={"sweep": ("B",), "cheap_base": [{"L": (3, 24), "S": "L"}, {"L": 3, "S": "L"}, {"L": 2, "S": 2}],
           "corner_base": {"Hq": 3, "Hkv": 1}},  # the batch x context corner on one head group (schedule.corner_shape)
    doc="Decode attention: q (B, Hq, D) is each sequence's newest query; k_cache and v_cache (B, Hkv, S_max, D) "
        "hold kv_len filled positions (a python int; positions from kv_len on are stale and must not be read); "
        "kv_start int32 (B,) marks left padding. Query head h reads kv head h // (Hq // Hkv); cache position j is "
        "visible iff kv_start[b] <= j < kv_len. out = softmax(q k^T * scale over visible keys) v, (B, Hq, D) in "
        "q's dtype. Accumulate in float32 with an online softmax over key blocks.",
)
