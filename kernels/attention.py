# Causal prefill attention with GQA and left padding, flash-attention style: one program per (query block, batch,
# query head) streams the visible key blocks once with an online softmax, never materialising the (T, T) scores.
# Fast for the model's prompts (T <= a few hundred, D = 64); long T works but B * Hq * T / BLOCK_M programs is the
# only parallelism. Breaks for D > 256 (asserted: q, k, v tiles must fit registers).
import torch
import triton
import triton.language as tl


@triton.jit
def attention_kernel(
    # pointers
    q_ptr, k_ptr, v_ptr, kv_start_ptr, o_ptr,
    # sizes
    T, HQ, GROUP, D, scale,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_ob, stride_oh, stride_ot, stride_od,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // HQ
    h = pid_bh % HQ
    hk = h // GROUP  # the kv head this query head shares
    start = tl.load(kv_start_ptr + b)  # first real (non-pad) position of sequence b
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query positions
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    d_ok = rd < D

    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + rm[:, None] * stride_qt + rd[None, :] * stride_qd,
                mask=(rm[:, None] < T) & d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
    if q.dtype == tl.bfloat16:
        # The interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584): bf16 tiles go
        # through fp32, which is exact, so this costs speed on a GPU, never accuracy.
        q = q.to(tl.float32)
    k_base = k_ptr + b * stride_kb + hk * stride_kh + rd[:, None] * stride_kd  # K.T tiles: (BLOCK_D, BLOCK_N)
    v_base = v_ptr + b * stride_vb + hk * stride_vh + rd[None, :] * stride_vd  # V tiles: (BLOCK_N, BLOCK_D)
    qk_scale = scale * 1.4426950408889634  # softmax in base 2: exp(x) = exp2(x * log2(e))

    # Running max starts finite so a row that has seen no visible key yet keeps exp2(m_old - m_new) = 1 and l = 0.
    m_i = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    lo = (start // BLOCK_N) * BLOCK_N  # key blocks wholly inside the left padding are skipped
    hi = tl.minimum((pid_m + 1) * BLOCK_M, T)  # causal: no key after this block's last query
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + rn  # key positions
        kt = tl.load(k_base + cols[None, :] * stride_kt, mask=d_ok[:, None] & (cols[None, :] < T), other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vt, mask=(cols[:, None] < T) & d_ok[None, :], other=0.0)
        if kt.dtype == tl.bfloat16:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, kt, input_precision="ieee") * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        visible = (cols[None, :] >= start) & (cols[None, :] <= rm[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])  # 0 where not visible
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new

    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # rows with no visible key (left padding) stay exactly 0
    tl.store(o_ptr + b * stride_ob + h * stride_oh + rm[:, None] * stride_ot + rd[None, :] * stride_od,
             o.to(o_ptr.dtype.element_ty), mask=(rm[:, None] < T) & d_ok[None, :])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_start: torch.Tensor,
              scale: float) -> torch.Tensor:
    """softmax(q k^T * scale, causal and kv_start[b] <= j) v for q (B, Hq, T, D), k and v (B, Hkv, T, D)."""
    B, HQ, T, D = q.shape
    HKV = k.shape[1]
    assert k.shape == v.shape == (B, HKV, T, D), (q.shape, k.shape, v.shape)
    assert HQ % HKV == 0, f"attention: {HQ} query heads do not share {HKV} kv heads evenly"
    assert kv_start.shape == (B,) and kv_start.dtype == torch.int32, (kv_start.shape, kv_start.dtype)
    BLOCK_D = max(16, triton.next_power_of_2(D))
    assert BLOCK_D <= 256, f"attention: head dim {D} too large"
    o = torch.empty((B, HQ, T, D), dtype=q.dtype, device=q.device)
    grid = lambda meta: (triton.cdiv(T, meta["BLOCK_M"]), B * HQ)
    attention_kernel[grid](
        q, k, v, kv_start, o,
        T, HQ, HQ // HKV, D, scale,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        BLOCK_M=32, BLOCK_N=32, BLOCK_D=BLOCK_D, num_warps=4,
    )
    return o
