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
- Autotuning. An `@triton.autotune` kernel with several configs benchmarks them, which needs a GPU ("0 active
  drivers"). Here the first config that survives the kernel's own pruning runs, as if it were the only one; which
  kernels were pinned is reported (`pinned()`), since only that config ran.

The interpreter fixes every kernel gets, autokernel's own included (bf16 arithmetic, casts, reductions and tl.dot as
a GPU computes them, the per-program patch cost), are autokernel/interp_fixes.py's: install() applies them too.
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


def _config_key(config) -> tuple:
    """An order of autotune configs that ignores the order they are listed in: by meta-parameters (numbers by value),
    then warps and stages."""
    def value(v):
        return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, repr(v))
    return (sorted((k, value(v)) for k, v in getattr(config, "kwargs", {}).items()),
            value(getattr(config, "num_warps", None)), value(getattr(config, "num_stages", None)))


def _patch_autotune(cls) -> None:
    """Without a GPU to time them, an autotuned kernel runs one config: the first in _config_key's order, not the
    first listed, so reordering the configs (which changes nothing where the autotuner times them) cannot change
    what the interpreter runs, or a CPU bench's figure (a reordered Liger-style kernel measured 2.47x)."""
    prune = cls.prune_configs

    def prune_configs(self, kwargs):
        configs = prune(self, kwargs)
        if len(configs) > 1:
            _pinned[getattr(self.base_fn, "__name__", "?")] = len(self.configs)
            return [min(configs, key=_config_key)]
        return configs

    cls.prune_configs = prune_configs
