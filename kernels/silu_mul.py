# SwiGLU's gate: silu(gate) * up, elementwise over flat BLOCK-sized chunks. Bandwidth-bound at any size (SmolLM2:
# (M, 1536)); non-contiguous inputs (e.g. the halves of a fused gate_up output) are copied to contiguous first.
import torch
import triton
import triton.language as tl


@triton.jit
def silu_mul_kernel(
    # pointers
    gate_ptr, up_ptr, out_ptr,
    # sizes
    n_elements,
    # meta-parameters
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u  # exp overflows to inf for g < -88: g / inf = -0, the right limit
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up = gate * sigmoid(gate) * up, elementwise; gate and up (..., N) of one shape and dtype."""
    assert gate.shape == up.shape and gate.dtype == up.dtype, (gate.shape, up.shape, gate.dtype, up.dtype)
    g, u = gate.contiguous(), up.contiguous()  # no-ops on the engine's tensors; halves of a fused gate_up get copied
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    n = out.numel()
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
    silu_mul_kernel[grid](g, u, out, n, BLOCK=1024, num_warps=4)
    return out
