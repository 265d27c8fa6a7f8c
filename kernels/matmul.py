# y = x @ weight.T for nn.Linear weights, one (BLOCK_M, BLOCK_N) output tile per program, fp32 accumulator.
# Fast for the model's projections (K = 576 or 1536, N = 192..1536) at any M; decode (M = 1..4) fills 1/16 of
# each tile, which is bandwidth-bound anyway. Breaks nowhere in size; bf16 tiles are multiplied as fp32 (see below).
import torch
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(
    # pointers
    x_ptr, w_ptr, y_ptr,
    # sizes
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Rows past M / N wrap onto valid ones (their results are never stored), so only K needs a load mask.
    x_ptrs = x_ptr + (rm % M)[:, None] * stride_xm + rk[None, :] * stride_xk  # (BLOCK_M, BLOCK_K)
    w_ptrs = w_ptr + (rn % N)[None, :] * stride_wn + rk[:, None] * stride_wk  # (BLOCK_K, BLOCK_N): a W.T tile
    x_step = BLOCK_K * stride_xk
    w_step = BLOCK_K * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_left in range(K, 0, -BLOCK_K):  # columns still to go; the last tile may be partial
        a = tl.load(x_ptrs, mask=rk[None, :] < k_left, other=0.0)
        b = tl.load(w_ptrs, mask=rk[:, None] < k_left, other=0.0)
        if a.dtype == tl.bfloat16:
            # The interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584); bf16 -> fp32 is
            # exact and so are the products, so this costs speed on a GPU, never accuracy.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")  # ieee: an fp32 matmul must not silently run in tf32
        x_ptrs += x_step
        w_ptrs += w_step
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (M, K) @ weight (N, K).T -> (M, N) in x's dtype, as nn.Linear without bias."""
    M, K = x.shape
    N, K2 = weight.shape
    assert K == K2, f"matmul: x has K={K}, weight has K={K2}"
    assert x.dtype == weight.dtype, f"matmul: x is {x.dtype}, weight is {weight.dtype}"
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))
    matmul_kernel[grid](
        x, weight, y,
        M, N, K,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1),
        BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4,
    )
    return y
