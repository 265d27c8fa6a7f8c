"""lm_head: float32 logits = x @ weight.T over the vocabulary (SmolLM2-135M ties it to the token embedding)."""
import torch

from autokernel.ops.rounding import dot_rounding
from autokernel.ops.smollm2 import HIDDEN, VOCAB
from autokernel.ops.spec import OpSpec, Shape, elem_size, sample


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # Logits are float32 whatever the activations are (float64 stays float64 for the error reference).
    dt = torch.promote_types(torch.promote_types(x.dtype, weight.dtype), torch.float32)
    return x.to(dt) @ weight.to(dt).T


def make_inputs(shape: Shape, dtype, device, gen, dist="normal"):
    M, V, K = shape["M"], shape["V"], shape["K"]
    weight = torch.randn((V, K), generator=gen) * K ** -0.5  # unit-variance logits
    return {"x": sample((M, K), dtype, device, gen, dist), "weight": weight.to(dtype=dtype, device=device)}


def shape_of(x, weight) -> Shape:
    return {"M": x.shape[0], "V": weight.shape[0], "K": x.shape[1]}


SPEC = OpSpec(
    name="lm_head",
    reference=reference,
    make_inputs=make_inputs,
    shape_of=shape_of,
    flops=lambda s: 2 * s["M"] * s["V"] * s["K"],
    bytes_moved=lambda s, dt: (s["M"] * s["K"] + s["V"] * s["K"]) * elem_size(dt) + s["M"] * s["V"] * 4,
    # Decode of one sequence. A batch of 4 (M = 4) is the same weight stream with 3 more rows; it is left out
    # because each full-vocabulary call costs seconds under the CPU interpreter; odd_shapes cover M > 1.
    model_shapes=({"M": 1, "V": VOCAB, "K": HIDDEN},),
    odd_shapes=({"M": 3, "V": 1823, "K": 431}, {"M": 1, "V": 6, "K": 42}, {"M": 37, "V": 781, "K": 576}),
    doc="Final logits: x (M, K) @ weight (V, K).T -> (M, V) float32 whatever x's dtype. Accumulate in float32. "
        "Protected: never rewritten by the loop.",
    rounding=dot_rounding,  # float32 accumulation in any order (autokernel/ops/rounding.py)
    extra={"protected": True},
)
