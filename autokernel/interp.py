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
  even, as a GPU does; casts to and from bf16 go through float32 (exact widening, one rounding); sums, maxima and
  minima over bf16 values are taken on the widened values (the interpreter's own sum adds the bit patterns as
  integers).
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
    import triton.language as tl
    builder, handle, bf16 = interpreter.InterpreterBuilder, interpreter.TensorHandle, tl.bfloat16

    def widen(data):  # bf16 bit patterns -> float32, exact
        return (np.asarray(data).astype(np.uint32) << 16).view(np.float32)

    def narrow(values):  # float32 -> bf16 bit patterns, rounded to nearest even (torch's conversion, bit for bit)
        return bf16_bits(np.ascontiguousarray(values, dtype=np.float32)).reshape(np.shape(values))

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
        s, d = src.dtype.scalar, dst_type.scalar
        if s == bf16 and d != bf16:  # widen exactly first: the interpreter would convert the bit patterns
            return cast(self, handle(widen(src.data), tl.float32), dst_type)
        if d == bf16 and s != bf16:  # through float32 (exact for ints below 2^24 and every fp16), rounded once
            wide = src if s == tl.float32 else cast(self, src, tl.float32)
            return handle(narrow(wide.data), bf16)
        return cast(self, src, dst_type)

    def create_fma(self, x, y, z):
        if z.dtype.scalar == bf16:
            wide = [widen(t.data).astype(np.float64) for t in (x, y, z)]
            return handle(narrow(wide[0] * wide[1] + wide[2]), bf16)
        return fma(self, x, y, z)

    builder.binary_op, builder.unary_op, builder.cast_impl, builder.create_fma = binary_op, unary_op, cast_impl, \
        create_fma
    _patch_bf16_reductions(interpreter.ReduceOps, widen, narrow)


def _patch_bf16_reductions(ops, widen, narrow) -> None:
    """tl.sum, tl.max, tl.min, tl.argmax, tl.argmin over bf16 values: the interpreter's fast paths run numpy on the
    bit patterns (a sum of integers, an order that is wrong for negatives). Here the values are widened (exact),
    reduced in float32, and a sum rounded back once: what a GPU's float32-accumulating reduction gives. Other
    combine functions take the slow path, whose additions the binary-op patch already rounds."""
    import numpy as np
    import triton.language as tl
    total, extremes = ops.sum, ops.min_max

    def bf16(t) -> bool:
        return t.dtype.scalar == tl.bfloat16

    def reduce_sum(self, input):
        if not bf16(input):
            return total(self, input)
        s = np.sum(widen(input.handle.data), axis=self.axis, keepdims=self.keep_dims, dtype=np.float32)
        return self.to_tensor(narrow(np.asarray(s, dtype=np.float32)), input.dtype)

    def min_max(self, input, val_reduce_op, idx_reduce_op=None):
        t = input[0] if isinstance(input, tuple) else input
        if not bf16(t):
            return extremes(self, input, val_reduce_op, idx_reduce_op)
        data = widen(t.handle.data)
        val = idx = None
        if val_reduce_op:
            v = val_reduce_op(data, axis=self.axis, keepdims=self.keep_dims)
            val = self.to_tensor(narrow(np.asarray(v, dtype=np.float32)), t.dtype)
        if idx_reduce_op:
            idx = self.to_tensor(idx_reduce_op(data, axis=self.axis, keepdims=self.keep_dims), tl.int32)
        if val is not None and idx is not None:
            return val, idx
        return val if val is not None else idx

    ops.sum, ops.min_max = reduce_sum, min_max


def bf16_bits(f32):
    """float32 array -> bfloat16 bit patterns (uint16), rounded to nearest even, NaN kept NaN (quiet): numpy only,
    since it runs inside a launch, where the gate's runtime watch forbids torch compute (autokernel/gate/child.py)."""
    import numpy as np
    bits = f32.view(np.uint32)
    with np.errstate(over="ignore"):
        rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    nan = ((bits >> np.uint32(16)) | np.uint32(0x0040))
    return np.where(np.isnan(f32), nan, rounded).astype(np.uint16)


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
