"""Write small llama-architecture GGUF files for tests: random weights, the embedded model's tokenizer."""
import functools
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter, quants

from autokernel.engine.gguf_model import embedded_model_path


@functools.lru_cache(maxsize=1)
def tokenizer_fields():
    """The embedded model's tokenizer metadata (autokernel/engine/gguf_file.py; checked against gguf.GGUFReader in
    test_gguf.py)."""
    from autokernel.engine import gguf_file
    return {k: v for k, v in gguf_file.read(embedded_model_path()).fields.items() if k.startswith("tokenizer.")}


def write(path: Path, *, arch="llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, linear_type=Q.Q4_1,
          embed_type=Q.Q8_0, seed=0, tok=None) -> Path:
    rng = np.random.default_rng(seed)
    tok = tok or tokenizer_fields()
    vocab = len(tok["tokenizer.ggml.tokens"])
    w = GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tok["tokenizer.ggml.pre"])
    w.add_token_list(tok["tokenizer.ggml.tokens"])
    w.add_token_types(tok["tokenizer.ggml.token_type"])
    w.add_token_merges(tok["tokenizer.ggml.merges"])
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)

    def add(name, shape, qtype, scale=0.05):
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        if qtype == Q.F32:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, quants.quantize(x, qtype), raw_dtype=qtype)

    hd = hidden // heads
    add("token_embd.weight", (vocab, hidden), embed_type, 1.0)
    add("output_norm.weight", (hidden,), Q.F32, 1.0)
    for i in range(layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (hidden,), Q.F32, 1.0)
        add(p + "ffn_norm.weight", (hidden,), Q.F32, 1.0)
        add(p + "attn_q.weight", (hidden, hidden), linear_type)
        add(p + "attn_k.weight", (kv_heads * hd, hidden), linear_type)
        add(p + "attn_v.weight", (kv_heads * hd, hidden), linear_type)
        add(p + "attn_output.weight", (hidden, hidden), linear_type)
        add(p + "ffn_gate.weight", (ffn, hidden), linear_type)
        add(p + "ffn_up.weight", (ffn, hidden), linear_type)
        add(p + "ffn_down.weight", (hidden, ffn), linear_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
