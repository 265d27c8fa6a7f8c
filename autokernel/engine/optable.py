"""Op slots: which implementation serves each op — the torch reference, our Triton kernel, or one override.

The override is the hook the gate and the profiler use to swap in one candidate. Loading a candidate file executes
it, so overrides are only ever loaded inside the sandbox (docs/design.md trust rule 2). Every kernel, ours or a
candidate, is loaded by autokernel.kernel_loader, the same function the gate's numeric harness uses: a candidate is
`kernels.<op>` from a file `<op>.py` in the engine exactly as in the gate.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from autokernel import ops as opspecs
from autokernel.errors import UserError
from autokernel.kernel_loader import KernelLoadError, launcher_of, load_kernel

BACKENDS = ("reference", "triton")
# observer(op, site, fn, args) -> result: wraps every call (profiler, tracer); None means call straight through
Observer = Callable[[str, str, Callable, tuple], Any]


def load_file(op: str, path: str | Path) -> Callable:
    """The launcher `op` from a kernel file at `path` (a candidate replacing kernels/<op>.py, named <op>.py)."""
    try:
        return launcher_of(load_kernel(op, path), op)
    except KernelLoadError as e:
        raise UserError(f"{path}: {e}") from None


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
        return launcher_of(load_kernel(op), op)
    raise UserError(f"unknown kernels backend {backend!r}: use one of {', '.join(BACKENDS)}")


def _launcher(op: str, backend: str, override: str | Path | Callable | None) -> Callable:
    """The op's launcher: the backend's, or an override (a launcher itself, or the file of a candidate kernel)."""
    if override is None:
        return load_launcher(op, backend)
    return override if callable(override) else load_file(op, override)


class OpTable:
    def __init__(self, backend: str = "triton", overrides: dict[str, str | Path | Callable] | None = None):
        if backend not in BACKENDS:
            raise UserError(f"unknown kernels backend {backend!r}: use one of {', '.join(BACKENDS)}")
        self.backend = backend
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(opspecs.OPS))
        if unknown:
            raise UserError(f"override for unknown op {unknown[0]!r}; known ops: {', '.join(opspecs.OPS)}")
        # an overridden op's own kernel is never loaded: its candidate is the one module kernels.<op>
        self.launchers: dict[str, Callable] = {op: _launcher(op, backend, overrides.get(op)) for op in opspecs.OPS}
        self.observer: Observer | None = None

    def __call__(self, op: str, site: str, *args):
        fn = self.launchers[op]
        if self.observer is not None:
            return self.observer(op, site, fn, args)
        return fn(*args)
