"""matmul: y = x @ weight.T, the model's float projections (q, k, v, o, gate, up, down) in nn.Linear layout."""
import torch

from autokernel.ops.rounding import dot_rounding
from autokernel.ops.smollm2 import FFN, HIDDEN, KV
from autokernel.ops.spec import OpSpec, Shape, elem_size, sample


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x @ weight.T


def make_inputs(shape: Shape, dtype, device, gen, dist="normal"):
    M, N, K = shape["M"], shape["N"], shape["K"]
    weight = torch.randn((N, K), generator=gen) * K ** -0.5  # unit-variance outputs, as a trained layer gives
    return {"x": sample((M, K), dtype, device, gen, dist), "weight": weight.to(dtype=dtype, device=device)}


def shape_of(x, weight) -> Shape:
    return {"M": x.shape[0], "N": weight.shape[0], "K": x.shape[1]}


SPEC = OpSpec(
    name="matmul",
    reference=reference,
    make_inputs=make_inputs,
    shape_of=shape_of,
    flops=lambda s: 2 * s["M"] * s["N"] * s["K"],
    bytes_moved=lambda s, dt: (s["M"] * s["K"] + s["N"] * s["K"] + s["M"] * s["N"]) * elem_size(dt),
    # decode (M = 1, 4) through every projection; prefill of a 96-token batch through q/o and gate/up
    model_shapes=({"M": 1, "N": HIDDEN, "K": HIDDEN}, {"M": 1, "N": KV, "K": HIDDEN},
                  {"M": 1, "N": FFN, "K": HIDDEN}, {"M": 1, "N": HIDDEN, "K": FFN},
                  {"M": 4, "N": HIDDEN, "K": FFN}, {"M": 96, "N": HIDDEN, "K": HIDDEN},
                  {"M": 96, "N": FFN, "K": HIDDEN}),
    odd_shapes=({"M": 3, "N": 123, "K": 431}, {"M": 1, "N": 6, "K": 42}, {"M": 37, "N": 781, "K": 181}),
    doc="y = x @ weight.T: x (M, K), weight (N, K) as nn.Linear stores it, y (M, N) in x's dtype. "
        "Accumulate in float32.",
    rounding=dot_rounding,  # float32 accumulation in any order (autokernel/ops/rounding.py)
)
