# y = x @ W.T with W kept in GGUF Q4_1 (4-bit codes + fp16 scale d and min m per 32 weights), dequantized tile by
# tile in registers: W is read at ~5 bits per weight instead of 16, which is what decode (M = 1..4, bandwidth-bound)
# wants. Prefill re-dequantizes each W tile once per BLOCK_M rows of x. Breaks for K not a multiple of 32 or qs not
# 4-byte aligned (asserted): codes are read as little-endian 32-bit words, 8 codes per load.
import torch
import triton
import triton.language as tl


@triton.jit
def matmul_q4_1_kernel(
    # pointers
    x_ptr, qs_ptr, d_ptr, m_ptr, y_ptr,
    # sizes
    M, N, K,
    stride_xm, stride_xk, stride_qw, stride_dn, stride_mn, stride_ym, stride_yn,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    NB: tl.constexpr = BLOCK_K // 32  # Q4_1 blocks per K tile
    NW: tl.constexpr = BLOCK_K // 8  # 32-bit code words per K tile and row of W
    # int64 index math: no overflow for large tensors, and no int32 overflow checks under the interpreter
    rm = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows past M / N wrap onto valid ones (their results are never stored), so whole K tiles need no load mask.
    rn3 = tl.reshape(rn % N, (1, 1, BLOCK_N))
    j3 = tl.reshape(tl.arange(0, NW), (NW, 1, 1))  # word j of a tile row is word j & 3 of block j >> 2
    b3 = j3 >> 2
    q_ptrs = qs_ptr.to(tl.pointer_type(tl.uint32)) + (rn3 * stride_qw + j3)  # (NW, 1, BLOCK_N)
    d_ptrs = d_ptr + (rn3 * stride_dn + b3)  # (NW, 1, BLOCK_N): each block's scale once per word
    m_ptrs = m_ptr + (rn3 * stride_mn + b3)
    # Byte t of a block holds the codes of weights t (low nibble) and t + 16 (high nibble); word w = bytes 4w..4w+3.
    # Nibble r = 0..7 of a word is (word >> 4 r) & 0xF: byte r >> 1, high half when r is odd. Unpacking a
    # (NW, 1, BLOCK_N) word tile against (1, 8, 1) shifts gives W.T tile row 8 j + r = 32 b + 2 t + h for block b,
    # byte t, nibble h, which holds weight 32 b + 16 h + t: x is gathered in that order instead of permuting W.
    shift = tl.reshape(tl.arange(0, 8) << 2, (1, 8, 1)).to(tl.uint32)
    low4 = tl.full((NW, 8, BLOCK_N), 0xF, tl.uint32)
    col = tl.reshape(tl.permute(tl.reshape(tl.arange(0, BLOCK_K), (NB, 2, 16)), (0, 2, 1)), (BLOCK_K,))  # (b, t, h)
    stride_xk = tl.cast(stride_xk, tl.int64)  # col is int32
    x_ptrs = x_ptr + (tl.reshape(rm % M, (BLOCK_M, 1)) * stride_xm + col[None, :] * stride_xk)  # (BLOCK_M, BLOCK_K)
    x_step = stride_xk * BLOCK_K
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for _ in range(K // BLOCK_K):  # whole tiles
        w = ((tl.load(q_ptrs) >> shift) & low4).to(tl.float32) * tl.load(d_ptrs).to(tl.float32) \
            + tl.load(m_ptrs).to(tl.float32)  # (NW, 8, BLOCK_N), fp32
        a = tl.load(x_ptrs)
        acc = tl.dot(a, tl.reshape(w, (BLOCK_K, BLOCK_N)).to(a.dtype), acc, input_precision="ieee")  # ieee: no tf32
        x_ptrs += x_step
        q_ptrs += NW
        d_ptrs += NB
        m_ptrs += NB
    words_left = (K % BLOCK_K) // 8
    if words_left > 0:  # a partial last tile, in whole blocks
        k_ok = j3 < words_left
        w = ((tl.load(q_ptrs, mask=k_ok, other=0) >> shift) & low4).to(tl.float32) \
            * tl.load(d_ptrs, mask=k_ok, other=0.0).to(tl.float32) \
            + tl.load(m_ptrs, mask=k_ok, other=0.0).to(tl.float32)
        a = tl.load(x_ptrs, mask=col[None, :] < words_left * 8, other=0.0)
        acc = tl.dot(a, tl.reshape(w, (BLOCK_K, BLOCK_N)).to(a.dtype), acc, input_precision="ieee")
    tl.store(y_ptr + (rm[:, None] * stride_ym + rn[None, :] * stride_yn), acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul_q4_1(x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """x (M, K) @ W.T -> (M, N) in x's dtype; W[n, k] = d[n, k // 32] * code + m[n, k // 32], planar Q4_1."""
    M, K = x.shape
    N = qs.shape[0]
    assert K % 32 == 0, f"matmul_q4_1: K={K} is not a whole number of 32-weight blocks"
    assert qs.dtype == torch.uint8 and qs.shape == (N, K // 2), (qs.dtype, qs.shape)
    assert d.shape == m.shape == (N, K // 32), (d.shape, m.shape)
    assert qs.stride(1) == d.stride(1) == m.stride(1) == 1, "matmul_q4_1: rows of qs, d, m must be contiguous"
    assert qs.stride(0) % 4 == 0 and qs.storage_offset() % 4 == 0, "matmul_q4_1: qs rows must be 4-byte aligned"
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))
    matmul_q4_1_kernel[grid](
        x, qs, d, m, y,
        M, N, K,
        x.stride(0), x.stride(1), qs.stride(0) // 4, d.stride(0), m.stride(0), y.stride(0), y.stride(1),
        # Not yet tuned on a GPU. Under the interpreter cost follows the number of tl ops run, so the W tile is the
        # largest that stays sane on a GPU (32K weights) and keeps the 16-row tl.dot under numpy's multithreaded-BLAS
        # size (1M multiply-adds: ~20-100x the CPU on a busy machine). One decode layer (its 7 projections, M = 1):
        # BLOCK_N x BLOCK_K = 512 x 64: 193 ms CPU, 1.12M Python calls; 256 x 128: 207 ms, 1.24M; 1024 x 32:
        # 210 ms, 1.23M; 128 x 256: 1.69M calls; 256 x 64: 1.80M calls. Warps and stages from ptxas -v for sm_80:
        # 84 KB shared and no spills for bf16 (4 warps spill 220 B), 152 KB for fp32 (3 stages: 172 KB > 163 KB).
        BLOCK_M=16, BLOCK_N=512, BLOCK_K=64, num_warps=8, num_stages=2,
    )
    return y
