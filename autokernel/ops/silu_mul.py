"""silu_mul: silu(gate) * up, the SwiGLU gating between ffn_gate/ffn_up and ffn_down."""
import torch
import torch.nn.functional as F

from autokernel.ops.rounding import ELEMENT_ROUNDINGS, U32
from autokernel.ops.smollm2 import FFN
from autokernel.ops.spec import OpSpec, Shape, elem_size, row_shape, row_shapes, sample


def reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def rounding(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Each element's float32 floor, relative to itself (autokernel/ops/rounding.py ELEMENT_ROUNDINGS)."""
    return reference(gate, up).abs() * (ELEMENT_ROUNDINGS * U32)


def make_inputs(shape: Shape, dtype, device, gen, dist="normal"):
    M, N = shape["M"], shape["N"]
    return {"gate": sample((M, N), dtype, device, gen, dist), "up": sample((M, N), dtype, device, gen, dist)}


def shape_of(gate, up) -> Shape:
    return row_shape(gate)


SPEC = OpSpec(
    name="silu_mul",
    reference=reference,
    rounding=rounding,  # per element: a small element is never judged by the largest one's ulps
    make_inputs=make_inputs,
    shape_of=shape_of,
    flops=lambda s: 5 * s["M"] * s["N"],  # neg, exp, add, div, mul
    bytes_moved=lambda s, dt: 3 * s["M"] * s["N"] * elem_size(dt),
    model_shapes=row_shapes(FFN),
    odd_shapes=({"M": 3, "N": 431}, {"M": 1, "N": 6}, {"M": 37, "N": 1823}),
    extra={"elementwise": True},  # every dtype's output judged per element (autokernel/ops/tolerance.py)
    doc="SwiGLU gating: out = silu(gate) * up = gate / (1 + exp(-gate)) * up, elementwise over gate and up "
        "(..., N) of the same shape and dtype. Compute in float32; the output has the inputs' dtype.",
)
