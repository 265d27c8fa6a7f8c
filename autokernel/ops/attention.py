"""attention: causal prefill attention with grouped-query heads over left-padded rows (SmolLM2-135M: 9 query heads
share 3 kv heads, head dim 64)."""
import torch

from autokernel.ops.rounding import U32
from autokernel.ops.smollm2 import HEAD_DIM, N_HEAD, N_HEAD_KV
from autokernel.ops.spec import OpSpec, Shape, draw, elem_size, sample

# The softmax scale: D ** -0.5 in llama, other values elsewhere (Gemma's query_pre_attn_scalar, muP's 1 / D): each case
# draws D ** -0.5 times 1 or a factor log-uniform over 0.5..2, so a kernel with the scale baked in is wrong on most.
SCALE_FACTORS = (0.5, 2.0)


def draw_scale(D: int, gen) -> float:
    return D ** -0.5 * draw(gen, *SCALE_FACTORS, (1.0,))


def _visible(T: int, kv_start: torch.Tensor, device) -> torch.Tensor:
    """(B, 1, T, T): key j visible to query i iff kv_start[b] <= j <= i."""
    pos = torch.arange(T, device=device)
    visible = (pos[None, :] <= pos[:, None]) & (pos[None, None, :] >= kv_start.to(device)[:, None, None])
    return visible[:, None]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_start: torch.Tensor,
              scale: float) -> torch.Tensor:
    B, Hq, T, D = q.shape
    group = Hq // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (B, Hq, T, D)
    v = v.repeat_interleave(group, dim=1)
    visible = _visible(T, kv_start, q.device)
    s = (q @ k.transpose(-1, -2)) * scale
    p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)
    p = p.masked_fill(~visible.any(-1, keepdim=True), 0.0)  # pad rows see no key: output 0, not NaN
    return p @ v


def softmax_rounding(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """First-order error, per output element, of softmax(q k^T * scale) v computed with float32 accumulation, for
    float64 q (..., Tq, D), k and v (..., L, D) and `visible` (..., Tq, L) (the spec's `rounding`, autokernel/ops/
    tolerance.py). Each logit l_i is a length-D dot product: off by e_i = (sqrt(D) |scale| sum_d |q_d k_id| + 2 |l_i|) u
    (the sum's rounding as a random walk, then rounding the logit and subtracting the row's max). Softmax turns logit
    errors d into output errors sum_i p_i (d_i - dbar) (v_i - out), at most sum_i p_i (e_i + ebar)(|v_i| + |out|)
    with ebar = sum_j p_j e_j; the weighted sum over L keys adds sqrt(L) u sum_i p_i |v_i|. Where logits run into the
    hundreds (|q| |k| large) this is hundreds of ulps of the output, and eager's own error, one rounding order among
    many, can be a few: the gate then held the project's own kernel to a bound a different order cannot meet."""
    D, L = q.shape[-1], k.shape[-2]
    kt = k.transpose(-1, -2)
    logits = (q @ kt) * scale
    e = ((D ** 0.5) * abs(scale) * (q.abs() @ kt.abs()) + 2 * logits.abs()) * U32
    p = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    p = p.masked_fill(~visible.any(-1, keepdim=True), 0.0)  # rows with no visible key: output exactly 0
    e = e.masked_fill(~visible, 0.0)
    w = p * (e + (p * e).sum(-1, keepdim=True))
    out = p @ v
    return w @ v.abs() + w.sum(-1, keepdim=True) * out.abs() + (L ** 0.5) * U32 * (p @ v.abs())


def rounding(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_start: torch.Tensor,
             scale: float) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    return softmax_rounding(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1),
                            _visible(q.shape[2], kv_start, q.device), scale)


def make_inputs(shape: Shape, dtype, device, gen, dist="normal"):
    """q, k, v as the engine makes them: (B, T, H, D) projections viewed as (B, H, T, D), so not contiguous; left
    padding as draw_padding makes it."""
    B, Hq, Hkv, T, D = shape["B"], shape["Hq"], shape["Hkv"], shape["T"], shape["D"]
    q = sample((B, T, Hq, D), dtype, device, gen, dist).transpose(1, 2)
    k = sample((B, T, Hkv, D), dtype, device, gen, dist).transpose(1, 2)
    v = sample((B, T, Hkv, D), dtype, device, gen, dist).transpose(1, 2)
    kv_start = draw_padding(B, T, gen, wholly=False)
    return {"q": q, "k": k, "v": v, "kv_start": kv_start.to(device), "scale": draw_scale(D, gen)}


def draw_padding(B: int, L: int, gen: torch.Generator, wholly: bool) -> torch.Tensor:
    """kv_start (B,) int32 of a left-padded batch of L positions, as a short prompt batched with a long one makes
    it: one row unpadded (the longest prompt), one by at least one, from four rows one padded in all but its last
    position, the others anywhere in [0, L); which row is which is drawn (a kernel that skipped the padding load
    for row 0, or masked padding only in the first half of the context, was exact when row 0 was always the
    unpadded one and padding stopped at half). With `wholly`, one case in two pads a row entirely (decode: its
    output is 0)."""
    kv_start = torch.randint(0, L, (B,), generator=gen, dtype=torch.int32)
    rows = torch.randperm(B, generator=gen).tolist()
    kv_start[rows[0]] = 0
    if B > 3:  # not at three rows: two of them would then have (next to) no context to check precision on
        kv_start[rows[1]] = L - 1
    if B > 1 and L > 1:
        kv_start[rows[-1]] = max(int(kv_start[rows[-1]]), 1)
    if wholly and B > 1 and torch.rand((), generator=gen) < 0.5:
        kv_start[rows[-1]] = L
    return kv_start


def shape_of(q, k, v, kv_start, scale) -> Shape:
    B, Hq, T, D = q.shape
    return {"B": B, "Hq": Hq, "Hkv": k.shape[1], "T": T, "D": D}


def _flops(s: Shape) -> int:  # q k^T and p v over the causal half (pad rows counted as if real)
    return 4 * s["B"] * s["Hq"] * (s["T"] * (s["T"] + 1) // 2) * s["D"]


SPEC = OpSpec(
    name="attention",
    reference=reference,
    rounding=rounding,
    make_inputs=make_inputs,
    shape_of=shape_of,
    flops=_flops,
    bytes_moved=lambda s, dt: (2 * s["Hq"] + 2 * s["Hkv"]) * s["B"] * s["T"] * s["D"] * elem_size(dt),
    model_shapes=({"B": 1, "Hq": N_HEAD, "Hkv": N_HEAD_KV, "T": 64, "D": HEAD_DIM},
                  {"B": 4, "Hq": N_HEAD, "Hkv": N_HEAD_KV, "T": 24, "D": HEAD_DIM}),
    odd_shapes=({"B": 3, "Hq": 6, "Hkv": 2, "T": 77, "D": 48}, {"B": 2, "Hq": 4, "Hkv": 1, "T": 1, "D": 16},
                {"B": 2, "Hq": 3, "Hkv": 3, "T": 130, "D": 64}),
    # the batch is swept past the traced shape's budget on one group of query heads and a secret 3-24 tokens, then 3
    # (autokernel/gate/schedule.py cheap_bases): batches of 5+ prompts reached only B = 4 before, and rows past the
    # group size ignoring their left padding were exact
    extra={"sweep": ("B",), "cheap_base": [{"T": (3, 24), "Hq": 3, "Hkv": 1}, {"T": 3, "Hq": 3, "Hkv": 1}]},
    doc="Causal prefill attention with grouped-query heads: q (B, Hq, T, D), k and v (B, Hkv, T, D), possibly "
        "non-contiguous views; kv_start int32 (B,) marks left padding. Query head h reads kv head h // (Hq // Hkv); "
        "key j is visible to query i iff kv_start[b] <= j <= i. out = softmax(q k^T * scale over visible keys) v, "
        "(B, Hq, T, D) in q's dtype; query rows with no visible key (i < kv_start[b]) are exactly 0. Accumulate in "
        "float32 with an online softmax.",
)
