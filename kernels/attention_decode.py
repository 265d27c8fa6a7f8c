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
    b = tl.program_id(0)
    hk = tl.program_id(1)
    start = tl.load(kv_start_ptr + b)  # first real (non-pad) cache position of sequence b
    rg = tl.arange(0, BLOCK_H)  # query head hk * GROUP + rg, for rg < GROUP
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    d_ok = rd < D
    h_ok = rg < GROUP
    heads = hk * GROUP + rg

    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + rd[None, :] * stride_qd,
                mask=h_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_H, BLOCK_D)
    if q.dtype == tl.bfloat16:
        # The interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584): bf16 tiles go
        # through fp32, which is exact, so this costs speed on a GPU, never accuracy.
        q = q.to(tl.float32)
    k_base = k_ptr + b * stride_kb + hk * stride_kh + rd[:, None] * stride_kd  # K.T tiles: (BLOCK_D, BLOCK_N)
    v_base = v_ptr + b * stride_vb + hk * stride_vh + rd[None, :] * stride_vd  # V tiles: (BLOCK_N, BLOCK_D)
    qk_scale = scale * 1.4426950408889634  # softmax in base 2: exp(x) = exp2(x * log2(e))

    # Running max starts finite so a row that has seen no visible key yet keeps exp2(m_old - m_new) = 1 and l = 0.
    m_i = tl.full((BLOCK_H,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
    lo = (start // BLOCK_N) * BLOCK_N  # key blocks wholly inside the left padding are skipped
    for n0 in range(lo, kv_len, BLOCK_N):
        cols = n0 + rn  # cache positions
        in_cache = cols < kv_len  # never read the unfilled tail of the cache
        kt = tl.load(k_base + cols[None, :] * stride_ks, mask=d_ok[:, None] & in_cache[None, :], other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vs, mask=in_cache[:, None] & d_ok[None, :], other=0.0)
        if kt.dtype == tl.bfloat16:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, kt, input_precision="ieee") * qk_scale  # (BLOCK_H, BLOCK_N), log2 units
        visible = in_cache & (cols >= start)
        s = tl.where(visible[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])  # 0 where not visible
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new

    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # a sequence with no visible key gets exactly 0
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + rd[None, :] * stride_od,
             o.to(o_ptr.dtype.element_ty), mask=h_ok[:, None] & d_ok[None, :])


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
    BLOCK_H = max(16, triton.next_power_of_2(GROUP))  # tl.dot needs >= 16 rows
    BLOCK_D = max(16, triton.next_power_of_2(D))
    assert BLOCK_H <= 64 and BLOCK_D <= 256, f"attention_decode: group {GROUP} or head dim {D} too large"
    o = torch.empty((B, HQ, D), dtype=q.dtype, device=q.device)
    attention_decode_kernel[(B, HKV)](
        q, k_cache, v_cache, kv_start, o,
        kv_len, GROUP, D, scale,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *o.stride(),
        BLOCK_H=BLOCK_H, BLOCK_N=64, BLOCK_D=BLOCK_D, num_warps=4,  # not yet tuned on a GPU
    )
    return o
