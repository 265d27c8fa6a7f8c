"""Llama forward over op slots. Every hot op goes through `self.ops(op, site, ...)`; only views and cache writes
are plain torch. Batches are left-padded: kv_start[b] is the first real token of row b."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from autokernel.engine.gguf_model import Q4_1, Q8_0, GGUFModel
from autokernel.engine.optable import OpTable


@dataclass
class KVCache:
    k: list[torch.Tensor]  # per layer (B, Hkv, S_max, hd)
    v: list[torch.Tensor]
    length: int = 0  # filled positions

    @classmethod
    def empty(cls, n_layers, batch, n_kv_heads, max_len, head_dim, dtype, device) -> "KVCache":
        shape = (batch, n_kv_heads, max_len, head_dim)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)])


class Llama:
    def __init__(self, gguf: GGUFModel, ops: OpTable, dtype: torch.dtype = torch.float32):
        self.cfg, self.w, self.ops, self.dtype = gguf.config, gguf.tensors, ops, dtype
        self.lm_weight = gguf.embedding_float  # (V, D), tied to the embedding in SmolLM2
        self.device = self.lm_weight.device

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        c = self.cfg
        return KVCache.empty(c.n_layers, batch, c.n_kv_heads, max_len, c.head_dim, self.dtype, self.device)

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        w = self.w[name]
        if isinstance(w, Q4_1):
            return self.ops("matmul_q4_1", name, x, w.qs, w.d, w.m)
        return self.ops("matmul", name, x, w)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.w["token_embd.weight"]
        if isinstance(e, Q8_0):
            return self.ops("embedding_q8_0", "token_embd", ids, e.qs, e.scales, self.dtype)
        return self.ops("embedding", "token_embd", ids, e)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, kv_start: torch.Tensor,
                all_logits: bool = False) -> torch.Tensor:
        """ids (B, T) appended at cache.length. Prefill needs an empty cache; decode feeds T == 1.
        Returns float32 logits (B, V) for the last position, or (B, T, V) with all_logits."""
        c, ops = self.cfg, self.ops
        B, T = ids.shape
        s0 = cache.length
        assert s0 == 0 or T == 1, "prefill starts from an empty cache; decode feeds one token per row"
        pos = (torch.arange(s0, s0 + T, device=ids.device)[None, :] - kv_start[:, None]).clamp_min(0)
        pos = pos.to(torch.int32)  # (B, T) left-padded rows start at position 0
        scale = c.head_dim ** -0.5
        h = self._embed(ids)  # (B, T, D) residual stream
        x = ops("rmsnorm", "blk.0.attn_norm", h, self.w["blk.0.attn_norm.weight"], c.eps)
        for i in range(c.n_layers):
            p = f"blk.{i}."
            x2 = x.reshape(B * T, c.hidden)
            q = self._linear(x2, p + "attn_q.weight").view(B, T, c.n_heads, c.head_dim)
            k = self._linear(x2, p + "attn_k.weight").view(B, T, c.n_kv_heads, c.head_dim)
            v = self._linear(x2, p + "attn_v.weight").view(B, T, c.n_kv_heads, c.head_dim)
            q = ops("rope", p + "rope_q", q, pos, c.rope_theta).transpose(1, 2)  # (B, H, T, hd)
            k = ops("rope", p + "rope_k", k, pos, c.rope_theta).transpose(1, 2)  # (B, Hkv, T, hd)
            cache.k[i][:, :, s0:s0 + T] = k
            cache.v[i][:, :, s0:s0 + T] = v.transpose(1, 2)
            if s0 == 0:
                o = ops("attention", p + "attn", q, k, v.transpose(1, 2), kv_start, scale)  # (B, H, T, hd)
            else:
                o = ops("attention_decode", p + "attn", q[:, :, 0], cache.k[i], cache.v[i], kv_start, s0 + 1,
                        scale)[:, :, None]
            o = o.transpose(1, 2).reshape(B * T, c.hidden)
            a = self._linear(o, p + "attn_output.weight").view(B, T, c.hidden)
            x, h = ops("add_rmsnorm", p + "ffn_norm", a, h, self.w[p + "ffn_norm.weight"], c.eps)
            x2 = x.reshape(B * T, c.hidden)
            g = self._linear(x2, p + "ffn_gate.weight")
            u = self._linear(x2, p + "ffn_up.weight")
            f = self._linear(ops("silu_mul", p + "ffn_act", g, u), p + "ffn_down.weight").view(B, T, c.hidden)
            nxt = f"blk.{i + 1}.attn_norm.weight" if i + 1 < c.n_layers else "output_norm.weight"
            x, h = ops("add_rmsnorm", nxt.removesuffix(".weight"), f, h, self.w[nxt], c.eps)
        cache.length = s0 + T
        if not all_logits:
            return ops("lm_head", "output", x[:, -1].contiguous(), self.lm_weight)  # (B, V)
        return ops("lm_head", "output", x.reshape(B * T, c.hidden), self.lm_weight).view(B, T, -1)
