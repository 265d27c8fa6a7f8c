"""Byte-level BPE tokenizer rebuilt from GGUF metadata (vocab + merges), with special tokens and the chat template."""
from __future__ import annotations

import functools
import json
import subprocess
import sys

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from autokernel.errors import UserError

CONTROL = 3  # GGUF token_type of control tokens (<|im_start|>, <|im_end|>, <|endoftext|>, ...)
# llama.cpp's 'smollm' pre-tokenizer: digits split one by one, then GPT-2 byte-level regex.
PRE_TOKENIZERS = {
    "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
}


class Tokenizer:
    def __init__(self, fields: dict, source: str = "model"):
        if fields.get("tokenizer.ggml.model") != "gpt2":
            raise UserError(f"{source}: tokenizer model {fields.get('tokenizer.ggml.model')!r} is not supported; "
                            "autokernel reads byte-level BPE ('gpt2') tokenizers")
        tokens = list(fields["tokenizer.ggml.tokens"])
        merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
        types = list(fields.get("tokenizer.ggml.token_type", [1] * len(tokens)))
        tok = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
        pre = fields.get("tokenizer.ggml.pre", "gpt2")
        tok.pre_tokenizer = PRE_TOKENIZERS.get(pre, PRE_TOKENIZERS["gpt2"])()
        tok.decoder = decoders.ByteLevel()
        specials = [tokens[i] for i, t in enumerate(types) if t == CONTROL]
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
        self._tok = tok
        self.vocab_size = len(tokens)
        self.bos_id = fields.get("tokenizer.ggml.bos_token_id")
        self.eos_id = int(fields.get("tokenizer.ggml.eos_token_id", 0))
        self.pad_id = int(fields.get("tokenizer.ggml.padding_token_id", self.eos_id))
        im_end = tok.token_to_id("<|im_end|>")
        self.stop_ids = frozenset(i for i in (self.eos_id, im_end) if i is not None)
        self.chat_template = fields.get("tokenizer.chat_template")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def id_of(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def chat(self, prompt: str) -> str:
        """The instruct prompt: the model's own chat template, a user turn, then the assistant's opening."""
        if not self.chat_template:
            return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        return render_chat(str(self.chat_template), prompt)


RENDER_TIMEOUT_S = 20.0  # a chat template renders in milliseconds; the child's start is most of this
RENDER_MEMORY = 1 << 30  # the child's address space (jinja2 and the text)
RENDER_MAX_CHARS = 1 << 20  # the rendered prompt
_RENDER = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({mem}, {mem}))
import jinja2.sandbox
a = json.loads(sys.stdin.read())
env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
out = env.from_string(a["template"]).render(messages=[{{"role": "user", "content": a["prompt"]}}],
                                            add_generation_prompt=True)
sys.stdout.write(json.dumps(out[:{cap} + 1]))
"""


@functools.lru_cache(maxsize=256)
def render_chat(template: str, prompt: str) -> str:
    """The chat template rendered for one user turn, in a child process bounded in time and memory: the template is
    the model file's text, and a checkout may name its own model (policies.yaml target.model); jinja2's sandbox
    keeps code out, not work (`'x' * 10**12` was a MemoryError traceback, three nested loops a hang). Where no
    process may start (inside a sandboxed job, which is bounded itself) it renders in place."""
    code = _RENDER.format(mem=RENDER_MEMORY, cap=RENDER_MAX_CHARS)
    try:
        r = subprocess.run([sys.executable, "-I", "-c", code],
                           input=json.dumps({"template": template, "prompt": prompt}), capture_output=True,
                           text=True, timeout=RENDER_TIMEOUT_S, env={"LANG": "C.UTF-8"})
        out = json.loads(r.stdout) if r.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        out = None
    except OSError:  # no fork here: a sandboxed job (seccomp), whose own limits bound the work (its engine job)
        import jinja2.sandbox
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        out = env.from_string(template).render(messages=[{"role": "user", "content": prompt}],
                                               add_generation_prompt=True)
    if not isinstance(out, str) or len(out) > RENDER_MAX_CHARS:
        raise UserError(f"the model's chat template (tokenizer.chat_template) did not render within "
                        f"{RENDER_TIMEOUT_S:.0f} s, {RENDER_MEMORY >> 20} MB and {RENDER_MAX_CHARS} characters: fix "
                        "the model's template, or run the workload without chat (chat: false)")
    return out
