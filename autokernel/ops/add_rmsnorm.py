"""add_rmsnorm: h = residual + x, y = rmsnorm(h) * w (the residual add closing a block, then the next ffn_norm)."""
import torch

from autokernel.ops.rmsnorm import EPS
from autokernel.ops.rounding import norm_rounding
from autokernel.ops.smollm2 import HIDDEN
from autokernel.ops.spec import OpSpec, Shape, draw, elem_size, leading, row_shape, row_shapes, sample


def reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    h = residual + x  # in x's dtype: the residual stream is stored rounded
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h * rstd * weight, h


def rounding(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each element's float32 floor, (y's, h's): h = residual + x is one rounding, exact in float64, so its floor is
    0 (each element within 2 x eager's own error there plus 4 of its own ulps: a residual rounded to a grid of the
    row's massive activation, 0.73% off on its small elements, passed the output-scale bound)."""
    y, h = reference(x, residual, weight, eps)
    return y.abs() * norm_rounding(x.shape[-1]), torch.zeros_like(h)


def make_inputs(shape: Shape, dtype, device, gen, dist="normal"):
    M, N = shape["M"], shape["N"]
    rows = leading(M, gen)
    return {"x": sample((*rows, N), dtype, device, gen, dist),
            "residual": sample((*rows, N), dtype, device, gen, dist),
            "weight": (1.0 + 0.2 * torch.randn(N, generator=gen)).to(dtype=dtype, device=device),
            "eps": draw(gen, *EPS, EPS)}


def shape_of(x, residual, weight, eps) -> Shape:
    return row_shape(x)


SPEC = OpSpec(
    name="add_rmsnorm",
    reference=reference,
    rounding=rounding,  # per element: a small element is never judged by the largest one's ulps
    make_inputs=make_inputs,
    shape_of=shape_of,
    flops=lambda s: 5 * s["M"] * s["N"],
    bytes_moved=lambda s, dt: (4 * s["M"] * s["N"] + s["N"]) * elem_size(dt),
    model_shapes=row_shapes(HIDDEN),
    odd_shapes=({"M": 3, "N": 431}, {"M": 1, "N": 6}, {"M": 37, "N": 1823}),
    extra={"elementwise": True},  # every dtype's output judged per element (autokernel/ops/tolerance.py)
    doc="Residual add then RMSNorm, fused: h = residual + x (rounded to x's dtype), y = h / sqrt(mean(h^2, -1) + "
        "eps) * weight over the last dim of x, residual (..., N), weight (N,). Returns the tuple (y, h) of new "
        "tensors in x's dtype; accumulate in float32.",
)
