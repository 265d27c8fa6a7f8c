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
    # int64 index math: V * K passes 2^31 for large vocabularies (and the interpreter skips int32 overflow checks)
    rm = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)  # vocabulary tiles on the long grid axis
    rk = tl.arange(0, BLOCK_K).to(tl.int64)
    # Rows past M / V wrap onto valid ones (their results are never stored), so whole K tiles need no load mask.
    x_ptrs = x_ptr + ((rm % M)[:, None] * stride_xm + rk[None, :] * stride_xk)  # (BLOCK_M, BLOCK_K)
    w_ptrs = w_ptr + ((rn % V)[None, :] * stride_wv + rk[:, None] * stride_wk)  # (BLOCK_K, BLOCK_N): a W.T tile
    x_step = tl.cast(stride_xk, tl.int64) * BLOCK_K
    w_step = tl.cast(stride_wk, tl.int64) * BLOCK_K
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for _ in range(K // BLOCK_K):  # whole tiles
        a = tl.load(x_ptrs)
        b = tl.load(w_ptrs)
        if a.dtype != b.dtype:  # e.g. fp16 activations against an fp32 weight: multiply in fp32, exactly
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")  # ieee: fp32 logits must not silently come from tf32
        x_ptrs += x_step
        w_ptrs += w_step
    k_left = K % BLOCK_K
    if k_left > 0:  # a partial last tile
        a = tl.load(x_ptrs, mask=rk[None, :] < k_left, other=0.0)
        b = tl.load(w_ptrs, mask=rk[:, None] < k_left, other=0.0)
        if a.dtype != b.dtype:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    tl.store(y_ptr + (rm[:, None] * stride_ym + rn[None, :] * stride_yv), acc,
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
        # 49152 / 512 = 96 programs, a 64 x 512 weight tile per step. Not yet measured on a GPU (the protected op
        # is never retuned: 256 gave 192 programs, more than an H100's 132 SMs). Under the interpreter cost follows
        # the number of tl ops and loaded elements; one M = 1 fp32 call took 0.86 s CPU here against 1.14 s at
        # BLOCK_N = 256 and 0.67-0.75 s at 1024 x 32 / 2048 x 16 (2.27 s before this layout). 16 x 64 x 512
        # multiply-adds per tl.dot stay under numpy's multithreaded-BLAS size (1M), ~20x the CPU on a busy machine.
        # 2 stages: ptxas for sm_80 puts fp32 at 135 KB shared (3 stages: 270 KB, over any GPU's limit); bf16 68 KB.
        BLOCK_M=16, BLOCK_N=512, BLOCK_K=64, num_warps=8, num_stages=2,
    )
    return y
