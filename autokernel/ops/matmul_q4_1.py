"""matmul_q4_1: y = x @ W.T with W stored as GGUF Q4_1, split into planar qs / d / m arrays.

Q4_1 packs 32 weights per block: 16 bytes of 4-bit codes (weight j of the block is the low nibble of byte j for
j < 16, the high nibble of byte j - 16 otherwise), an fp16 scale d and an fp16 min m; W = d * code + m.
"""
import torch

from autokernel.ops.rounding import dot_rounding
from autokernel.ops.smollm2 import FFN, HIDDEN, KV
from autokernel.ops.spec import OpSpec, Shape, elem_size, sample

QK = 32  # weights per Q4_1 block


def dequantize(qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """(N, K // 2) codes, (N, K // 32) scales and mins -> W (N, K) in d's dtype."""
    N = qs.shape[0]
    blocks = qs.reshape(N, -1, QK // 2)  # (N, K // 32, 16)
    codes = torch.cat([blocks & 0xF, blocks >> 4], dim=-1)  # (N, K // 32, 32)
    w = d[..., None] * codes.to(d.dtype) + m[..., None]
    return w.reshape(N, -1)


def reference(x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    # Dequantize in the wider of x's and d's dtypes (float64 for the upcast copy): an fp32 model dequantizes
    # in fp32 as llama.cpp does, so the tolerance derived from this eager error stays tight for fp32.
    dt = torch.promote_types(x.dtype, d.dtype)
    return x @ dequantize(qs, d.to(dt), m.to(dt)).to(x.dtype).T


def make_inputs(shape: Shape, dtype, device, gen, dist="normal"):
    """Codes uniform in 0..15, d ~ |N(0, 1)| * 0.02 and m ~ -7.5 d: what quantizing N(0, ~0.05) weights gives."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    assert K % QK == 0, f"Q4_1 needs K a multiple of {QK}, got {K}"
    d = torch.randn((N, K // QK), generator=gen).abs() * 0.02
    m = -d * (7.5 + 0.5 * torch.randn((N, K // QK), generator=gen))
    qs = torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.uint8)
    return {"x": sample((M, K), dtype, device, gen, dist), "qs": qs.to(device),
            "d": d.to(dtype=torch.float16, device=device), "m": m.to(dtype=torch.float16, device=device)}


def rounding(x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The float32 accumulation floor of x @ W.T (autokernel/ops/rounding.py), W dequantized exactly (float64)."""
    return dot_rounding(x, dequantize(qs, d, m))


def shape_of(x, qs, d, m) -> Shape:
    return {"M": x.shape[0], "N": qs.shape[0], "K": x.shape[1]}


def _bytes(s: Shape, dt) -> int:
    M, N, K = s["M"], s["N"], s["K"]
    weight = N * K // 2 + 2 * N * (K // QK) * 2  # codes + fp16 d and m
    return (M * K + M * N) * elem_size(dt) + weight


SPEC = OpSpec(
    name="matmul_q4_1",
    reference=reference,
    make_inputs=make_inputs,
    shape_of=shape_of,
    flops=lambda s: 2 * s["M"] * s["N"] * s["K"],
    bytes_moved=_bytes,
    # decode (M = 1, 4) through every projection; prefill of a 96-token batch through gate/up
    model_shapes=({"M": 1, "N": HIDDEN, "K": HIDDEN}, {"M": 1, "N": KV, "K": HIDDEN},
                  {"M": 1, "N": FFN, "K": HIDDEN}, {"M": 1, "N": HIDDEN, "K": FFN},
                  {"M": 4, "N": HIDDEN, "K": FFN}, {"M": 96, "N": FFN, "K": HIDDEN}),
    odd_shapes=({"M": 3, "N": 123, "K": 416}, {"M": 1, "N": 6, "K": 32}, {"M": 37, "N": 781, "K": 224}),
    doc="y = x @ W.T for x (M, K) and a Q4_1-quantized W (N, K) given as planar arrays: qs uint8 (N, K // 2), "
        "d float16 (N, K // 32), m float16 (N, K // 32). For column k, block b = k // 32 and j = k % 32: "
        "byte = qs[n, b * 16 + j % 16], code = byte & 0xF if j < 16 else byte >> 4, W[n, k] = d[n, b] * code + "
        "m[n, b]. y has x's dtype; accumulate in float32.",
    rounding=rounding,
)
