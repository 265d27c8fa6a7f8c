"""How far two engines' next-token distributions are apart: per-token KL(base || other) and top-1 agreement."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Divergence:
    kl_mean: float  # nats
    kl_p99: float
    kl_max: float
    top1: float  # fraction of positions where both engines' argmax agree
    positions: int


def divergence(base_logits: torch.Tensor, other_logits: torch.Tensor, mask: torch.Tensor | None = None) -> Divergence:
    """Logits (..., V) from two engines on the same (teacher-forced) tokens; mask (...) selects real positions."""
    p = torch.log_softmax(base_logits.double(), -1)
    q = torch.log_softmax(other_logits.double(), -1)
    kl = (p.exp() * (p - q)).sum(-1)  # (...)
    agree = (p.argmax(-1) == q.argmax(-1)).double()
    if mask is not None:
        kl, agree = kl[mask], agree[mask]
    kl = kl.flatten().clamp_min(0.0)
    return Divergence(float(kl.mean()), float(torch.quantile(kl, 0.99)), float(kl.max()), float(agree.mean()),
                      int(kl.numel()))


def longest_run(tokens: list[int]) -> int:
    """Length of the longest run of one repeated token (the repetition guard's statistic)."""
    best = run = 0
    prev = None
    for t in tokens:
        run = run + 1 if t == prev else 1
        best, prev = max(best, run), t
    return best
