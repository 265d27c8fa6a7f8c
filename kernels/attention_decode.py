# One new query per sequence against the KV cache, flash-decoding without the split: one program per (batch, kv
# head) carries that kv head's GROUP query heads as the rows of one tile (padded to BLOCK_H >= 16 for tl.dot), so
# each cache block is read once per group, and streams the visible key blocks with an online softmax. Fast while
# kv_len is a few hundred; at long contexts B * Hkv programs under-fill a GPU (split the keys then). Breaks for
# D > 256 or GROUP > 64 (asserted).
import torch
import triton
import triton.language as tl


@triton.jit
def attention_decode_kernel(
    # pointers
    q_ptr, k_ptr, v_ptr, kv_start_ptr, o_ptr,
    # sizes
    kv_len, GROUP, D, scale,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_ob, stride_oh, stride_od,
    # meta-parameters
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    hk = tl.program_id(1).to(tl.int64)
    start = tl.load(kv_start_ptr + b)  # first real (non-pad) cache position of sequence b
    rg = tl.arange(0, BLOCK_H).to(tl.int64)[:, None]  # (BLOCK_H, 1): query head hk * GROUP + rg, for rg < GROUP
    rd = tl.arange(0, BLOCK_D).to(tl.int64)[None, :]  # (1, BLOCK_D)
    rn = tl.arange(0, BLOCK_N).to(tl.int64)
    io_mask = (rg < GROUP) & (rd < D)
    head0 = hk * GROUP
    q = tl.load(q_ptr + (b * stride_qb + head0 * stride_qh) + (rg * stride_qh + rd * stride_qd), mask=io_mask,
                other=0.0)  # (BLOCK_H, BLOCK_D)
    # Head dims past D wrap onto valid ones in K and V: q is 0 there, and those output columns are never stored.
    rdw = rd % D
    k_base = k_ptr + (b * stride_kb + hk * stride_kh) + tl.trans(rdw) * stride_kd  # K.T tiles: (BLOCK_D, BLOCK_N)
    v_base = v_ptr + (b * stride_vb + hk * stride_vh) + rdw * stride_vd  # V tiles: (BLOCK_N, BLOCK_D)
    qk_scale = scale * 1.4426950408889634  # softmax in base 2: exp(x) = exp2(x * log2(e))

    # Running max starts finite so a row that has seen no visible key yet keeps exp2(m_old - m_new) = 1 and l = 0.
    m_i = tl.full((BLOCK_H,), -1.0e30, tl.float32)
    # The softmax denominators are row sums of p, taken with tl.dot against ones (every column holds its row's
    # sum) from the same p that multiplies v: the division at the end is then elementwise, and the sum one more
    # small matmul next to p @ v instead of a reduction.
    l_i = tl.full((BLOCK_H, BLOCK_D), 0.0, tl.float32)
    ones = tl.full((BLOCK_N, BLOCK_D), 1.0, v_ptr.dtype.element_ty)
    acc = tl.full((BLOCK_H, BLOCK_D), 0.0, tl.float32)
    for n0 in range((start // BLOCK_N) * BLOCK_N, kv_len, BLOCK_N):  # key blocks wholly in the padding skipped
        cols = n0 + rn  # cache positions
        pos = cols % kv_len  # never read past kv_len: wrapped columns are masked out below
        kt = tl.load(k_base + pos[None, :] * stride_ks)
        v = tl.load(v_base + pos[:, None] * stride_vs)
        s = tl.dot(q, kt, input_precision="ieee") * qk_scale  # (BLOCK_H, BLOCK_N), log2 units
        s = tl.where((pos == cols) & (cols >= start), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)[:, None]
        p = tl.exp2(s - m_new[:, None])  # 0 where not visible
        p = p.to(v.dtype)
        l_i = l_i * alpha + tl.dot(p, ones, input_precision="ieee")
        acc = acc * alpha + tl.dot(p, v, input_precision="ieee")
        m_i = m_new

    o = acc / tl.where(l_i > 0.0, l_i, 1.0)  # a sequence with no visible key gets exactly 0
    tl.store(o_ptr + (b * stride_ob + head0 * stride_oh) + (rg * stride_oh + rd * stride_od),
             o.to(o_ptr.dtype.element_ty), mask=io_mask)


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_start: torch.Tensor,
                     kv_len: int, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale over cache positions kv_start[b] <= j < kv_len) v for q (B, Hq, D) and caches
    (B, Hkv, S_max, D)."""
    B, HQ, D = q.shape
    HKV, S_MAX = k_cache.shape[1], k_cache.shape[2]
    assert k_cache.shape == v_cache.shape == (B, HKV, S_MAX, D), (q.shape, k_cache.shape, v_cache.shape)
    assert HQ % HKV == 0, f"attention_decode: {HQ} query heads do not share {HKV} kv heads evenly"
    assert 0 < kv_len <= S_MAX, f"attention_decode: kv_len {kv_len} outside the cache (S_max {S_MAX})"
    assert kv_start.shape == (B,) and kv_start.dtype == torch.int32, (kv_start.shape, kv_start.dtype)
    GROUP = HQ // HKV
    # powers of 2 of at least 16 (tl.dot's minimum), without a clamp: a branch no model shape takes is one the gate
    # cannot prove (autokernel/gate/coverage.py)
    BLOCK_H = 16 * triton.next_power_of_2(triton.cdiv(GROUP, 16))
    BLOCK_D = 16 * triton.next_power_of_2(triton.cdiv(D, 16))
    assert BLOCK_H <= 64 and BLOCK_D <= 256, f"attention_decode: group {GROUP} or head dim {D} too large"
    o = torch.empty((B, HQ, D), dtype=q.dtype, device=q.device)
    attention_decode_kernel[(B, HKV)](
        q, k_cache, v_cache, kv_start, o,
        kv_len, GROUP, D, scale,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *o.stride(),
        # Not yet tuned on a GPU. Under the interpreter cost follows the number of tl ops run: one 256-key block
        # covers this engine's contexts (prompt + new tokens), one CPU-time set (B = 1, 9 / 3 heads, D = 64):
        # 27 ms at kv_len = 200 vs 39 ms with BLOCK_N = 64; 15-17 ms at any BLOCK_N for kv_len = 60. Warps and
        # stages from ptxas -v for sm_80: bf16 68 KB shared, 0.5 KB spills (4 warps: 8 KB); fp32 152 KB (3 stages:
        # 283 KB, over any GPU's limit).
        BLOCK_H=BLOCK_H, BLOCK_N=256, BLOCK_D=BLOCK_D, num_warps=8, num_stages=2,
    )
    return o
