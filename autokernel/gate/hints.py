"""Compiler hints are claims, and the gate checks them (the numeric job's child, under the Triton interpreter).

`tl.multiple_of`, `tl.max_contiguous` and `tl.max_constancy` tell the compiler facts about a tensor's values that it
then relies on (vectorised, unmasked, aligned loads and stores). The interpreter ignores them, so a hint that is false
at some shape is exact wherever the gate runs kernels as Python and wrong wherever they compile:
`N = tl.multiple_of(N, 16)` holds at the model's N = 576 and not at N = 431. Here each hint is checked on the values
it is applied to, in every call of every case; the first false one stops the call (runtime.false_hint). `tl.assume`
needs nothing here: the interpreter asserts it.

What each hint claims, along each dimension d with hint value v (triton/language/core.py's definitions):
- max_contiguous: the values form runs of v consecutive values (consecutive elements for a pointer), the runs
  starting at indices that are multiples of v. A run may break by falling back (to a smaller or the same value):
  that is the wrap of the Triton matmul tutorial's `(pid * BLOCK + tl.arange(0, BLOCK)) % M` (all zeros at M = 1),
  whose wrapped lanes are rows the kernel masks at its store; left unchecked. A jump forward is a false claim.
- multiple_of: the first value of each run of consecutive values is a multiple of v (bytes, for a pointer).
- max_constancy: the values form runs of v equal values, starting at indices that are multiples of v.
"""
from __future__ import annotations

import numpy as np

NAMES = {"tt.divisibility": "tl.multiple_of", "tt.contiguity": "tl.max_contiguous", "tt.constancy": "tl.max_constancy"}


class Violation(BaseException):
    """Raised inside the kernel at a false hint; BaseException so that nothing in between (the interpreter wraps
    Exception) turns it into another error. The first one is also kept in `state`, so it stands if swallowed."""


class _State:
    first: str | None = None


state = _State()


def _step(dtype) -> int:
    """What one element further adds to a value: 1, or a pointer's element size in bytes."""
    el = getattr(dtype, "element_ty", None)
    return max(1, el.primitive_bitwidth // 8) if el is not None else 1


def false_claim(name: str, data: np.ndarray, values: list, step: int) -> str | None:
    """Why the hint `name` with `values` is false for `data`, or None where it holds."""
    x: np.ndarray = np.asarray(data).astype(np.int64, copy=False).reshape(np.shape(data) or (1,))
    for d, v in enumerate(values[:x.ndim]):
        v = int(v)
        n = x.shape[d]
        if v <= 1 or n == 0:
            continue
        a = np.moveaxis(x, d, 0)
        diff = a[1:] - a[:-1]
        inside = (np.arange(1, n) % v != 0).reshape((-1,) + (1,) * (a.ndim - 1))  # not at a group's start
        if name == "tt.divisibility":
            starts = np.concatenate([np.ones((1, *a.shape[1:]), bool), diff != step])
            bad = starts & (a % v != 0)
        elif name == "tt.contiguity":
            bad = np.concatenate([np.zeros((1, *a.shape[1:]), bool), inside & (diff > 0) & (diff != step)])
        else:
            bad = np.concatenate([np.zeros((1, *a.shape[1:]), bool), inside & (diff != 0)])
        if bad.any():
            i = int(np.argwhere(bad)[0][0])
            return f"{NAMES[name]}(..., {v}) is false along dimension {d} at index {i} (value {int(a[i].flat[0])})"
    return None


def install() -> None:
    """Check every hint the interpreter records (TensorHandle.set_attr) before recording it."""
    from triton.runtime import interpreter
    cls = interpreter.TensorHandle
    plain = getattr(cls.set_attr, "_plain", cls.set_attr)

    def set_attr(self, key, value):
        if key in NAMES:
            why = false_claim(key, self.data, list(value), _step(self.dtype))
            if why:
                state.first = state.first or why
                raise Violation(why)
        return plain(self, key, value)

    set_attr.__dict__["_plain"] = plain  # a function attribute, which mypy does not model
    cls.set_attr = set_attr
