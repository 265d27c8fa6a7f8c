"""A tiny Hugging Face Llama with Liger-Kernel's Triton kernels, patched in from this checkout's copies.

The engine a team that vendors Liger might have: transformers' LlamaForCausalLM with RMSNorm, RoPE and SwiGLU routed
to the Triton ops in llama_liger/ops/ (copies of liger_kernel/ops/{rms_norm,rope,swiglu}.py), the way
liger_kernel.transformers.apply_liger_kernel_to_llama patches the installed ones. Randomly initialised (fixed seed,
no download): the weights do not matter for finding and proving kernels, the shapes and the code paths do.

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


def build() -> Engine:
    modeling_llama.LlamaRMSNorm = RMSNorm
    modeling_llama.LlamaMLP = SwiGLUMLP
    modeling_llama.apply_rotary_pos_emb = rotary_pos_emb
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
    return Engine(model)
