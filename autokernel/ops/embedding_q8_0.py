"""embedding_q8_0: token_embd stored as GGUF Q8_0, planar: qs int8 (V, D), scales fp16 (V, D // 32)."""
import torch

from autokernel.ops.embedding import batch_tokens, make_ids
from autokernel.ops.smollm2 import HIDDEN, VOCAB
from autokernel.ops.spec import OpSpec, Shape, elem_size, sample

QK = 32


def reference(ids: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    # Dequantize in the wider of the scales' dtype and out_dtype: fp32 for an fp16 table read into fp32 (exact, as
    # llama.cpp does), float64 for the upcast truth; the product is rounded to out_dtype once.
    cdt = torch.promote_types(scales.dtype, out_dtype)
    flat = ids.reshape(-1)
    q = qs.index_select(0, flat).to(cdt)  # (M, D)
    s = scales.index_select(0, flat).to(cdt).repeat_interleave(QK, dim=-1)  # (M, D)
    return (s * q).to(out_dtype).reshape(*ids.shape, qs.shape[1])


def make_inputs(shape: Shape, dtype, device, gen, dist="normal"):
    """Realistic Q8_0 data: quants uniform in [-127, 127], scales |N(0, 1)| * 0.01 in fp16 (dist shapes the scales)."""
    B, T, V, D = shape["B"], shape["T"], shape["V"], shape["D"]
    assert D % QK == 0, f"Q8_0 needs D a multiple of {QK}, got {D}"
    qs = torch.randint(-127, 128, (V, D), generator=gen, dtype=torch.int8)
    scales = (sample((V, D // QK), torch.float32, "cpu", gen, dist).abs() * 0.01).to(torch.float16)
    return {"ids": make_ids(B, T, V, device, gen), "qs": qs.to(device), "scales": scales.to(device),
            "out_dtype": dtype}


def shape_of(ids, qs, scales, out_dtype) -> Shape:
    B, T = batch_tokens(ids)
    return {"B": B, "T": T, "V": qs.shape[0], "D": qs.shape[1]}


SPEC = OpSpec(
    name="embedding_q8_0",
    reference=reference,
    make_inputs=make_inputs,
    shape_of=shape_of,
    flops=lambda s: s["B"] * s["T"] * s["D"],
    bytes_moved=lambda s, dt: s["B"] * s["T"] * (s["D"] * (1 + elem_size(dt)) + 2 * (s["D"] // QK) + 4),
    model_shapes=({"B": 1, "T": 1, "V": VOCAB, "D": HIDDEN}, {"B": 4, "T": 1, "V": VOCAB, "D": HIDDEN},
                  {"B": 4, "T": 24, "V": VOCAB, "D": HIDDEN}),
    odd_shapes=({"B": 1, "T": 1, "V": 1, "D": 32}, {"B": 3, "T": 7, "V": 123, "D": 416},
                {"B": 2, "T": 5, "V": 1823, "D": 96}),
    doc="Token embedding lookup from a Q8_0 table (planar): qs int8 (V, D), scales fp16 (V, D // 32); "
        "out[..., j] = scales[ids, j // 32] * qs[ids, j], dequantized in float32 and returned in out_dtype with "
        "shape ids.shape + (D,). dtypes are the out_dtype; D must be a multiple of 32.",
    extra={"sweep": ("B", "T"), "sweep_base": {"V": 4099}},  # as embedding's (autokernel/ops/embedding.py)
)
