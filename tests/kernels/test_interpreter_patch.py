"""autokernel/interp_fixes.py's interpreter fast path (triton.language patched once per launch, not once per
program) gives the same bits as the interpreter as shipped, for every kernel of the project, and skips the repeats it
claims to."""
import importlib
import math
import os
from pathlib import Path

import pytest
import torch
from triton.runtime import interpreter

import kernels
from autokernel import interp_fixes
from autokernel.ops import get

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="about the Triton interpreter; kernels are compiled here")
OPS = sorted(p.stem for p in Path(kernels.__path__[0]).glob("*.py") if not p.stem.startswith("_"))


def _run(op: str):
    spec = get(op)
    shape = min(spec.model_shapes + spec.odd_shapes, key=lambda sh: math.prod(sh.values()))  # the smallest
    kw = spec.make_inputs(shape, torch.float32, "cpu", torch.Generator().manual_seed(0))
    out = getattr(importlib.import_module(f"kernels.{op}"), op)(**kw)
    return [t.clone() for t in (out if isinstance(out, (tuple, list)) else [out])]


@pytest.mark.parametrize("op", OPS)
def test_patching_once_per_launch_gives_the_shipped_interpreters_bits(op, monkeypatch):
    fast = _run(op)
    monkeypatch.setattr(interpreter, "_patch_lang", interp_fixes.SHIPPED["patch_lang"])  # the interpreter as shipped
    monkeypatch.setattr(interpreter.GridExecutor, "__call__", interp_fixes.SHIPPED["launch"])
    shipped = _run(op)
    assert len(fast) == len(shipped)
    for a, b in zip(fast, shipped):  # bit for bit (NaN == NaN where both have it)
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_a_launch_patches_each_language_module_once(monkeypatch):
    real, patch = [], interp_fixes.SHIPPED["patch_lang"]
    monkeypatch.setitem(interp_fixes.SHIPPED, "patch_lang", lambda fn: real.append(fn.__name__) or patch(fn))
    from kernels.rmsnorm import rmsnorm
    spec = get("rmsnorm")
    rmsnorm(**spec.make_inputs({"M": 40, "N": 576}, torch.float32, "cpu", torch.Generator().manual_seed(0)))
    assert real == ["rmsnorm_kernel", "sum"]  # the launch (triton.language), then tl.sum's module (language.core)
