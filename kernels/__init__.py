"""The engine's Triton kernels: only what the loop may rewrite. One op per file; the stem is the op's name.

Without a CUDA device the kernels run through the Triton interpreter, so the switch (autokernel.device.
ensure_interpreter) must be made before `triton` is first imported; every kernel module imports this package first.
"""
from autokernel import device

device.ensure_interpreter()

import triton  # noqa: E402  (after the switch above)

if triton.knobs.runtime.interpret:
    # The interpreter's tl.dot multiplies bf16 operands as their raw uint16 bit patterns (triton-lang/triton#11584).
    # bf16 -> fp32 is exact, so widening both operands first gives the product a GPU computes; kernels need no
    # bf16 workaround of their own.
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as _interpreter

    _create_dot = _interpreter.InterpreterBuilder.create_dot

    def _create_dot_bf16(self, a, b, d, input_precision, max_num_imprecise_acc):  # triton#11584
        if a.dtype.scalar == tl.bfloat16:
            a, b = (_interpreter.TensorHandle(_interpreter._convert_float(t.data, tl.bfloat16, tl.float32, None)
                                              .view(np.float32), tl.float32) for t in (a, b))
        return _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    if not getattr(_create_dot, "_bf16_fixed", False):  # importing the package twice must not wrap twice
        _create_dot_bf16._bf16_fixed = True
        _interpreter.InterpreterBuilder.create_dot = _create_dot_bf16

    # The interpreter patches triton.language for a launch (GridExecutor: once, restored when the grid is done), and
    # then again for every program of the grid (InterpretedFunction.__call__ -> _patch_lang, ~3.5 ms each: a third
    # of the interpreter time of a 96-row rmsnorm launch), though those modules are already patched. What a patch
    # does depends only on which language modules it covers (tl, tl.core), so a call whose modules were patched
    # earlier in the same launch skips the repeat; the launch's own patch and restore stand.
    _patch_lang, _launch = _interpreter._patch_lang, _interpreter.GridExecutor.__call__
    _patched: list = []  # per launch in progress: the language modules patched so far in it

    class _AlreadyPatched:
        def restore(self) -> None:  # the enclosing launch restores what it patched
            pass

    def _langs(fn) -> set:
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def _patch_lang_once(fn):
        langs = _langs(fn)
        if _patched and langs and langs <= _patched[-1]:
            return _AlreadyPatched()
        scope = _patch_lang(fn)
        if _patched:
            _patched[-1] |= langs
        return scope

    def _launch_tracked(self, *args, **kwargs):
        _patched.append(set())
        try:
            return _launch(self, *args, **kwargs)
        finally:
            _patched.pop()

    if not getattr(_interpreter._patch_lang, "_once", False):
        _patch_lang_once._once = True
        _interpreter._patch_lang = _patch_lang_once
        _interpreter.GridExecutor.__call__ = _launch_tracked
