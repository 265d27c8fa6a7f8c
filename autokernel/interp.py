"""Make third-party Triton code run under the CPU interpreter (TRITON_INTERPRET=1) without editing its files.

Trusted harness code: installed in a sandboxed job before the checkout's modules are imported. Each patch covers one
thing the compiled path does that triton 3.9's interpreter does not (measured on liger-kernel 0.8.5, torch 2.13 CPU):

- Scalar float arguments. Compiled Triton specialises a Python float argument to an fp32 scalar, so kernels call
  `eps.to(tl.float32)`; the interpreter passes the bare float ("'float' object has no attribute 'to'": Liger's
  rms_norm, swiglu, layer_norm, fused_add_rms_norm, kl_div). Here a float argument becomes an fp32 scalar tensor,
  as compiled.
- libdevice. `triton.language.extra.libdevice.rsqrt` and the rest are stubs the compiler swaps for the backend's
  library; under the interpreter they return None (Liger's rms_norm: "cannot convert None ... to tensor"). Here
  the ones triton.language.math also has call it, and tanh is 2*sigmoid(2x)-1 (Liger's geglu).
- bfloat16 arithmetic. The interpreter keeps bf16 values as their uint16 bit patterns and runs numpy's add, multiply,
  exp... on those integers (2.0 * 0.5 comes out 0: Liger's swiglu in bf16 returned 1e36 and NaN), and casts float32
  to bf16 by truncation. Here bf16 operands are widened to float32 (exact), computed, and rounded back to nearest
  even, as a GPU does; the same for the float32 -> bf16 cast. Reductions over bf16 values are not covered (Liger's
  kernels widen before they reduce).
- Autotuning. An `@triton.autotune` kernel with several configs benchmarks them, which needs a GPU ("0 active
  drivers"). Here the first config that survives the kernel's own pruning runs, as if it were the only one; which
  kernels were pinned is reported (`pinned()`), since only that config ran.

The interpreter fixes every kernel gets, autokernel's own included (bf16 tl.dot, the per-program patch cost), are
autokernel/interp_fixes.py's: install() applies them too.
"""
from __future__ import annotations

import importlib
from typing import Any

_pinned: dict[str, int] = {}  # kernel name -> configs it declares, for each autotuned kernel pinned to its first
MATH_TWINS = ("rsqrt", "sqrt", "exp", "exp2", "log", "log2", "sin", "cos", "erf", "floor", "ceil", "abs", "fma")
LIBDEVICE = ("triton.language.extra.libdevice", "triton.language.extra.cuda.libdevice")


def install() -> bool:
    """Apply the patches when the interpreter is on (idempotent); returns whether it is. Call it after the
    TRITON_INTERPRET switch and before the checkout's modules are imported (they bind libdevice names on import)."""
    import triton
    if not triton.knobs.runtime.interpret:
        return False
    from triton.runtime import autotuner, interpreter

    from autokernel import interp_fixes
    interp_fixes.install()  # the fixes autokernel's own kernels get (bf16 tl.dot, one language patch per launch)
    if getattr(interpreter._implicit_cvt, "_ak_compat", False):
        return True
    _patch_floats(interpreter)
    _patch_bf16(interpreter)
    _patch_libdevice()
    _patch_autotune(autotuner.Autotuner)
    return True


def pinned() -> dict[str, int]:
    """{kernel: number of configs it declares} for every autotuned kernel that ran on its first config only."""
    return dict(_pinned)


def _patch_floats(interpreter) -> None:
    import numpy as np
    import triton.language as tl
    convert = interpreter._implicit_cvt

    def implicit_cvt(arg):
        if type(arg) is float:  # as compiled: an fp32 scalar (bool and int keep the interpreter's own rule)
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return convert(arg)

    implicit_cvt.__dict__["_ak_compat"] = True  # a function attribute, which mypy does not model
    interpreter._implicit_cvt = implicit_cvt  # GridExecutor looks the name up in the module at each launch


def _patch_bf16(interpreter) -> None:
    import numpy as np
    import torch
    import triton.language as tl
    builder, handle, bf16 = interpreter.InterpreterBuilder, interpreter.TensorHandle, tl.bfloat16

    def widen(data):  # bf16 bit patterns -> float32, exact
        return (np.asarray(data).astype(np.uint32) << 16).view(np.float32)

    def narrow(values):  # float32 -> bf16 bit patterns, rounded to nearest even (torch's conversion)
        f32 = np.ascontiguousarray(values, dtype=np.float32)
        return torch.from_numpy(f32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)

    def result(out):
        return handle(out if out.dtype == np.bool_ else narrow(out), bf16)

    binary, unary, cast, fma = builder.binary_op, builder.unary_op, builder.cast_impl, builder.create_fma

    def binary_op(self, lhs, rhs, op):
        if lhs.dtype.scalar == bf16 and rhs.dtype.scalar == bf16:
            return result(op(widen(lhs.data), widen(rhs.data)))
        return binary(self, lhs, rhs, op)

    def unary_op(self, arg, op):
        if arg.dtype.scalar == bf16:
            return result(op(widen(arg.data)))
        return unary(self, arg, op)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == bf16:
            return handle(narrow(src.data), bf16)
        return cast(self, src, dst_type)

    def create_fma(self, x, y, z):
        if z.dtype.scalar == bf16:
            wide = [widen(t.data).astype(np.float64) for t in (x, y, z)]
            return handle(narrow(wide[0] * wide[1] + wide[2]), bf16)
        return fma(self, x, y, z)

    builder.binary_op, builder.unary_op, builder.cast_impl, builder.create_fma = binary_op, unary_op, cast_impl, \
        create_fma


def _via_math(name: str):
    import triton.language as tl

    def fn(*args, **kwargs):  # looked up at call time: the interpreter patches tl.math for the launch
        return getattr(tl.math, name)(*args, **kwargs)

    fn.__name__ = name
    return fn


def _tanh(x):
    import triton.language as tl
    return 2 * tl.sigmoid(2 * x) - 1


def _patch_libdevice() -> None:
    for modname in LIBDEVICE:
        try:
            mod: Any = importlib.import_module(modname)  # a triton libdevice module: its functions are replaced
        except ImportError:
            continue
        for name in MATH_TWINS:
            if hasattr(mod, name):
                setattr(mod, name, _via_math(name))
        mod.tanh = _tanh


def _patch_autotune(cls) -> None:
    prune = cls.prune_configs

    def prune_configs(self, kwargs):
        configs = prune(self, kwargs)
        if len(configs) > 1:
            _pinned[getattr(self.base_fn, "__name__", "?")] = len(self.configs)
            return configs[:1]
        return configs

    cls.prune_configs = prune_configs
