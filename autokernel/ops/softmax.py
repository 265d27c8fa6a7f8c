"""softmax: next-token probabilities softmax(logits / temperature) over the vocab, for sampling."""
import torch

from autokernel.ops.smollm2 import VOCAB
from autokernel.ops.spec import OpSpec, Shape, draw, elem_size, sample

# Sampling temperatures users set: each case draws 0.7 (a common default), 1.0 (plain softmax) or a value
# log-uniform over 0.1..2: a kernel with the temperature baked in is wrong on most cases.
TEMPERATURE = 0.7
TEMPERATURES = (0.1, 2.0)


def reference(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    # float32 at least: sampling reads float32 probabilities whatever the logits' dtype (float64 for the truth)
    return torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, dim=-1)


def make_inputs(shape: Shape, dtype, device, gen, dist="normal"):
    return {"logits": sample((shape["M"], shape["V"]), dtype, device, gen, dist),
            "temperature": draw(gen, *TEMPERATURES, (TEMPERATURE, 1.0))}


def shape_of(logits, temperature) -> Shape:
    return {"M": logits.shape[0], "V": logits.shape[1]}


SPEC = OpSpec(
    name="softmax",
    reference=reference,
    make_inputs=make_inputs,
    shape_of=shape_of,
    flops=lambda s: 5 * s["M"] * s["V"],  # divide, subtract, exp, add; divide again in the second pass
    bytes_moved=lambda s, dt: s["M"] * s["V"] * (2 * elem_size(dt) + 4),  # logits read twice, float32 probs written
    model_shapes=({"M": 1, "V": VOCAB}, {"M": 4, "V": VOCAB}),
    # and Llama 3's vocabulary, 128,256 (not a multiple of 4096: a path for large vocabularies that unrolls whole
    # chunks and masks only one tail chunk dropped ids 128,000+, <|eot_id|> among them, while 49,152 is exact)
    odd_shapes=({"M": 3, "V": 431}, {"M": 1, "V": 6}, {"M": 2, "V": 1823}, {"M": 1, "V": 1}, {"M": 1, "V": 128256}),
    doc="Softmax over the last dim of logits (M, V) divided by temperature (> 0; 0.1 to 2 in practice): probs = "
        "exp(z - max z) / sum(exp(z - max z)) with z = logits / temperature, numerically stable (subtract the row "
        "max). V can be far larger than one block (49152), so stream the row (online max and sum). probs are "
        "float32 whatever the logits' dtype; accumulate in float32.",
)
