# logits = x @ weight.T in float32 for the final projection onto the vocabulary (V = 49152, K = 576). Protected:
# the loop never rewrites it. Built for small M (decode and last-token prefill, M <= 16 fills one row tile): it
# streams the weight once, V / BLOCK_N programs wide. Large M works but re-reads the weight per BLOCK_M rows.
import torch
import triton
import triton.language as tl


@triton.jit
def lm_head_kernel(
    # pointers
    x_ptr, w_ptr, y_ptr,
    # sizes
    M, V, K,
    stride_xm, stride_xk, stride_wv, stride_wk, stride_ym, stride_yv,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(1)
    pid_n = tl.program_id(0)  # vocabulary tiles on the long grid axis
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Rows past M / V wrap onto valid ones (their results are never stored), so only K needs a load mask.
    k_row = rk[None, :]  # (1, BLOCK_K)
    k_col = rk[:, None]  # (BLOCK_K, 1)
    x_ptrs = x_ptr + (rm % M)[:, None] * stride_xm + k_row * stride_xk  # (BLOCK_M, BLOCK_K)
    w_ptrs = w_ptr + (rn % V)[None, :] * stride_wv + k_col * stride_wk  # (BLOCK_K, BLOCK_N): a W.T tile
    x_step = BLOCK_K * stride_xk
    w_step = BLOCK_K * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_left in range(K, 0, -BLOCK_K):  # columns still to go; the last tile may be partial
        a = tl.load(x_ptrs, mask=k_row < k_left, other=0.0)
        b = tl.load(w_ptrs, mask=k_col < k_left, other=0.0)
        if a.dtype != b.dtype:  # e.g. fp16 activations against an fp32 weight: multiply in fp32, exactly
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if a.dtype == tl.bfloat16:
            # The interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584); bf16 -> fp32 is
            # exact and so are the products, so this costs speed on a GPU, never accuracy.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")  # ieee: fp32 logits must not silently come from tf32
        x_ptrs += x_step
        w_ptrs += w_step
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yv, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < V))


def lm_head(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (M, K) @ weight (V, K).T -> float32 logits (M, V), whatever the input dtypes."""
    M, K = x.shape
    V, K2 = weight.shape
    assert K == K2, f"lm_head: x has K={K}, weight has K={K2}"
    y = torch.empty((M, V), dtype=torch.float32, device=x.device)
    grid = lambda meta: (triton.cdiv(V, meta["BLOCK_N"]), triton.cdiv(M, meta["BLOCK_M"]))
    lm_head_kernel[grid](
        x, weight, y,
        M, V, K,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1),
        BLOCK_M=16, BLOCK_N=256, BLOCK_K=64, num_warps=8,
    )
    return y
