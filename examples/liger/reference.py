"""Torch references for the Liger launchers this engine calls: each has its launcher's signature and returns the
outputs the declaration lists (`outputs` in autokernel.toml), in that order. Written from Liger's own test
references (test/transformers/test_rms_norm.py, test_rope.py, test_swiglu.py); used by the gate in its own sandboxed
job, never in the candidate's (docs/targets.md)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_forward(X, W, eps, offset, casting_mode, row_mode):
    """-> (Y, RSTD): Y in X's shape and dtype; RSTD (rows,) float32 in the 'llama' and 'gemma' casting modes."""
    x = X.reshape(-1, X.shape[-1])
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
    if casting_mode in ("llama", 0):  # the normalised row goes back to X's dtype before the weight multiplies it
        y = (x.float() * rstd[:, None]).to(X.dtype)
        y = y * (offset + W) if W is not None else y
    elif casting_mode in ("gemma", 1):  # everything in float32, one cast at the end
        y = x.float() * rstd[:, None]
        y = (y * (offset + W.float()) if W is not None else y).to(X.dtype)
    else:  # 'none': X's own dtype throughout
        rstd = torch.rsqrt(x.pow(2).mean(-1) + eps)
        y = x * rstd[:, None]
        y = y * (offset + W) if W is not None else y
    return y.view(X.shape), rstd


def rope_forward(q, k, cos, sin, position_ids=None, unsqueeze_dim=1, rotary_dim=None):
    """-> (q, k) rotated: (B, heads, S, head_dim), HF Llama's rotate-half form on the first rotary_dim entries."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rd = rotary_dim or min(cos.shape[-1], q.shape[-1])
    cos, sin = cos[..., :rd], sin[..., :rd]

    def rotate(x):
        r, rest = x[..., :rd], x[..., rd:]
        half = torch.cat((-r[..., rd // 2:], r[..., : rd // 2]), dim=-1)
        return torch.cat(((r * cos + half * sin).to(x.dtype), rest), dim=-1)

    return rotate(q), rotate(k)


def swiglu_forward(a, b, gate_multiplier=1.0):
    """-> (c,): silu(a * gate_multiplier) * b, the activation in float32 and cast to b's dtype."""
    return ((F.silu(a.float() * gate_multiplier)).to(b.dtype) * b,)
