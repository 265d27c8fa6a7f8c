"""The live engine: a Llama-architecture forward whose every hot op is a slot filled by a Triton kernel."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autokernel import device
from autokernel.engine.gguf_model import GGUFModel, load
from autokernel.engine.model import Llama
from autokernel.engine.optable import OpTable
from autokernel.engine.tokenizer import Tokenizer


@dataclass
class Engine:
    model: Llama
    tokenizer: Tokenizer
    gguf: GGUFModel

    def encode_prompt(self, prompt: str, chat: bool = True) -> list[int]:
        return self.tokenizer.encode(self.tokenizer.chat(prompt) if chat else prompt)


def open_engine(model_path: str | Path | None = None, kernels: str = "triton", weights: str = "quant",
                overrides: dict | None = None, dev: str | None = None) -> Engine:
    """Load a GGUF (the embedded SmolLM2 by default) onto our kernels. `overrides` swaps single ops (sandbox only)."""
    dev = dev or ("cuda" if device.is_cuda() else "cpu")
    dtype = device.default_dtype()
    g = load(model_path, weights=weights, dtype=dtype, device=dev)
    tok = Tokenizer(g.tokenizer_fields, source=str(g.path))
    return Engine(Llama(g, OpTable(kernels, overrides), dtype), tok, g)
