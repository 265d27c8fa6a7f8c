"""The trusted side of every op: reference, inputs, work counts. `OPS` lists them in forward order."""
from __future__ import annotations

import importlib

from autokernel.ops.spec import OpSpec

OPS = (
    "embedding", "embedding_q8_0", "rmsnorm", "add_rmsnorm", "rope", "attention", "attention_decode",
    "silu_mul", "matmul", "matmul_q4_1", "lm_head", "softmax",
)


def get(name: str) -> OpSpec:
    if name not in OPS:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(OPS)}")
    return importlib.import_module(f"autokernel.ops.{name}").SPEC
