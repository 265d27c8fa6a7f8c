"""Float32 rounding floors of long dot products (OpSpec.rounding, judged in autokernel/ops/tolerance.py).

Eager torch's error is one accumulation order among many, and it depends on the machine: cuBLAS's blocked order is
unusually accurate (on an H200 the project's own matmul, lm_head and matmul_q4_1 kernels were 1.1-1.5x over the
eager-only bound: matmul M=1 N=576 K=1536, max error 3.2e-06 vs bound 2.5e-06, eager 4.9e-07), while MKL on an AMD
EPYC errs about as much as a sequential sum. The floor below is the error float32 accumulation makes in the orders a
sane kernel sums in, derived per element from the inputs alone, so a verdict does not hang on the eager baseline.

The error model (Ipsen & Zhou, "Probabilistic error analysis for inner products", SIMAX 2020). Summing the products
p_k = x_k w_k in index order rounds each partial sum s_k = p_1 + ... + p_k once: the error is sum_k d_k s_k with
|d_k| <= u, plus sum_k e_k p_k where products (or dequantized weights) are rounded too. With the d_k independent and
of mean zero, Azuma-Hoeffding gives P(|error| > lam * h) <= 2 exp(-lam^2 / 2) for the Hoeffding unit
h = u sqrt(sum_k s_k^2 + sum_k p_k^2). Round-to-nearest's error is uniform within half an ulp, so its standard
deviation is at most h / sqrt(3) (0.425 h for mantissas spread evenly). The gate allows twice the floor
(tolerance.EAGER_FACTOR): with LAMBDA = 2 that is 4 h >= 6.9 standard deviations, about 4e-12 per element for a
sequential float32 sum. The bound follows the partial sums of *these* inputs, not sqrt(K) times the largest they
could be: the earlier floor, (sqrt(K) sum_k |p_k| + |y|) u, is about sqrt(K) / 2 times larger for zero-mean
products, and passed float32 products of operands cut to 19 significand bits at K = 576 (up to 0.46 of the bound).

Measured at K = 576 (matmul 4 x 576 and matmul_q4_1 4 x 576 outputs, lm_head 1 x 4096; 20 seeds x the gate's 6
distributions; tests/gate/test_gate_tolerance.py keeps a subset), as a multiple of the gate's bound: float32 sums in
order, in reverse or with FMA at most 0.49; blocked (BLOCK_K 16-256) and pairwise at most 0.51; split-K in 4 parts
0.64. Operands cut to 19 significand bits (a Veltkamp split) 1.5-3.1 for matmul and lm_head, 1.0-2.4 for
matmul_q4_1 (its float32-dequantized weights already fit 19 bits, so only x loses any); 20 bits 0.5-1.6; fp16- or
bf16-rounded operands (tf32 keeps fp16's 10 mantissa bits) 300x and more. The project's kernels under the Triton
interpreter (model and odd shapes, 5 distributions): matmul at most 0.52, matmul_q4_1 0.45, lm_head 0.37.
"""
from __future__ import annotations

import functools
import math

import torch

U32 = torch.finfo(torch.float32).eps / 2  # unit roundoff of the float32 accumulator the kernels use
LAMBDA = 2.0  # Hoeffding units in the floor; the gate allows EAGER_FACTOR (2) floors: 4 units, >= 6.9 std devs
BLOCK = 16  # partial sums are exact at every BLOCK-th k; between, bounded through the block's top eigenvector
CHUNK = 1 << 21  # elements of each (blocks, M, N-chunk) temporary


def dot_rounding(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Per element of y = x @ weight.T (float64 x (M, K), weight (N, K)): LAMBDA Hoeffding units of a float32 sum in
    index order or in reverse, whichever has the larger partial sums. Blocked, pairwise and split sums have smaller
    partial sums and stay inside it (module docstring).

    Operands that are all float16 or bfloat16 values may go to tensor cores, whose float32 accumulation truncates
    (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021): errors of one sign that the model above does
    not cover. There the first-order worst case stays: (sqrt(K) sum_k |p_k| + |y|) u."""
    if _half_values(x):
        return ((x.shape[-1] ** 0.5) * (x.abs() @ weight.abs().T) + (x @ weight.T).abs()) * U32
    s2, s1, y, p2 = _partial_sum_moments(x, weight)
    K = x.shape[-1]
    # reverse order: its partial sums are y - s_(k-1); sum_k (y - s_(k-1))^2 = s2 + (K + 1) y^2 - 2 y s1
    s2 = torch.maximum(s2, s2 + (K + 1) * y * y - 2 * y * s1)
    return LAMBDA * U32 * (s2.clamp(min=0) + p2).sqrt()


def _half_values(x: torch.Tensor) -> bool:
    return any(bool((x == x.to(dt).to(x.dtype)).all()) for dt in (torch.float16, torch.bfloat16))


def _partial_sum_moments(x: torch.Tensor, weight: torch.Tensor):
    """(M, N) each: an upper bound on sum_k s_k^2 (s_k the partial sums of x_m * w_n in index order), sum_k s_k, y and
    sum_k p_k^2. The exact sum of squares needs all M N K partial sums (25 s for the gate's 1024 x 1536 x 576 case on
    2 cores); in blocks of BLOCK it takes one batched matmul (0.5-1 s on one core, the earlier floor 0.1-0.2 s). K is
    padded with zeros in front (no partial sum changes). In block g, with S the sum of the blocks before it and t_j
    the partial sums inside it: sum_j (S + t_j)^2 = B S^2 + 2 S T + t'Ct, T = sum_j (B - j) p_j,
    C_ij = B - max(i, j), and t'Ct <= l1 (v1.p)^2 + l2 (|p|^2 - (v1.p)^2) with (l1, v1) C's top eigenpair and l2 its
    second eigenvalue."""
    M, K = x.shape
    N = weight.shape[0]
    B, G = BLOCK, -(-K // BLOCK)
    # in float32 (3x faster than float64; a bound needs no more), scaled by powers of 2 so that nothing overflows
    sx, sw = (_power_of_2_above(t) for t in (x, weight))
    x, weight = (t.to(torch.float32, copy=True).mul_(1 / st) for t, st in ((x, sx), (weight, sw)))
    l1, l2, v1 = _block_eigen(B, str(x.device))
    if G * B > K:
        x, weight = (torch.nn.functional.pad(t, (G * B - K, 0)) for t in (x, weight))
    xb = x.reshape(M, G, B).transpose(0, 1)  # (G, M, B)
    wb = weight.reshape(N, G, B).permute(1, 2, 0)  # (G, B, N)
    lhs = torch.cat([xb, xb * (B - torch.arange(B, device=x.device)), xb * v1], 1)  # (G, 3M, B)
    out = torch.empty((4, M, N), device=x.device)  # sum_k s_k^2 (bound), sum_k s_k, y, sum_k p_k^2
    step = max(1, CHUNK // (G * M))
    for n in range(0, N, step):
        A, T, V = torch.bmm(lhs, wb[..., n:n + step]).split(M, 1)  # (G, M, n): block sums, T, v1.p
        S = torch.zeros_like(A[0])  # the sum of the blocks before block g
        s2, s1 = torch.zeros_like(S), torch.zeros_like(S)
        for g in range(G):
            s2 += S * (B * S + 2 * T[g]) + (l1 - l2) * V[g] * V[g]
            s1 += B * S + T[g]
            S += A[g]
        out[0, :, n:n + step], out[1, :, n:n + step], out[2, :, n:n + step] = s2, s1, S
    out[3] = (x * x) @ (weight * weight).T
    out[0] += l2 * out[3]
    s2, s1, y, p2 = out.double().unbind(0)
    unit = sx * sw
    return s2 * unit ** 2, s1 * unit, y * unit, p2 * unit ** 2


def _power_of_2_above(t: torch.Tensor) -> float:
    """2^e >= max |t| (1 for an empty or all-zero t)."""
    m = max(float(t.max()), -float(t.min())) if t.numel() else 0.0
    return 2.0 ** math.frexp(m)[1] if m > 0 else 1.0


@functools.lru_cache(maxsize=8)
def _block_eigen(B: int, device: str):
    """The two largest eigenvalues of C_ij = B - max(i, j) (i, j < B) and the top eigenvector."""
    i = torch.arange(B, dtype=torch.float64)
    lam, vec = torch.linalg.eigh(B - torch.maximum(i[:, None], i[None, :]))  # ascending
    return float(lam[-1]), float(lam[-2]), vec[:, -1].to(dtype=torch.float32, device=device)


# --- elementwise ops: a floor per element, so a small element is never judged by the largest one's ulps -----------
#
# Without a floor an output is judged against its scale: 2 x eager's worst error + 4 ulps of its largest element.
# Where one element is huge (an LLM residual stream's massive activation, 22,552 next to values of 0.5) every other
# element inherits that slack: a residual rounded to a grid of the row's largest magnitude x 2^-21 (0.73% off on
# its small elements) passed. These ops have no cancellation, so an honest float32 kernel is off by a few roundings
# relative to each element; the floors below say how many, and tolerance.compare judges each element by its own.

ELEMENT_ROUNDINGS = 8  # exp, divide, multiply and the final rounding of silu(g) * u, with a GPU's approximate exp
# (ex2.approx: 2 ulps) counted twice


def norm_rounding(n: int) -> float:
    """The floor of each element of y = h * rsqrt(mean(h^2) + eps) * w over rows of n, relative to |y|: the float32
    sum of n squares in any order (positive terms: at most LAMBDA Hoeffding units, u sqrt(n) of the sum, in the
    module docstring's model), halved by the square root, plus the rsqrt's and the two products' roundings."""
    return U32 * (LAMBDA * 0.5 * math.sqrt(n) + ELEMENT_ROUNDINGS / 2)
