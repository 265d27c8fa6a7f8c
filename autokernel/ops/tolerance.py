"""One dtype -> tolerance table, derived rather than guessed (STYLE.md #5).

A kernel's output is compared with a float64 reference. It may be off by at most twice the error that eager torch
makes in the same dtype on the same inputs (so a kernel is held to the standard of the library it replaces), plus a
few units in the last place of the dtype, relative to the output's scale (so a near-exact eager result does not
demand bit-exactness from a different but exact summation order).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

EAGER_FACTOR = 2.0  # flash-attention's test_layer_norm.py rule
ULPS = 4.0  # few-ulp slack, relative to the output's max magnitude


@dataclass(frozen=True)
class Closeness:
    ok: bool
    max_err: float  # max |out - ref64|
    eager_err: float  # max |eager - ref64|
    bound: float  # EAGER_FACTOR * eager_err + ULPS * eps * scale
    scale: float  # max |ref64|

    def detail(self) -> str:
        return (f"max error {self.max_err:.3g} vs bound {self.bound:.3g} "
                f"(eager error {self.eager_err:.3g}, output scale {self.scale:.3g})")


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def compare(out: torch.Tensor, ref64: torch.Tensor, eager: torch.Tensor, dtype: torch.dtype) -> Closeness:
    """Is `out` (computed in `dtype`) as close to the float64 truth as eager torch is?"""
    ref64 = ref64.to(torch.float64)
    o = out.detach().to(torch.float64).cpu()
    r = ref64.cpu()
    e = eager.detach().to(torch.float64).cpu()
    finite = bool(torch.isfinite(o).all())
    scale = float(r.abs().max()) if r.numel() else 0.0
    max_err = float((o - r).abs().max()) if r.numel() else 0.0
    eager_err = float((e - r).abs().max()) if r.numel() else 0.0
    bound = EAGER_FACTOR * eager_err + ULPS * eps(dtype) * max(scale, torch.finfo(dtype).tiny)
    return Closeness(finite and max_err <= bound, max_err if finite else float("inf"), eager_err, bound, scale)
