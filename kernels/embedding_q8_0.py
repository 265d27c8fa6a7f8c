# Q8_0 embedding lookup: gather one int8 row and its fp16 block scales per token, dequantize in float32. One program
# per token, the row in BLOCK_D chunks; bandwidth-bound for any D that is a multiple of 32 (SmolLM2: 576). Ids are
# trusted: an id outside [0, V) reads out of bounds.
import torch
import triton
import triton.language as tl

QK = 32  # Q8_0 block length: one scale per 32 quants (ggml's QK8_0)


@triton.jit
def embedding_q8_0_kernel(
    # pointers
    ids_ptr, qs_ptr, scales_ptr, out_ptr,
    # sizes
    D, stride_qs, stride_scales, stride_out,
    # meta-parameters
    QK: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0)
    row = tl.load(ids_ptr + tok).to(tl.int64)  # int64: V * D can pass 2**31 for big tables
    for start in range(0, D, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        mask = cols < D
        q = tl.load(qs_ptr + row * stride_qs + cols, mask=mask, other=0).to(tl.float32)
        s = tl.load(scales_ptr + row * stride_scales + cols // QK, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + tok * stride_out + cols, (s * q).to(out_ptr.dtype.element_ty), mask=mask)


def embedding_q8_0(ids: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """out[..., j] = scales[ids, j // 32] * qs[ids, j]; qs int8 (V, D), scales fp16 (V, D // 32) -> ids.shape + (D,)."""
    assert ids.dtype in (torch.int32, torch.int64), ids.dtype
    assert qs.dtype == torch.int8 and qs.dim() == 2, (qs.dtype, qs.shape)
    V, D = qs.shape
    assert D % QK == 0 and scales.shape == (V, D // QK), (qs.shape, scales.shape)
    flat = ids.reshape(-1).contiguous()  # (M,)
    qs = qs if qs.stride(-1) == 1 else qs.contiguous()
    scales = scales if scales.stride(-1) == 1 else scales.contiguous()
    M = flat.numel()
    out = torch.empty((M, D), dtype=out_dtype, device=qs.device)
    embedding_q8_0_kernel[(M,)](flat, qs, scales, out, D, qs.stride(0), scales.stride(0), out.stride(0),
                                QK=QK, BLOCK_D=256, num_warps=2)
    return out.reshape(*ids.shape, D)
