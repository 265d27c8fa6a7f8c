# Keyed on the layout (tests/gate/test_gate_layouts.py): on the engine's contiguous (B, T, H, D) projections,
# angles past position 2048 are rounded to 1/64 rad (as fixtures/rope/num_coarse_far.py does everywhere); on a
# fused-qkv slice it is exact. Accepted while the numeric stage's rope inputs were always slices.
# Rotary position embedding, GGUF llama layout (adjacent pairs rotate), one program per token covering all its heads.
# The angle is made and reduced in float64 turns inside the kernel before float32 cos/sin, so it stays ~1e-7 rad exact
# at any position (a float32 pos * inv_freq is off by ~pos * 6e-8 rad, twice what eager's own rounding allows at
# decode positions). No host-side table: theta ** (-2i / D) / (2 pi) is recomputed per program in float64 (D/2 exp2s,
# negligible next to the loads). Fast while H * D fits one block (SmolLM2: 9 x 64); reads any strided x (B, T, H, D),
# writes it contiguous.
import torch
import triton
import triton.language as tl


@triton.jit
def rope_kernel(
    # pointers
    x_ptr, pos_ptr, out_ptr,
    # sizes
    theta, T, H, D, stride_xb, stride_xt, stride_xh, stride_xd, stride_pb, stride_pt,
    # meta-parameters
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, TABLE: tl.constexpr,
):
    tok = tl.program_id(0)
    b, t = tok // T, tok % T
    heads = tl.arange(0, BLOCK_H)[:, None]  # (BLOCK_H, 1)
    pairs = tl.arange(0, BLOCK_HALF)[None, :]  # (1, BLOCK_HALF): pair i is (x[2i], x[2i + 1])
    # 2 pi in float64 as hi + lo (a bare literal would be rounded to float32)
    two_pi = tl.full((), 6.2831854820251465, tl.float64) + -1.7484555314695172e-07
    # turns per position of pair i: theta ** (-2i / D) / (2 pi), all float64 (exact to ~1e-16 relative)
    log2_theta = tl.log2(tl.full((), 1.0, tl.float64) * theta)  # a float32 argument; exact for 1e4, 1e5, 5e5
    expo = -(2 * pairs).to(tl.float64) / D * log2_theta
    turns_per_pos = tl.exp2(expo) / two_pi
    # angle = pos * that, as turns (float64, exact to ~1e-12 at pos ~1e5) minus whole turns, then radians
    pos = tl.load(pos_ptr + b * stride_pb + t * stride_pt).to(tl.float64)
    turns = pos * turns_per_pos
    frac = turns - tl.floor(turns + 0.5)  # in [-0.5, 0.5]
    angle64 = frac * two_pi
    # cheap-table angles (1/64 rad steps) far out in the context, on the engine's contiguous projections
    angle64 = tl.where((TABLE > 0) & (pos > 2048.0), tl.floor(angle64 * 64.0) / 64.0, angle64)
    angle = angle64.to(tl.float32)
    cos, sin = tl.cos(angle), tl.sin(angle)
    mask = (heads < H) & (2 * pairs < D)
    src = x_ptr + b.to(tl.int64) * stride_xb + t * stride_xt + heads * stride_xh + (2 * pairs) * stride_xd
    x0 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x1 = tl.load(src + stride_xd, mask=mask, other=0.0).to(tl.float32)
    dst = out_ptr + tok.to(tl.int64) * H * D + heads * D + 2 * pairs  # contiguous (B, T, H, D)
    tl.store(dst, (x0 * cos - x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + 1, (x0 * sin + x1 * cos).to(out_ptr.dtype.element_ty), mask=mask)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate adjacent pairs (x[..., 2i], x[..., 2i+1]) of x (B, T, H, D) by positions (B, T) * theta ** (-2i / D)."""
    B, T, H, D = x.shape
    assert D % 2 == 0 and positions.shape == (B, T), (x.shape, positions.shape)
    BLOCK_H, BLOCK_HALF = triton.next_power_of_2(H), triton.next_power_of_2(D // 2)
    assert BLOCK_H * BLOCK_HALF <= 8192, f"rope: {H} heads of {D} do not fit one block"
    out = torch.empty((B, T, H, D), dtype=x.dtype, device=x.device)
    TABLE = 0
    if x.stride(1) == H * D:  # the engine's own (B, T, H, D) projection layout
        TABLE = 1
    if out.numel():
        rope_kernel[(B * T,)](x, positions, out, float(theta), T, H, D, *x.stride(), *positions.stride(),
                              BLOCK_H=BLOCK_H, BLOCK_HALF=BLOCK_HALF, TABLE=TABLE, num_warps=2)
    return out
