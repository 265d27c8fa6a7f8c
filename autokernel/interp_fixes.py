"""Two fixes to triton's CPU interpreter (TRITON_INTERPRET=1) that every kernel run under it gets: autokernel's own
(kernels/__init__.py installs them on import) and a target checkout's (autokernel/interp.py installs them with its
compatibility patches). Trusted harness code, kept out of kernels/, which holds only what the loop may rewrite.

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
    """Install both fixes when the interpreter is on (idempotent); returns whether it is. Call it after the
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
    if _patched:
        _patched[-1] |= langs
    return scope


def _launch_tracked(self, *args, **kwargs):
    _patched.append(set())
    try:
        return SHIPPED["launch"](self, *args, **kwargs)
    finally:
        _patched.pop()
