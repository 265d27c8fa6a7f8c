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


def test_an_autotuned_kernel_runs_the_same_config_whatever_the_order():
    """Under the interpreter one config runs (nothing times them): listing the configs in another order must not
    change which, or a candidate that only reorders them 'wins' a CPU bench (helper measured 2.47x on a rotary op)."""
    import triton

    from autokernel import interp
    a = [triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 32}, num_warps=8),
         triton.Config({"BLOCK": 1024}, num_warps=2)]
    first = min(a, key=interp._config_key)
    assert first.kwargs == {"BLOCK": 32}  # by value, not as text ("1024" < "128")
    for order in (a[::-1], a[1:] + a[:1], a[2:] + a[:2]):
        assert min(order, key=interp._config_key) is first


AUTOTUNED = '''
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
from autokernel import interp
assert interp.install()
CONFIGS = [triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 1024})]
def kernel(order):
    @triton.autotune(configs=[CONFIGS[i] for i in order], key=["n"])
    @triton.jit
    def k(out_ptr, n, BLOCK: tl.constexpr):
        tl.store(out_ptr + tl.program_id(0), BLOCK)
    return k
seen = set()
for order in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):
    out = torch.zeros(1, dtype=torch.int32)
    kernel(order)[(1,)](out, 7)
    seen.add(int(out))
print(sorted(seen))
'''


def test_the_interpreter_runs_one_config_whatever_the_listed_order():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", AUTOTUNED], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split()[-1] == "[32]", r.stdout + r.stderr[-2000:]
