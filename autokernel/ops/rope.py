"""rope: rotary position embedding of q (H=9) or k (H=3) heads, GGUF llama layout (adjacent pairs rotate)."""
import math

import torch

from autokernel.ops.attention import draw_padding
from autokernel.ops.smollm2 import CONTEXT, HEAD_DIM, N_HEAD, N_HEAD_KV
from autokernel.ops.smollm2 import ROPE_THETA as THETA
from autokernel.ops.spec import OpSpec, Shape, draw, elem_size, sample

# rope's freq_base in production: Llama 2 10000, SmolLM2 100000, Llama 3 500000, Qwen2 1000000. Each case draws one
# of these or an integer log-uniform over 1e4..1e6 (every released theta is an integer, and the launcher's float32
# argument holds integers to 2^24 exactly): a kernel with theta baked in is wrong on most cases.
THETAS = (10000.0, THETA, 500000.0, 1000000.0)


def reference(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    # Angles, cos and sin in float32 at least (as llama.cpp and HF do; a bf16 angle at position 1000 is off by ~4 rad),
    # float64 for the upcast truth; the rotated values are rounded to x's dtype once.
    cdt = torch.promote_types(x.dtype, torch.float32)
    D = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=cdt, device=x.device) / D)  # (D/2,)
    angle = positions.to(cdt)[:, :, None, None] * inv_freq  # (B, T, 1, D/2)
    cos, sin = angle.cos(), angle.sin()
    x0, x1 = x[..., 0::2].to(cdt), x[..., 1::2].to(cdt)  # (B, T, H, D/2) each
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)  # re-interleave the pairs
    return out.to(x.dtype)


def make_positions(B: int, T: int, device, gen) -> torch.Tensor:
    """(B, T) int32 positions of a left-padded batch: row b starts at a past length after pad_b pads.

    Past lengths are log-uniform over the whole context (near and far positions alike: a kernel with coarse angles
    only far out is wrong there), and with more than one row a row drawn at random (not always the last: positions
    past 8,180 losing 4,096 in every row but the last were exact) ends at the context's last position."""
    hi = max(CONTEXT - T, 0)
    start = (torch.exp(torch.rand((B, 1), generator=gen) * math.log(hi + 1)) - 1).long().clamp(0, hi)
    if B > 1:
        start[int(torch.randint(0, B, (1,), generator=gen))] = hi
    pad = draw_padding(B, T, gen, wholly=False).long()[:, None]  # anywhere in [0, T), as a short prompt batched
    # with a long one pads (it stopped at T // 2: a kernel that recomputed positions from the row's middle was exact)
    pos = (torch.arange(T)[None, :] - pad).clamp(min=0) + start
    return pos.to(dtype=torch.int32, device=device)


def make_inputs(shape: Shape, dtype, device, gen, dist="normal"):
    """x in one of two layouts, drawn per case from the (secret) generator: contiguous (B, T, H, D), as the engine
    hands over its q and k projections (autokernel/engine/model.py), or the q (or k) slice of a fused qkv
    activation, a strided view as fused-projection engines pass it. A kernel keyed on the layout (a stride, or
    contiguity) is checked in both, at near and far positions alike."""
    B, T, H, D = shape["B"], shape["T"], shape["H"], shape["D"]
    fused = bool(torch.randint(0, 2, (1,), generator=gen))
    x = sample((B, T, H + 2, D), dtype, device, gen, dist)[:, :, 1:H + 1, :] if fused else \
        sample((B, T, H, D), dtype, device, gen, dist)
    return {"x": x, "positions": make_positions(B, T, device, gen),  # theta drawn last: the tensors stay the seed's
            "theta": float(round(draw(gen, THETAS[0], THETAS[-1], THETAS)))}


def shape_of(x, positions, theta) -> Shape:
    B, T, H, D = x.shape
    return {"B": B, "T": T, "H": H, "D": D}


SPEC = OpSpec(
    name="rope",
    reference=reference,
    make_inputs=make_inputs,
    shape_of=shape_of,
    flops=lambda s: 3 * s["B"] * s["T"] * s["H"] * s["D"],  # 4 mul + 2 add per pair
    bytes_moved=lambda s, dt: s["B"] * s["T"] * (2 * s["H"] * s["D"] * elem_size(dt) + 4),
    model_shapes=({"B": 1, "T": 1, "H": N_HEAD, "D": HEAD_DIM}, {"B": 4, "T": 1, "H": N_HEAD, "D": HEAD_DIM},
                  {"B": 4, "T": 24, "H": N_HEAD, "D": HEAD_DIM}, {"B": 4, "T": 24, "H": N_HEAD_KV, "D": HEAD_DIM}),
    odd_shapes=({"B": 1, "T": 1, "H": 1, "D": 2}, {"B": 3, "T": 7, "H": 5, "D": 42},
                {"B": 2, "T": 43, "H": 3, "D": 6}),
    doc="Rotary position embedding, GGUF llama layout: x (B, T, H, D), possibly a strided view, positions (B, T) "
        "int32 (left-padded batches: rows differ), theta the model's base (SmolLM2 100000.0, Llama 3 500000.0; any "
        "value from 1e4 to 1e6). Adjacent pairs rotate: with angle = "
        "pos * theta ** (-2i / D), out[..., 2i] = x[2i] cos - x[2i+1] sin, out[..., 2i+1] = x[2i] sin + "
        "x[2i+1] cos. Angles in float32; returns a new contiguous tensor in x's dtype.",
    # the numeric stage sweeps batch and tokens (autokernel/gate/schedule.py); a batch too costly at the traced
    # tokens goes on at a secret 3-24 tokens, then 3, then 1 (rows past the heads count taking the first position's
    # angle were exact at one token)
    extra={"sweep": ("B", "T"), "cheap_base": [{"T": (3, 24)}, {"T": 3}, {"T": 1}]},
)
