"""Fixes to triton's CPU interpreter (TRITON_INTERPRET=1) that every kernel run under it gets: autokernel's own
(kernels/__init__.py installs them on import) and a target checkout's (autokernel/interp.py installs them with its
compatibility patches). Trusted harness code, kept out of kernels/, which holds only what the loop may rewrite.

- bfloat16 arithmetic. The interpreter keeps bf16 values as their uint16 bit patterns and runs numpy's add, multiply,
  exp... on those integers (2.0 * 0.5 comes out 0: an honest silu_mul computing in bf16 had errors of 5e29, Liger's
  swiglu returned 1e36 and NaN), and casts float32 to bf16 by truncation. Here bf16 operands are widened to float32
  (exact), computed, and rounded back to nearest even, as a GPU does; casts to and from bf16 go through float32
  (exact widening, one rounding); sums, maxima and minima over bf16 values are taken on the widened values (the
  interpreter's own sum adds the bit patterns as integers). The rounding is numpy's: inside a launch the gate's
  runtime watch forbids torch compute.
- Loop variables. In a compiled kernel `for i in range(...)` (or tl.range) counts with a scalar tensor; the
  interpreter hands out Python ints, so `i.to(tl.int64)` (the usual int64-offset idiom of a persistent kernel)
  raised "'int' object has no attribute 'to'". Here, for the duration of a launch, `range` in the kernel's module
  and tl.range yield scalar tensors (int32, int64 where a bound is or the values need it); tl.static_range stays
  Python ints, as compiled (constexpr).
- Comparison results. The interpreter labels a comparison's values (numpy bools) with its operands' dtype (int32
  for `row < n`): a scalar comparison splatted to a tile (`mask & (row < n)`, a program's row in range) becomes an
  int32 array, which tl.store refuses as a mask ("mask has unsupported dtype"; compiled, it is an i1 and fine). Here
  a bool result is labelled int1.
- bf16 tl.dot. The interpreter's tl.dot multiplies bf16 operands as their raw uint16 bit patterns
  (triton-lang/triton#11584): errors of ~1e11 on a correct kernel. bf16 -> fp32 is exact, so widening both operands
  first gives the product a GPU computes; kernels need no bf16 workaround of their own.
- triton.language patched once per launch. The interpreter patches triton.language for a launch (GridExecutor: once,
  restored when the grid is done), and then again for every program of the grid (InterpretedFunction.__call__ ->
  _patch_lang, ~3.5 ms each: a third of the interpreter time of a 96-row rmsnorm launch), though those modules are
  already patched. What a patch does depends only on which language modules it covers (tl, tl.core), so a call whose
  modules were patched earlier in the same launch skips the repeat; the launch's own patch and restore stand. The
  bits are the shipped interpreter's (tests/kernels/test_interpreter_patch.py).
"""
from __future__ import annotations

SHIPPED: dict = {}  # the interpreter's own functions these replace ("create_dot", "patch_lang", "launch")
_patched: list = []  # per launch in progress: the language modules patched so far in it


def install() -> bool:
    """Install the fixes when the interpreter is on (idempotent); returns whether it is. Call it after the
    TRITON_INTERPRET switch (autokernel.device.ensure_interpreter)."""
    import triton
    if not triton.knobs.runtime.interpret:
        return False
    from triton.runtime import interpreter
    if not SHIPPED:
        SHIPPED.update(create_dot=interpreter.InterpreterBuilder.create_dot, patch_lang=interpreter._patch_lang,
                       launch=interpreter.GridExecutor.__call__)
        interpreter.InterpreterBuilder.create_dot = _create_dot_bf16
        interpreter._patch_lang = _patch_lang_once
        interpreter.GridExecutor.__call__ = _launch_tracked
        _patch_bf16(interpreter)
        _patch_bool_results(interpreter)  # after bf16: a bf16 comparison's result is labelled too
    return True


def _create_dot_bf16(self, a, b, d, input_precision, max_num_imprecise_acc):  # triton#11584
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter
    if a.dtype.scalar == tl.bfloat16:
        a, b = (interpreter.TensorHandle(interpreter._convert_float(t.data, tl.bfloat16, tl.float32, None)
                                         .view(np.float32), tl.float32) for t in (a, b))
    return SHIPPED["create_dot"](self, a, b, d, input_precision, max_num_imprecise_acc)


class _AlreadyPatched:
    def restore(self) -> None:  # the enclosing launch restores what it patched
        pass


def _langs(fn) -> set:
    import triton.language as tl
    return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}


def _patch_lang_once(fn):
    langs = _langs(fn)
    if _patched and langs and langs <= _patched[-1]:
        return _AlreadyPatched()
    scope = SHIPPED["patch_lang"](fn)
    for lang in [v for v in fn.__globals__.values() if v is _tl()]:
        lang.range = tensor_range  # tl.range; the launch's restore puts tl.range back (static_range stays ints)
    if _patched:
        _patched[-1] |= langs
    return scope


def _tl():
    import triton.language as tl
    return tl


def tensor_range(arg1, arg2=None, step=None, **kwargs):
    """`range` / `tl.range` in a kernel as compiled: the loop variable is a scalar tensor (int32, or int64 where a
    bound is int64 or the values need it), so `i.to(tl.int64)` works; the bare interpreter gives Python ints
    ("'int' object has no attribute 'to'")."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter
    bounds, wide = [], False
    for a in (arg1, arg2, step):
        if isinstance(a, tl.constexpr):
            a = a.value
        if isinstance(a, tl.tensor):
            wide |= a.dtype == tl.int64
            a = int(np.asarray(a.handle.data).reshape(-1)[0])
        bounds.append(a)
    start, end = (0, bounds[0]) if bounds[1] is None else (bounds[0], bounds[1])
    r = range(int(start), int(end), 1 if bounds[2] is None else int(bounds[2]))
    if not r:
        return
    wide |= max(abs(r[0]), abs(r[-1])) >= 1 << 31
    dt, npdt = (tl.int64, np.int64) if wide else (tl.int32, np.int32)
    for i in r:
        yield tl.tensor(interpreter.TensorHandle(np.array([i], dtype=npdt), dt), dt)


def _launch_tracked(self, *args, **kwargs):
    _patched.append(set())
    scope = getattr(self.fn, "__globals__", None)  # the kernel module: its builtin `range` counts as tl.range
    ours = isinstance(scope, dict) and "range" not in scope
    if ours:
        scope["range"] = tensor_range
    try:
        return SHIPPED["launch"](self, *args, **kwargs)
    finally:
        if ours and scope.get("range") is tensor_range:
            del scope["range"]
        _patched.pop()


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


def _patch_bool_results(interpreter) -> None:
    import numpy as np
    import triton.language as tl
    builder, handle = interpreter.InterpreterBuilder, interpreter.TensorHandle
    binary = builder.binary_op

    def binary_op(self, lhs, rhs, op):
        out = binary(self, lhs, rhs, op)
        if out.data.dtype == np.bool_ and out.dtype.scalar != tl.int1:
            return handle(out.data, tl.int1)
        return out

    builder.binary_op = binary_op
