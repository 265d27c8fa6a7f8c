"""Tokenizer rebuilt from GGUF metadata: round trips, special tokens as single ids, the chat template."""
import pytest

from autokernel.engine.gguf_model import load
from autokernel.engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(load(weights="quant").tokenizer_fields)


@pytest.mark.parametrize("text", ["Hello world", "What is the capital of France?", "  two  spaces\n\ttab",
                                  "digits 1234567890 and café, naïve 東京 🙂", ""])
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_known_ids(tok):
    # SmolLM2's own tokenizer: "Hello" = 19556, " world" = 905; digits are split one by one
    assert tok.encode("Hello world") == [19556, 905]
    assert len(tok.encode("2024")) == 4


def test_special_tokens_are_single_ids(tok):
    for s in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        ids = tok.encode(s)
        assert len(ids) == 1 and ids[0] == tok.id_of(s)
    assert tok.eos_id == tok.id_of("<|im_end|>") == 2
    assert tok.stop_ids >= {2}


def test_chat_template(tok):
    s = tok.chat("Hi?")
    assert s.startswith("<|im_start|>system\n") and s.endswith("<|im_start|>user\nHi?<|im_end|>\n"
                                                                 "<|im_start|>assistant\n")
    ids = tok.encode(s)
    assert ids[0] == tok.id_of("<|im_start|>") and ids.count(tok.id_of("<|im_end|>")) == 2
    assert tok.decode(ids, skip_special=False) == s
