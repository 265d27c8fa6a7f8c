"""Op slots: which implementation serves each op — the torch reference, our Triton kernel, or one override.

The override is the hook the gate and the profiler use to swap in one candidate. Loading a candidate file executes
it, so overrides are only ever loaded inside the sandbox (DESIGN.md trust rule 2).
"""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any, Callable

import torch

from autokernel import ops as opspecs
from autokernel.errors import UserError

BACKENDS = ("reference", "triton")
# observer(op, site, fn, args) -> result: wraps every call (profiler, tracer); None means call straight through
Observer = Callable[[str, str, Callable, tuple], Any]


def load_file(op: str, path: str | Path) -> Callable:
    """The launcher `op` from a kernel file at `path` (a candidate replacing kernels/<op>.py)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"autokernel_candidate_{op}", path)
    if spec is None or spec.loader is None:
        raise UserError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, op, None)
    if not callable(fn):
        raise UserError(f"{path}: defines no launcher function {op!r}")
    return fn


class DequantOnce:
    """The reference backend's matmul_q4_1 for a live engine: dequantize each (static) weight once, then matmul.

    The op spec's reference dequantizes on every call — the right semantics for checking a kernel, but 210 calls a
    token made the torch engine ~10x slower than it needs to be. The result is the same function: reference(x, W)
    with W = dequantize(qs, d, m), computed in x's dtype.
    """

    def __init__(self):
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, x, qs, d, m):
        from autokernel.ops.matmul_q4_1 import dequantize
        hit = self._cache.get(id(qs))
        if hit is None or hit[0] is not qs or hit[1].dtype != x.dtype:
            w = dequantize(qs, d.to(torch.promote_types(x.dtype, d.dtype)), m.to(torch.promote_types(x.dtype, d.dtype)))
            hit = self._cache[id(qs)] = (qs, w.to(x.dtype))  # keeps qs alive, so its id is not reused
        return x @ hit[1].T


def load_launcher(op: str, backend: str) -> Callable:
    if backend == "reference":
        return DequantOnce() if op == "matmul_q4_1" else opspecs.get(op).reference
    if backend == "triton":
        return getattr(importlib.import_module(f"kernels.{op}"), op)
    raise UserError(f"unknown kernels backend {backend!r}: use one of {', '.join(BACKENDS)}")


class OpTable:
    def __init__(self, backend: str = "triton", overrides: dict[str, str | Path | Callable] | None = None):
        if backend not in BACKENDS:
            raise UserError(f"unknown kernels backend {backend!r}: use one of {', '.join(BACKENDS)}")
        self.backend = backend
        self.launchers: dict[str, Callable] = {op: load_launcher(op, backend) for op in opspecs.OPS}
        for op, impl in (overrides or {}).items():
            if op not in self.launchers:
                raise UserError(f"override for unknown op {op!r}; known ops: {', '.join(opspecs.OPS)}")
            self.launchers[op] = impl if callable(impl) else load_file(op, impl)
        self.observer: Observer | None = None

    def __call__(self, op: str, site: str, *args):
        fn = self.launchers[op]
        if self.observer is not None:
            return self.observer(op, site, fn, args)
        return fn(*args)
