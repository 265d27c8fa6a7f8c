# Causal prefill attention with GQA and left padding, flash-attention style: one program per (query block, batch,
# kv head) carries the kv head's GROUP query heads as row groups of one tile (BLOCK_G x BLOCK_M rows), so each key
# block is read once per group, and streams the visible key blocks with an online softmax, never materialising the
# (T, T) scores. Fast for the model's prompts (T <= a few hundred, D = 64); long T works but B * Hkv * T / BLOCK_M
# programs is the only parallelism. Breaks for D > 256 or GROUP > 16 (asserted: q, k, v tiles must fit registers).
import torch
import triton
import triton.language as tl


@triton.jit
def attention_kernel(
    # pointers
    q_ptr, k_ptr, v_ptr, kv_start_ptr, o_ptr,
    # sizes
    T, HKV, GROUP, D, scale,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_ob, stride_oh, stride_ot, stride_od,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr,
):
    pid_m = tl.program_id(0).to(tl.int64)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // HKV
    hk = pid_bh % HKV
    start = tl.load(kv_start_ptr + b)  # first real (non-pad) position of sequence b
    # Tile row r is query head hk * GROUP + r // BLOCK_M at position pid_m * BLOCK_M + r % BLOCK_M.
    r = tl.arange(0, BLOCK_G * BLOCK_M).to(tl.int64)[:, None]  # (BLOCK_G * BLOCK_M, 1)
    g = r // BLOCK_M
    t = pid_m * BLOCK_M + r % BLOCK_M  # query positions
    rd = tl.arange(0, BLOCK_D).to(tl.int64)[None, :]  # (1, BLOCK_D)
    rn = tl.arange(0, BLOCK_N).to(tl.int64)
    io_mask = (g < GROUP) & (t < T) & (rd < D)
    q = tl.load(q_ptr + (b * stride_qb + hk * GROUP * stride_qh) + (g * stride_qh + t * stride_qt + rd * stride_qd),
                mask=io_mask, other=0.0)  # (BLOCK_G * BLOCK_M, BLOCK_D)
    # Head dims past D wrap onto valid ones in K and V: q is 0 there, and those output columns are never stored.
    rdw = rd % D
    k_base = k_ptr + (b * stride_kb + hk * stride_kh) + tl.trans(rdw) * stride_kd  # K.T tiles: (BLOCK_D, BLOCK_N)
    v_base = v_ptr + (b * stride_vb + hk * stride_vh) + rdw * stride_vd  # V tiles: (BLOCK_N, BLOCK_D)
    qk_scale = scale * 1.4426950408889634  # softmax in base 2: exp(x) = exp2(x * log2(e))

    # Running max starts finite so a row that has seen no visible key yet keeps exp2(m_old - m_new) = 1 and l = 0.
    m_i = tl.full((BLOCK_G * BLOCK_M,), -1.0e30, tl.float32)
    # The softmax denominators are row sums of p, taken with tl.dot against ones (every column holds its row's
    # sum) from the same p that multiplies v: the division at the end is then elementwise, and the sum one more
    # small matmul next to p @ v instead of a reduction.
    l_i = tl.full((BLOCK_G * BLOCK_M, BLOCK_D), 0.0, tl.float32)
    ones = tl.full((BLOCK_N, BLOCK_D), 1.0, v_ptr.dtype.element_ty)
    acc = tl.full((BLOCK_G * BLOCK_M, BLOCK_D), 0.0, tl.float32)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, T)  # causal: no key after this block's last query
    for n0 in range((start // BLOCK_N) * BLOCK_N, hi, BLOCK_N):  # key blocks wholly in the padding skipped
        cols = n0 + rn  # key positions
        pos = cols % T  # keys past T wrap onto real ones (never visible: they come after every query)
        kt = tl.load(k_base + pos[None, :] * stride_kt)
        v = tl.load(v_base + pos[:, None] * stride_vt)
        s = tl.dot(q, kt, input_precision="ieee") * qk_scale  # (BLOCK_G * BLOCK_M, BLOCK_N), log2 units
        s = tl.where((cols[None, :] >= start) & (cols[None, :] <= t), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)[:, None]
        p = tl.exp2(s - m_new[:, None])  # 0 where not visible
        p = p.to(v.dtype)
        l_i = l_i * alpha + tl.dot(p, ones, input_precision="ieee")
        acc = acc * alpha + tl.dot(p, v, input_precision="ieee")
        m_i = m_new

    o = acc / tl.where(l_i > 0.0, l_i, 1.0)  # rows with no visible key (left padding) stay exactly 0
    tl.store(o_ptr + (b * stride_ob + hk * GROUP * stride_oh) + (g * stride_oh + t * stride_ot + rd * stride_od),
             o.to(o_ptr.dtype.element_ty), mask=io_mask)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_start: torch.Tensor,
              scale: float) -> torch.Tensor:
    """softmax(q k^T * scale, causal and kv_start[b] <= j) v for q (B, Hq, T, D), k and v (B, Hkv, T, D)."""
    B, HQ, T, D = q.shape
    HKV = k.shape[1]
    assert k.shape == v.shape == (B, HKV, T, D), (q.shape, k.shape, v.shape)
    assert HQ % HKV == 0, f"attention: {HQ} query heads do not share {HKV} kv heads evenly"
    assert kv_start.shape == (B,) and kv_start.dtype == torch.int32, (kv_start.shape, kv_start.dtype)
    BLOCK_G = triton.next_power_of_2(HQ // HKV)  # query heads per kv head, padded
    BLOCK_D = 16 * triton.next_power_of_2(triton.cdiv(D, 16))  # a power of 2 >= 16 (tl.dot), without a clamp
    assert BLOCK_G <= 16 and BLOCK_D <= 256, f"attention: group {HQ // HKV} or head dim {D} too large"
    o = torch.empty((B, HQ, T, D), dtype=q.dtype, device=q.device)
    grid = lambda meta: (triton.cdiv(T, meta["BLOCK_M"]), B * HKV)
    attention_kernel[grid](
        q, k, v, kv_start, o,
        T, HKV, HQ // HKV, D, scale,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        # Not yet tuned on a GPU. Under the interpreter cost follows the number of tl ops run, so the query heads of
        # a kv head share one tile (4 x 64 rows for 9 / 3 heads). CPU ms per call at T = 40 / 150 (B = 1, D = 64):
        # BLOCK_M x BLOCK_N = 64 x 32: 21.5 / 94; 32 x 64: 29 / 113; 32 x 32: 33 / 125; 16 x 128: 43 / 185.
        # Each tl.dot stays under 1M multiply-adds, where numpy's BLAS turns multithreaded (~100x the CPU when busy).
        # 8 warps for the 256-row tile: ptxas for sm_80 gives bf16 41 KB shared, 16 B spills (4 warps: 13 KB spills).
        BLOCK_M=64, BLOCK_N=32, BLOCK_D=BLOCK_D, BLOCK_G=BLOCK_G, num_warps=8,
    )
    return o
