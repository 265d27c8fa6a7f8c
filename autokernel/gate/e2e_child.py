"""Sandbox side of the end-to-end stage: the engine with one op swapped for the candidate. Trusted harness code."""
from __future__ import annotations

import io
from pathlib import Path

import torch

from autokernel.engine.generate import generate, left_pad

_save, _BytesIO = torch.save, io.BytesIO  # bound at import, before any candidate code runs


def teacher_forced(eng, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 logits (B, T, V) for every position of left-padded sequences, and the (B, T) real-token mask."""
    ids, kv_start = left_pad(seqs, eng.tokenizer.pad_id, eng.model.device)
    cache = eng.model.new_cache(ids.shape[0], ids.shape[1])
    logits = eng.model.forward(ids, cache, kv_start, all_logits=True).float().cpu()
    mask = torch.arange(ids.shape[1])[None, :] >= kv_start.cpu()[:, None].long()
    return logits, mask


def greedy(eng, rows: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    return generate(eng.model, eng.tokenizer, rows, max_new_tokens).new_ids


def run(payload: dict, inputs: Path) -> dict:
    """Sandbox entry: the candidate is payload["candidate"] in the read-only `inputs` directory. The logits are
    returned as torch.save bytes taken right after the forward (not a live tensor the later greedy run could still
    reach); the parent loads them weights-only (autokernel.sandbox: results travel through the pipe)."""
    from autokernel import kernel_loader
    kernel_loader.neutral_process()  # the same argv and env keys as the numeric job; imports kernels (interpreter)
    from autokernel.engine import open_engine
    eng = open_engine(payload["model"], kernels=payload["backend"], weights=payload["weights"],
                      overrides={**payload.get("others", {}), payload["op"]: str(Path(inputs) / payload["candidate"])})
    logits, _ = teacher_forced(eng, payload["seqs"])
    snap = _BytesIO()
    _save(logits, snap)
    prompts = [s[:n] for s, n in zip(payload["seqs"], payload["prompt_lens"])]
    return {"new": greedy(eng, prompts, payload["max_new_tokens"]), "logits": snap.getvalue()}
