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


@pytest.mark.parametrize("template, timeout_s", [("{{ 'x' * 999999999999 }}", 20.0),
                                                 ("{% for a in range(99999) %}{% for b in range(99999) %}"
                                                  "{% for c in range(99999) %}{% endfor %}{% endfor %}{% endfor %}",
                                                  3.0)])
def test_a_hostile_chat_template_is_one_line_not_a_hang(tok, monkeypatch, template, timeout_s):
    """A checkout may name its own model (policies.yaml target.model), whose chat template is its text: jinja2's
    sandbox keeps code out, not work, and rendering it in autokernel's own process was a MemoryError traceback or a
    hang. It renders in a child bounded in time and memory; past them it is bad input (exit 2)."""
    from autokernel.engine import tokenizer
    from autokernel.errors import UserError
    monkeypatch.setattr(tokenizer, "RENDER_TIMEOUT_S", timeout_s)
    monkeypatch.setattr(tok, "chat_template", template)
    with pytest.raises(UserError, match="chat template"):
        tok.chat("Hi?")
