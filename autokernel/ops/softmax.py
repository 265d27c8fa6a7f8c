"""softmax: next-token probabilities softmax(logits / temperature) over the vocab, for sampling."""
import torch

from autokernel.ops.rounding import U32
from autokernel.ops.smollm2 import VOCAB
from autokernel.ops.spec import OpSpec, Shape, draw, elem_size, sample

# Sampling temperatures users set: each case draws 0.7 (a common default), 1.0 (plain softmax) or a value
# log-uniform over 0.1..2: a kernel with the temperature baked in is wrong on most cases.
TEMPERATURE = 0.7
TEMPERATURES = (0.1, 2.0)


def reference(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    # float32 at least: sampling reads float32 probabilities whatever the logits' dtype (float64 for the truth)
    return torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, dim=-1)


def rounding(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """First-order error, per probability, of softmax(logits / temperature) computed in float32, for float64 logits
    (the spec's `rounding`, autokernel/ops/tolerance.py; as attention's softmax_rounding, without the dot products).
    Each z_i = l_i / T is rounded (|z_i| u), then z_i - max z and its scaling into exp (|z_i - max z| u each: a
    base-2 kernel multiplies by log2(e), as flash attention does), and exp adds a few ulps: e_i = (|z_i| + 2 |z_i -
    max z| + 4) u. Softmax turns logit errors d into p_i (d_i - dbar), at most p_i (e_i + sum_j p_j e_j); the sum over
    V terms adds sqrt(V) u p_i (its rounding as a random walk). Logits in the hundreds over T = 0.1 (|z| ~ 10^3) are
    ~10^3 ulps of the top probability: eager's own error, one rounding order, was a few, and an exp2 rewrite (error
    1.09x a bound of twice eager's) was rejected for the rounding every float32 softmax makes."""
    z = logits.to(torch.float64) / temperature
    e = (z.abs() + 2 * (z - z.amax(-1, keepdim=True)).abs() + 4) * U32
    p = torch.softmax(z, dim=-1)
    return p * (e + (p * e).sum(-1, keepdim=True) + z.shape[-1] ** 0.5 * U32)


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
    rounding=rounding,
    doc="Softmax over the last dim of logits (M, V) divided by temperature (> 0; 0.1 to 2 in practice): probs = "
        "exp(z - max z) / sum(exp(z - max z)) with z = logits / temperature, numerically stable (subtract the row "
        "max). V can be far larger than one block (49152), so stream the row (online max and sum). probs are "
        "float32 whatever the logits' dtype; accumulate in float32.",
)
