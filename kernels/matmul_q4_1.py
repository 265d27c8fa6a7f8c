# y = x @ W.T with W kept in GGUF Q4_1 (4-bit codes + fp16 scale d and min m per 32 weights), dequantized tile by
# tile in registers: W is read at ~5 bits per weight instead of 16, which is what decode (M = 1..4, bandwidth-bound)
# wants. Prefill re-dequantizes each W tile once per BLOCK_M rows of x. Breaks for K not a multiple of 32 (asserted).
import torch
import triton
import triton.language as tl


@triton.jit
def matmul_q4_1_kernel(
    # pointers
    x_ptr, qs_ptr, d_ptr, m_ptr, y_ptr,
    # sizes
    M, N, K,
    stride_xm, stride_xk, stride_qn, stride_dn, stride_mn, stride_ym, stride_yn,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Column k of W sits in block k // 32; its code is the low nibble of byte (k // 32) * 16 + k % 16 when
    # k % 32 < 16, else the high nibble. BLOCK_K is a multiple of 32, so the pattern is the same in every tile.
    byte = (rk // 32) * 16 + rk % 16
    shift = ((rk // 16) % 2 * 4)[:, None]  # (BLOCK_K, 1): 0 for the low nibble, 4 for the high one
    # Rows past M / N wrap onto valid ones (their results are never stored), so only K needs a load mask.
    x_ptrs = x_ptr + (rm % M)[:, None] * stride_xm + rk[None, :] * stride_xk  # (BLOCK_M, BLOCK_K)
    q_ptrs = qs_ptr + (rn % N)[None, :] * stride_qn + byte[:, None]  # (BLOCK_K, BLOCK_N): a W.T tile
    d_ptrs = d_ptr + (rn % N)[None, :] * stride_dn + (rk // 32)[:, None]
    m_ptrs = m_ptr + (rn % N)[None, :] * stride_mn + (rk // 32)[:, None]
    x_step = BLOCK_K * stride_xk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_left in range(K, 0, -BLOCK_K):  # columns still to go; the last tile may be partial (in whole blocks)
        k_mask = rk[:, None] < k_left
        a = tl.load(x_ptrs, mask=rk[None, :] < k_left, other=0.0)
        q = (tl.load(q_ptrs, mask=k_mask, other=0) >> shift) & 0xF
        d = tl.load(d_ptrs, mask=k_mask, other=0.0).to(tl.float32)
        mn = tl.load(m_ptrs, mask=k_mask, other=0.0).to(tl.float32)
        w = d * q.to(tl.float32) + mn  # (BLOCK_K, BLOCK_N), fp32
        if a.dtype == tl.bfloat16:
            # The interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584): keep bf16 rows in
            # fp32 (exact) and multiply the fp32 dequantized tile.
            a = a.to(tl.float32)
        acc = tl.dot(a, w.to(a.dtype), acc, input_precision="ieee")  # ieee: fp32 must not silently become tf32
        x_ptrs += x_step
        q_ptrs += BLOCK_K // 2
        d_ptrs += BLOCK_K // 32
        m_ptrs += BLOCK_K // 32
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul_q4_1(x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """x (M, K) @ W.T -> (M, N) in x's dtype; W[n, k] = d[n, k // 32] * code + m[n, k // 32], planar Q4_1."""
    M, K = x.shape
    N = qs.shape[0]
    assert K % 32 == 0, f"matmul_q4_1: K={K} is not a whole number of 32-weight blocks"
    assert qs.dtype == torch.uint8 and qs.shape == (N, K // 2), (qs.dtype, qs.shape)
    assert d.shape == m.shape == (N, K // 32), (d.shape, m.shape)
    assert qs.stride(1) == d.stride(1) == m.stride(1) == 1, "matmul_q4_1: rows of qs, d, m must be contiguous"
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))
    matmul_q4_1_kernel[grid](
        x, qs, d, m, y,
        M, N, K,
        x.stride(0), x.stride(1), qs.stride(0), d.stride(0), m.stride(0), y.stride(0), y.stride(1),
        BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4,
    )
    return y
