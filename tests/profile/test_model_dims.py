"""The SmolLM2 dimensions the op specs are written against (autokernel/ops/smollm2.py) are the embedded model's:
read from the GGUF's own metadata (no weights loaded), so a spec cannot drift from the model it describes."""
import pytest

from autokernel.engine import gguf_model
from autokernel.ops import get, smollm2


@pytest.fixture(scope="module")
def config():
    from autokernel.engine import gguf_file
    path = gguf_model.embedded_model_path()
    return gguf_model._config(gguf_file.read(path), path)


def test_declared_dimensions_are_the_embedded_models(config):
    assert (smollm2.HIDDEN, smollm2.FFN, smollm2.N_HEAD, smollm2.N_HEAD_KV, smollm2.HEAD_DIM, smollm2.VOCAB,
            smollm2.ROPE_THETA, smollm2.CONTEXT, smollm2.N_LAYERS) == (
        config.hidden, config.ffn, config.n_heads, config.n_kv_heads, config.head_dim, config.vocab,
        config.rope_theta, config.context_length, config.n_layers)
    assert smollm2.KV == config.n_kv_heads * config.head_dim


def test_the_specs_model_shapes_use_them():
    assert {s["N"] for s in get("rmsnorm").model_shapes} == {smollm2.HIDDEN}
    assert {s["N"] for s in get("silu_mul").model_shapes} == {smollm2.FFN}
    assert {(s["Hq"], s["Hkv"], s["D"]) for s in get("attention").model_shapes} == {
        (smollm2.N_HEAD, smollm2.N_HEAD_KV, smollm2.HEAD_DIM)}
    assert {s["V"] for s in get("lm_head").model_shapes} == {smollm2.VOCAB}
    assert {(s["N"], s["K"]) for s in get("matmul_q4_1").model_shapes} >= {
        (smollm2.KV, smollm2.HIDDEN), (smollm2.FFN, smollm2.HIDDEN)}
