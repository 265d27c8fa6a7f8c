"""GGUF parsing: the embedded model's real metadata, quantized layouts, and every bad-input case."""
import subprocess
import sys

import numpy as np
import pytest
import tiny_gguf
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, quants

from autokernel.engine.gguf_model import Q4_1, Q8_0, embedded_model_path, load
from autokernel.errors import UserError


@pytest.fixture(scope="module")
def smollm():
    return load(weights="quant")


def test_embedded_model_config(smollm):
    c = smollm.config
    assert (c.n_layers, c.hidden, c.ffn, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab) == \
        (30, 576, 1536, 9, 3, 64, 49152)
    assert c.rope_theta == 100000.0
    assert isinstance(smollm.tensors["blk.0.attn_q.weight"], Q4_1)
    assert isinstance(smollm.tensors["token_embd.weight"], Q8_0)
    assert smollm.embedding_float.shape == (49152, 576)


def test_q4_1_split_matches_gguf_dequantize(smollm):
    """Our planar Q4_1 layout, dequantized by hand, equals the gguf package's own dequantization."""
    r = GGUFReader(str(embedded_model_path()))
    t = next(t for t in r.tensors if t.name == "blk.3.ffn_down.weight")
    want = torch.from_numpy(np.array(quants.dequantize(t.data, t.tensor_type)))
    q = smollm.tensors["blk.3.ffn_down.weight"]
    k = torch.arange(q.shape[1])
    byte = q.qs[:, (k // 32) * 16 + k % 16].to(torch.int32)
    nib = torch.where(k % 32 < 16, byte & 15, byte >> 4)
    got = q.d[:, k // 32].float() * nib + q.m[:, k // 32].float()
    assert torch.equal(got, want)


def test_q8_0_split_matches_gguf_dequantize(smollm):
    e = smollm.tensors["token_embd.weight"]
    got = e.scales.float().repeat_interleave(32, dim=1) * e.qs.float()
    assert torch.equal(got, smollm.embedding_float)


def test_our_parser_reads_what_the_gguf_package_reads(tiny_model):
    """autokernel/engine/gguf_file.py against gguf.GGUFReader, on the embedded model and a tiny one: every field
    (the reader's own GGUF.* pseudo-fields aside) and every tensor's name, type, shape and bytes."""
    from autokernel.engine import gguf_file
    for path in (embedded_model_path(), tiny_model):
        ours, theirs = gguf_file.read(path), GGUFReader(str(path))
        want = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
        assert ours.fields.keys() == want.keys()
        for k, v in want.items():
            assert ours.fields[k] == v or np.allclose(np.asarray(ours.fields[k], float), np.asarray(v, float)), k
        assert [(t.name, t.tensor_type, t.shape) for t in ours.tensors] == \
            [(t.name, t.tensor_type, tuple(int(x) for x in t.shape)) for t in theirs.tensors]
        for a, b in zip(ours.tensors, theirs.tensors):
            assert np.array_equal(a.data.reshape(-1), np.asarray(b.data).view(np.uint8).reshape(-1)), a.name


def test_tiny_llama_loads_in_both_modes(tiny_model):
    q = load(tiny_model, weights="quant")
    d = load(tiny_model, weights="dequant")
    assert q.config.n_layers == 2 and q.config.head_dim == 16
    assert isinstance(q.tensors["blk.1.ffn_up.weight"], Q4_1)
    assert d.tensors["blk.1.ffn_up.weight"].shape == (128, 64)


def test_missing_file():
    with pytest.raises(UserError, match="no such model file"):
        load("/nonexistent/model.gguf")


def test_corrupt_file(tmp_path, tiny_model):
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(tiny_model.read_bytes()[:5000])  # truncated mid-metadata
    with pytest.raises(UserError, match="not a readable GGUF"):
        load(bad)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 100)
    with pytest.raises(UserError, match="not a readable GGUF"):
        load(junk)


def test_non_llama_architecture(tmp_path):
    p = tiny_gguf.write(tmp_path / "gpt2.gguf", arch="gpt2", embed_type=Q.F32)  # F32: no slow quantizing here
    with pytest.raises(UserError, match="architecture is 'gpt2'"):
        load(p)


def test_unsupported_quantization(tmp_path):
    p = tiny_gguf.write(tmp_path / "q5.gguf", linear_type=Q.Q5_0, embed_type=Q.F32)
    with pytest.raises(UserError, match="type Q5_0"):
        load(p)


def test_cli_bad_model_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"\0" * 64)
    r = subprocess.run([sys.executable, "-c", "from autokernel.cli import main; main()", "generate", "hi",
                        "--model", str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert str(bad) in r.stderr and len(r.stderr.strip().splitlines()) == 1
