# RMSNorm, deliberately slow but correct: 256-wide chunks in two passes over the row (the planted incumbent of
# tests/run/test_run_e2e.py). Under the Triton interpreter cost follows programs x ops: at N=576 this is ~4x slower
# than one block per row (30.9 vs 7.8 ms for M=4, measured; 16-wide chunks were 37x, past bench.implausible_factor),
# and BLOCK_N=1024 alone (the offline search's step) gives ~2x.
import torch
import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(
    # pointers
    x_ptr, w_ptr, y_ptr,
    # sizes
    N, stride_x, stride_y, eps,
    # meta-parameters
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride_y + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight, over the last dim of x (..., N)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M, N = x2.shape
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    rmsnorm_kernel[(M,)](x2, weight, y, N, x2.stride(0), y.stride(0), eps, BLOCK_N=256)
    return y.reshape(shape)
