"""Batched prefill + decode with a KV cache; greedy or seeded sampling (temperature, top-k, top-p)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from autokernel.engine.model import Llama
from autokernel.engine.tokenizer import Tokenizer
from autokernel.errors import UserError


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no top-k cut
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class Generation:
    prompt_ids: list[list[int]]
    new_ids: list[list[int]] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0


def left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids left-padded to the longest row, and kv_start (B,) int32: each row's first real position."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.int64)
    for b, r in enumerate(rows):
        ids[b, T - len(r):] = torch.tensor(r, dtype=torch.int64)
    kv_start = torch.tensor([T - len(r) for r in rows], dtype=torch.int32)
    return ids.to(device), kv_start.to(device)


def pick(model: Llama, logits: torch.Tensor, s: Sampling, gen: torch.Generator | None) -> torch.Tensor:
    """Next token per row from float32 logits (B, V)."""
    if s.temperature <= 0:
        return logits.argmax(-1)
    probs = model.ops("softmax", "sampler", logits.contiguous(), s.temperature)  # (B, V) float32
    if s.top_k > 0:
        kth = probs.topk(min(s.top_k, probs.shape[-1]), dim=-1).values[:, -1:]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if s.top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < s.top_p  # the smallest prefix whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    return torch.multinomial(probs / probs.sum(-1, keepdim=True), 1, generator=gen)[:, 0]


def generate(model: Llama, tok: Tokenizer, rows: list[list[int]], max_new_tokens: int,
             sampling: Sampling = Sampling(), on_token: Callable[[int, int], None] | None = None) -> Generation:
    """Generate for a batch of token-id prompts until every row hits a stop token or max_new_tokens."""
    import time
    ctx = model.cfg.context_length
    longest = max(len(r) for r in rows)
    if longest + max_new_tokens > ctx:
        raise UserError(f"prompt of {longest} tokens + {max_new_tokens} new tokens exceeds the model's context "
                        f"of {ctx}; shorten the prompt or lower --max-new-tokens")
    gen = torch.Generator(device="cpu").manual_seed(s) if (s := sampling.seed) is not None else None
    ids, kv_start = left_pad(rows, tok.pad_id, model.device)
    B = ids.shape[0]
    cache = model.new_cache(B, ids.shape[1] + max_new_tokens)
    out = Generation(prompt_ids=[list(r) for r in rows], new_ids=[[] for _ in range(B)])
    done = [False] * B
    t0 = time.perf_counter()
    logits = model.forward(ids, cache, kv_start)
    out.prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for step in range(max_new_tokens):
        nxt = pick(model, logits.float().cpu() if gen is not None else logits, sampling, gen).to(model.device)
        for b in range(B):
            t = int(nxt[b])
            if done[b]:
                continue
            if t in tok.stop_ids:
                done[b] = True
                continue
            out.new_ids[b].append(t)
            if on_token:
                on_token(b, t)
        if all(done) or step == max_new_tokens - 1:
            break
        nxt = torch.where(torch.tensor(done, device=model.device), torch.full_like(nxt, tok.pad_id), nxt)
        logits = model.forward(nxt[:, None], cache, kv_start)
        out.decode_steps += 1
    out.decode_s = time.perf_counter() - t0
    return out
