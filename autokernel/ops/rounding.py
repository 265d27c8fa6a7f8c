"""Float32 rounding floors of long dot products (OpSpec.rounding, judged in autokernel/ops/tolerance.py).

Eager torch's error is one accumulation order among many. On a GPU it comes from cuBLAS, whose blocked order is
unusually accurate; a Triton kernel's K-tile order is another valid one. Measured on an H200 (compiled kernels,
float32): the project's own matmul, lm_head and matmul_q4_1 kernels were 1.1-1.5x over the eager-only bound
(matmul M=1 N=576 K=1536: max error 3.2e-06 vs bound 2.5e-06, eager 4.9e-07), so the gate would have rejected the
incumbents themselves. The floor below is what float32 accumulation can make in any order, to first order.
"""
from __future__ import annotations

import torch

U32 = torch.finfo(torch.float32).eps / 2  # unit roundoff of the float32 accumulator the kernels use


def dot_rounding(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Per element of y = x @ weight.T (float64 x (M, K), weight (N, K)): (sqrt(K) sum_k |x_k w_k| + |y|) u.
    Each of the K additions rounds its partial sum (at most sum_k |x_k w_k| in size); K such errors add up as a
    random walk, to sqrt(K) of one; then y itself is rounded. This is the logit term of attention's floor
    (autokernel/ops/attention.py) for a length-K dot product.

    A wrong kernel stays far above it. Measured on the specs' inputs (every distribution, float32), as a multiple of
    the gate's bound (2x this floor plus 4 ulps): operands rounded to tf32 or fp16, 6.6-18x at K = 1536 (the model's
    longest dot), 22-49x at K = 576, ~100x at K = 42; one of the K terms dropped, hundreds of times or more (unless
    that term is 0); the float32 product itself, 0.01-0.09x."""
    K = x.shape[-1]
    return ((K ** 0.5) * (x.abs() @ weight.abs().T) + (x @ weight.T).abs()) * U32
