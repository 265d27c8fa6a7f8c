"""SmolLM2-135M's dimensions, declared once: the model the specs' `model_shapes` describe (the embedded GGUF the
engine runs by default, autokernel/engine/gguf_model.py). tests/profile/test_model_dims.py checks every value against
that GGUF's metadata, so the specs cannot drift from the model.
"""
HIDDEN = 576  # llama.embedding_length
FFN = 1536  # llama.feed_forward_length: the gate/up projections' width, silu_mul's N
N_HEAD = 9  # llama.attention.head_count
N_HEAD_KV = 3  # llama.attention.head_count_kv: 3 groups of 3 query heads
HEAD_DIM = 64  # llama.rope.dimension_count
KV = N_HEAD_KV * HEAD_DIM  # 192: the k and v projections' width
VOCAB = 49152  # tokenizer.ggml.tokens
ROPE_THETA = 100000.0  # llama.rope.freq_base
CONTEXT = 8192  # llama.context_length: every position the engine can reach
N_LAYERS = 30  # llama.block_count
