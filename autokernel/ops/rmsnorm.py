"""rmsnorm: y = x / sqrt(mean(x^2) + eps) * w over the hidden dim (llama's attn_norm of layer 0)."""
import torch

from autokernel.ops.rounding import norm_rounding
from autokernel.ops.smollm2 import HIDDEN
from autokernel.ops.spec import OpSpec, Shape, draw, elem_size, leading, row_shape, row_shapes, sample

EPS = (1e-6, 1e-5)  # llama's rms_norm_eps: 1e-5 (SmolLM2, Llama 3) or 1e-6 (Llama 2); each case draws either or a
# value log-uniform between them (eps matters where mean(x^2) is as small: the tiny distribution)


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * rstd * weight


def rounding(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Each element's float32 floor, relative to itself (autokernel/ops/rounding.py norm_rounding)."""
    return reference(x, weight, eps).abs() * norm_rounding(x.shape[-1])


def make_inputs(shape: Shape, dtype, device, gen, dist="normal"):
    M, N = shape["M"], shape["N"]
    return {"x": sample((*leading(M, gen), N), dtype, device, gen, dist),
            "weight": (1.0 + 0.2 * torch.randn(N, generator=gen)).to(dtype=dtype, device=device),
            "eps": draw(gen, *EPS, EPS)}


def shape_of(x, weight, eps) -> Shape:
    return row_shape(x)


SPEC = OpSpec(
    name="rmsnorm",
    reference=reference,
    rounding=rounding,  # per element: a small element is never judged by the largest one's ulps
    make_inputs=make_inputs,
    shape_of=shape_of,
    flops=lambda s: 4 * s["M"] * s["N"],
    bytes_moved=lambda s, dt: (2 * s["M"] * s["N"] + s["N"]) * elem_size(dt),
    model_shapes=row_shapes(HIDDEN),
    odd_shapes=({"M": 3, "N": 431}, {"M": 1, "N": 6}, {"M": 37, "N": 1823}),
    extra={"elementwise": True},  # every dtype's output judged per element (autokernel/ops/tolerance.py)
    doc="Root-mean-square normalisation of each row of x (..., N), then an elementwise scale by weight (N,). "
        "Accumulate in float32; the output has x's dtype.",
)
