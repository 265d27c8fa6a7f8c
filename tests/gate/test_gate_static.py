"""The static stage on its own: each rule fires on what it targets and stays quiet on what legitimate kernels do."""
from pathlib import Path

import pytest

from autokernel.gate.static import check_file, check_source, find
from gate_fixtures import fixtures

KERNELS = Path(__file__).resolve().parents[2] / "kernels"

HEAD = '''import math

import torch
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < N), mask=offs < N)

'''


def launcher(body: str, params: str = "x: torch.Tensor, weight: torch.Tensor, eps: float") -> str:
    """A candidate for rmsnorm whose launcher is `body` (indented 4), after an allocation and a launch."""
    return HEAD + f'''
def rmsnorm({params}) -> torch.Tensor:
    M, N = x.shape
    y = torch.empty_like(x)
    k[(M,)](x, y, N, BLOCK=1024)
''' + "".join(f"    {line}\n" for line in body.strip().splitlines())


def reasons(src: str, op: str = "rmsnorm") -> list[str]:
    return [f.reason for f in find(src, op)]


def test_minimal_launcher_passes():
    assert reasons(launcher("return y")) == []


@pytest.mark.parametrize("path", sorted(p for p in KERNELS.glob("*.py") if p.stem != "__init__"), ids=lambda p: p.stem)
def test_every_baseline_kernel_passes(path):
    """A gate that rejects the kernels it is meant to improve is useless: each kernels/<op>.py must pass static."""
    r = check_file(path, path.stem)
    assert r.passed, r.detail


@pytest.mark.parametrize("fx", [f for f in fixtures() if f.expect.startswith("static.")], ids=lambda f: f.id)
def test_static_fixture_rejected_with_its_reason(fx):
    r = check_file(fx.path, fx.op)
    assert not r.passed and r.reason == fx.expect, r.detail


# --- rules that must fire -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, reason", [
    ("return torch.matmul(y, y)", "static.forbidden_call"),
    ("return torch.softmax(y, -1)", "static.forbidden_call"),
    ("return y.softmax(-1)", "static.forbidden_call"),
    ("return y.sum(-1)", "static.forbidden_call"),
    ("return y.exp()", "static.forbidden_call"),
    ("return y @ y", "static.forbidden_call"),
    ("return y.float()", "static.forbidden_call"),
    ("return y.tolist()", "static.forbidden_call"),
    ("return y.numpy()", "static.forbidden_call"),
    ("return torch.compile(k)(y)", "static.forbidden_call"),
    ("return torch.ops.aten.mm(y, y)", "static.forbidden_call"),
    ("t = torch\nreturn t.rsqrt(y)", "static.forbidden_call"),
    ("r = torch.rsqrt\nreturn r(y)", "static.forbidden_call"),
    ("return torch.from_numpy(y)", "static.forbidden_call"),
    ("return torch.tensor([1.0])", "static.forbidden_call"),
    ("torch.cuda.synchronize()\nreturn y", "static.forbidden_call"),
    ("s = torch.cuda.Stream()\nreturn y", "static.forbidden_call"),
    ("return y.half()", "static.precision"),
    ("return y.to(torch.bfloat16)", "static.precision"),
    ("z = torch.empty(4, dtype=torch.float16)\nreturn y", "static.precision"),
    ("torch.set_float32_matmul_precision('high')\nreturn y", "static.precision"),
    ("torch.backends.cuda.matmul.allow_tf32 = True\nreturn y", "static.precision"),
    ("y.foo = 1\nreturn y", "static.mutable_state"),
    ("return y.__class__", "static.forbidden_attribute"),
    ("return y._version", "static.forbidden_attribute"),
    ("return y.data_ptr()", "static.forbidden_call"),
    ("return y if id(x) else y", "static.forbidden_call"),
    ("return eval('y')", "static.forbidden_call"),
    ("return getattr(torch, 'exp')(y)", "static.forbidden_call"),
    ("return globals()['y']", "static.forbidden_call"),
    ("return __import__('torch').exp(y)", "static.forbidden_call"),
    ("return k.fn(y)", "static.forbidden_call"),
    ("k.run(x, y, N, grid=(1,), warmup=False, BLOCK=1024)\nreturn y", "static.forbidden_call"),
    ("try:\n    return y\nexcept Exception:\n    return x", "static.fallback"),
    ("try:\n    pass\nfinally:\n    return y", "static.fallback"),
    ("if N == 576:\n    return y\nreturn y", "static.shape_special_case"),
    ("if x.shape[-1] == 576:\n    return y\nreturn y", "static.shape_special_case"),
    ("if (M, N) == (96, 576):\n    return y\nreturn y", "static.shape_special_case"),
    ("if N in (576, 1536):\n    return y\nreturn y", "static.shape_special_case"),
    ("T = M * N\nif T != 55296:\n    return y\nreturn y", "static.shape_special_case"),
    ("return y if x.size(0) == 96 else y", "static.shape_special_case"),
])
def test_rule_fires(body, reason):
    assert reason in reasons(launcher(body)), (body, find(launcher(body), "rmsnorm"))


@pytest.mark.parametrize("module", ["os", "sys", "gc", "inspect", "ctypes", "subprocess", "threading",
                                    "multiprocessing", "signal", "importlib", "builtins", "pickle", "socket", "time",
                                    "functools", "numpy", "torch.nn.functional", "torch.cuda", "triton.testing",
                                    "autokernel.ops.rmsnorm", "kernels.rmsnorm", "kernels.matmul", "_thread", "io"])
def test_import_forbidden(module):
    assert reasons(f"import {module}\n" + launcher("return y"))[:1] == ["static.forbidden_import"]


@pytest.mark.parametrize("stmt", ["from kernels import rmsnorm as old", "from kernels.rmsnorm import *",
                                  "from autokernel.ops import get", "from . import rmsnorm",
                                  "from torch.nn.functional import rms_norm", "from triton.testing import do_bench"])
def test_from_import_forbidden(stmt):
    assert "static.forbidden_import" in reasons(stmt + "\n" + launcher("return y"))


@pytest.mark.parametrize("src_extra, reason", [
    ("_C = {}\n", "static.mutable_state"),  # module state: any mutable object at module level
    ("_L = []\n", "static.mutable_state"),
    ("_S = set()\n", "static.forbidden_call"),
    ("_n = 0\n_n += 1\n", "static.mutable_state"),
    ("_n = 0\n_n = 1\n", "static.mutable_state"),  # bound twice
    ("def _bump():\n    return 1\n", "static.forbidden_syntax"),  # no helper functions besides the launcher
    ("class Lazy(torch.Tensor):\n    pass\n", "static.forbidden_syntax"),
    ("def __getattr__(name):\n    return None\n", "static.forbidden_attribute"),
    ("__getattr__ = None\n", "static.forbidden_attribute"),
    ("torch.Tensor.clone = torch.Tensor.detach\n", "static.mutable_state"),
    ("rmsnorm.calls = 0\n", "static.mutable_state"),
    ("torch.manual_seed(0)\n", "static.forbidden_call"),
    ("async def f():\n    pass\n", "static.forbidden_syntax"),
    ("if True:\n    X = 1\n", "static.forbidden_syntax"),
    ("with torch.no_grad():\n    pass\n", "static.forbidden_syntax"),
    ("try:\n    X = 1\nexcept Exception:\n    X = 2\n", "static.fallback"),
    ("X = [i for i in range(3)]\n", "static.mutable_state"),
    ("X = lambda: 0\n", "static.forbidden_syntax"),
    ("X = torch.float32.__class__\n", "static.mutable_state"),
])
def test_module_level_rule_fires(src_extra, reason):
    assert reason in reasons(launcher("return y") + "\n\n" + src_extra)


def test_autotune_hooks_forbidden():
    src = HEAD.replace("@triton.jit", "@triton.autotune(configs=[triton.Config({}, pre_hook=print)], key=['N'])\n"
                                      "@triton.jit") + launcher("return y")[len(HEAD):]
    assert "static.forbidden_call" in reasons(src)


def test_jit_body_rules():
    body = HEAD.replace("tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < N), mask=offs < N)",
                        "tl.store(y_ptr + offs, torch.exp(tl.load(x_ptr + offs)))")
    assert "static.forbidden_call" in reasons(body + launcher("return y")[len(HEAD):])
    cast = HEAD.replace("tl.load(x_ptr + offs, mask=offs < N)", "tl.load(x_ptr + offs, mask=offs < N).to(tl.float16)")
    assert "static.precision" in reasons(cast + launcher("return y")[len(HEAD):])
    tf32 = HEAD.replace("tl.load(x_ptr + offs, mask=offs < N)", "tl.dot(x, x, input_precision='tf32')")
    assert "static.precision" in reasons(tf32 + launcher("return y")[len(HEAD):])
    aliased = "HALF = tl.bfloat16\n" + cast.replace("tl.float16", "HALF")
    assert "static.precision" in reasons(aliased + launcher("return y")[len(HEAD):])


def test_signature_and_kernel_rules():
    assert reasons(launcher("return y", params="x, w, eps"))[:1] == ["static.signature"]
    assert "static.signature" in reasons(launcher("return y", params="x, weight, eps=1e-6"))
    assert "static.signature" in reasons(launcher("return y") + "\nrmsnorm = None\n")
    assert reasons(HEAD) == ["static.signature"]  # no launcher at all
    no_jit = launcher("return y").replace("@triton.jit\n", "")
    assert "static.no_triton_kernel" in reasons(no_jit)
    no_launch = launcher("return y").replace("    k[(M,)](x, y, N, BLOCK=1024)\n", "")
    assert reasons(no_launch) == ["static.no_triton_kernel"]
    via_helper = launcher("return _go(x, y, N)").replace("    k[(M,)](x, y, N, BLOCK=1024)\n", "") + \
        "\n\ndef _go(x, y, N):\n    k[(1,)](x, y, N, BLOCK=1024)\n    return y\n"
    assert reasons(via_helper)[0] == "static.no_triton_kernel"  # helpers are not part of the grammar
    assert "static.forbidden_syntax" in reasons(via_helper)
    assert reasons("def rmsnorm(x, weight, eps):\n    return (x") == ["static.syntax"]
    assert reasons("x = 1\n" * 200_000) == ["static.syntax"]  # past MAX_SOURCE_BYTES


def test_first_finding_reported_with_the_rest_in_metrics():
    r = check_source("import gc\n" + launcher("try:\n    return y.sum()\nexcept Exception:\n    return y"), "rmsnorm")
    assert r.reason == "static.forbidden_import" and "(+" in r.detail
    assert {f["reason"] for f in r.metrics["findings"]} >= {"static.forbidden_import", "static.fallback",
                                                            "static.forbidden_call"}


# --- what legitimate kernels do must not fire -----------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    "if N > 8192:\n    raise ValueError(N)\nreturn y",
    "assert N <= 8192, N\nreturn y",
    "if N % 16 == 0:\n    pass\nreturn y",
    "if N == 0 or M == 1:\n    return y\nreturn y",
    "if x.dim() == 3:\n    pass\nreturn y",
    "if x.ndim == 2 and len(x.shape) == 2:\n    pass\nreturn y",
    "if x.stride(-1) != 1:\n    x = x.contiguous()\nreturn y",
    "if x.dtype == torch.float16:\n    pass\nreturn y",
    "BLOCK = triton.next_power_of_2(N)\nnum_warps = 8 if BLOCK >= 2048 else 4\nreturn y",
    "grid = lambda meta: (triton.cdiv(M, meta['BLOCK']),)\nk[grid](x, y, N, BLOCK=64)\nreturn y",
    "z = x.reshape(-1, N).view(M, N).contiguous()\nreturn y.reshape(x.shape)",
    "z = torch.zeros((M,), dtype=torch.float32, device=x.device)\nw = torch.empty_like(z)\nreturn y",
    "z = x.new_empty((M, N))\nshape = (*x.shape[:-1], N)\nreturn y.view(shape)",
    "acc = torch.empty((M, N), dtype=x.dtype, device=x.device)\nreturn acc.t().contiguous().t()",
    "ROWS, BLOCK = 4, 1024\nfor i in range(2):\n    BLOCK //= 2\nreturn y",
    "strides = (*x.stride(), *y.stride())\nlead, last = x.shape[:-1], x.shape[-1]\nreturn y.view(*lead, last)",
    "return y if math.log2(N) > 1 else y",
    "info = torch.finfo(x.dtype)\nbig = info.max * 0.5 if x.dtype.is_floating_point else 0\nreturn y",
    "if weight is None:\n    raise ValueError(f'rmsnorm: no weight for {tuple(x.shape)}')\nreturn y",
    "a, b = y.chunk(2, dim=-1)\nz = torch.empty_like(a, memory_format=torch.contiguous_format)\nreturn y",
    "assert x.device == weight.device, (x.device, weight.device)\nreturn y",
    "k[lambda meta: (triton.cdiv(M, meta['BLOCK']),)](x, y, N, BLOCK=64, num_warps=2, num_stages=1)\nreturn y",
    "assert x.dtype in (torch.float16, torch.bfloat16, torch.float32), x.dtype\nreturn y",
])
def test_legit_pattern_passes(body):
    assert reasons(launcher(body)) == [], find(launcher(body), "rmsnorm")


def test_legit_kernel_casts_pass():
    """Casting to the data's own dtype and comparing dtypes inside a kernel are how kernels handle fp16/bf16."""
    src = HEAD.replace("tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < N), mask=offs < N)",
                       "v = tl.load(x_ptr + offs, mask=offs < N).to(tl.float32)\n"
                       "    if v.dtype == tl.bfloat16:\n        v = v.to(tl.float32)\n"
                       "    acc = tl.dot(v, v, input_precision='ieee')\n"
                       "    tl.store(y_ptr + offs, v.to(y_ptr.dtype.element_ty), mask=offs < N)")
    assert reasons(src + launcher("return y")[len(HEAD):]) == []


def test_trace_of_another_op_uses_its_own_launcher():
    """The signature rule reads kernels/<op>.py of the op being replaced, so a matmul candidate needs (x, weight)."""
    src = HEAD + "\ndef matmul(x, weight):\n    y = torch.empty_like(x)\n    k[(1,)](x, y, 1, BLOCK=16)\n" \
                 "    return y\n"
    assert reasons(src, "matmul") == []
    assert "static.signature" in reasons(src.replace("def matmul(x, weight)", "def matmul(a, b)"), "matmul")
