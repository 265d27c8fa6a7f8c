"""The static stage on its own: each rule fires on what it targets and stays quiet on what legitimate kernels do."""
from pathlib import Path

import pytest
from gate_fixtures import fixtures

from autokernel.gate import allowlist, static

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


# The static stage against this project's own kernels/<op>.py, the incumbent a command run here would name.
def find(source, op: str, **kw) -> list[static.Finding]:
    return static.find(source, op, KERNELS / f"{op}.py", **kw)


def check_file(path, op: str, **kw):
    return static.check_file(path, op, KERNELS / f"{op}.py", **kw)


def check_source(source, op: str, **kw):
    return static.check_source(source, op, KERNELS / f"{op}.py", **kw)


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
    ("X = torch.float32.__class__\n", "static.forbidden_attribute"),
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


# --- the grammar: every route around the allowlist is a finding ------------------------------------------------------

@pytest.mark.parametrize("fx", [f for f in fixtures() if not f.expect.startswith("static.")], ids=lambda f: f.id)
def test_fixture_for_later_stages_passes_static(fx):
    """Legitimate rewrites, and the wrong kernels the runtime/numeric stages must catch, are kernel files."""
    r = check_file(fx.path, fx.op)
    assert r.passed, r.detail


@pytest.mark.parametrize("body, reason", [
    ("f = y.reshape\nreturn f(-1)", "static.forbidden_attribute"),  # a bound method stored: never seen as a call
    ("f = y.reshape\nreturn f(-1)", "static.forbidden_call"),  # ... and calling a variable
    ("e = torch.empty\nreturn e(4)", "static.forbidden_attribute"),
    ("return torch.os.environ", "static.forbidden_attribute"),
    ("return triton.runtime.driver", "static.forbidden_attribute"),
    ("return torch['exp']", "static.forbidden_attribute"),  # a module used as a value
    ("return __name__", "static.forbidden_attribute"),
    ("return y.__dict__", "static.forbidden_attribute"),
    ("return y if x.is_cuda else x", "static.forbidden_attribute"),
    ("return y if x.device.type == 'cpu' else x", "static.forbidden_attribute"),
    ("return y if x.device == 'cpu' else x", "static.forbidden_attribute"),
    ("return y if 'cuda' in f'{x.device}' else x", "static.forbidden_attribute"),
    ("torch.zeros(4, out=y)\nreturn y", "static.forbidden_call"),
    ("return y if torch.cuda.is_available() else x", "static.forbidden_call"),
    ("return y if x[0, 0] > 0 else x", "static.forbidden_call"),  # a comparison of tensor data
    ("return y if x.sum() else x", "static.forbidden_call"),
    ("assert x, 'nonzero'\nreturn y", "static.forbidden_call"),  # truth value of a tensor
    ("z = x + 1\nreturn y", "static.forbidden_call"),  # any operator on a tensor
    ("z = -x\nreturn y", "static.forbidden_call"),
    ("t = (x, y)\nz = t[0] * 2\nreturn y", "static.forbidden_call"),  # a tensor out of a tuple is still one
    ("a, b = y.chunk(2)\nreturn a * b", "static.forbidden_call"),
    ("v = int(x[0, 0])\nreturn y", "static.forbidden_call"),
    ("s = f'{x}'\nreturn y", "static.forbidden_call"),  # formatting reads the data
    ("for v in x:\n    pass\nreturn y", "static.forbidden_call"),
    ("z = y[x.long()]\nreturn y", "static.forbidden_call"),
    ("z = y[x > 0]\nreturn y", "static.forbidden_call"),
    ("y[0] = 1.0\nreturn y", "static.forbidden_call"),
    ("z = y.new_full((4,), x[0])\nreturn y", "static.forbidden_call"),
    ("return tuple(x)", "static.forbidden_call"),
    ("g = lambda: 0\nreturn y", "static.forbidden_syntax"),
    ("def inner():\n    return 1\nreturn y", "static.forbidden_syntax"),
    ("while M > 0:\n    M -= 1\nreturn y", "static.forbidden_syntax"),
    ("del M\nreturn y", "static.forbidden_syntax"),
    ("with torch.no_grad():\n    pass\nreturn y", "static.forbidden_syntax"),
    ("z = [i for i in range(M)]\nreturn y", "static.forbidden_syntax"),
    ("if (n := N) > 1:\n    pass\nreturn y", "static.forbidden_syntax"),
    ("d = {'BLOCK': 64}\nreturn y", "static.forbidden_syntax"),
    ("x.zero_()\nreturn y", "static.forbidden_syntax"),  # an expression statement that is not a launch
    ("return k[(M,)](x, y, N, BLOCK=1024)", "static.forbidden_syntax"),
    ("k[(M,)](x, y, N, BLOCK=1024, grid=(1,))\nreturn y", "static.forbidden_call"),
    ("import os\nreturn y", "static.forbidden_import"),
    ("raise SystemExit(0)", "static.forbidden_syntax"),
    ("nonlocal_ = rmsnorm\nreturn y", "static.forbidden_call"),  # the launcher as a value (recursion, re-export)
    ("dt = torch.float16 if M > 64 else x.dtype\nz = torch.empty(4, dtype=dt)\nreturn y", "static.precision"),
    ("k[(M,)](x, y, N, BLOCK=1024, DT=tl.bfloat16)\nreturn y", "static.precision"),
    ("torch.backends.cudnn.allow_tf32 = True\nreturn y", "static.precision"),
    ("if N == 576 or M in (1, 96):\n    pass\nreturn y", "static.shape_special_case"),
    ("BLOCK = (64, 128)[N == 576]\nreturn y", "static.shape_special_case"),  # not only in if tests
])
def test_launcher_grammar_rejects(body, reason):
    assert reason in reasons(launcher(body)), (body, find(launcher(body), "rmsnorm"))


def kernel_with(line: str, extra: str = "") -> str:
    """A candidate whose kernel body ends with `line` (indented 4)."""
    return HEAD.replace("    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < N), mask=offs < N)\n",
                        "    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < N), mask=offs < N)\n" +
                        "".join(f"    {s}\n" for s in line.splitlines())) + extra + launcher("return y")[len(HEAD):]


@pytest.mark.parametrize("line, reason", [
    ("h = offs.handle", "static.forbidden_attribute"),
    ("d = tl.load(x_ptr).handle.data", "static.forbidden_attribute"),
    ("f = k.fn", "static.forbidden_attribute"),
    ("g = offs.__class__", "static.forbidden_attribute"),
    ("v = tl.extra.cuda.libdevice.exp(offs)", "static.forbidden_call"),
    ("v = tl.core.tensor", "static.forbidden_attribute"),
    ("v = tl.device_print('x', offs)", "static.forbidden_call"),
    ("v = tl.map_elementwise(abs, offs)", "static.forbidden_call"),
    ("v = tl.inline_asm_elementwise('mov.b32 $0, $1;', '=r,r', [offs], dtype=tl.int32, is_pure=True, pack=1)",
     "static.forbidden_call"),
    ("print(offs)", "static.forbidden_call"),
    ("v = open('/proc/self/environ')", "static.forbidden_call"),
    ("v = getattr(offs, 'handle')", "static.forbidden_call"),
    ("v = torch.exp(offs)", "static.forbidden_call"),
    ("v = math.exp(1.0)", "static.forbidden_call"),
    ("f = tl.sum\nv = f(offs)", "static.forbidden_call"),  # calling a variable
    ("v = (lambda a: a)(offs)", "static.forbidden_syntax"),
    ("v = [o for o in range(4)]", "static.forbidden_syntax"),
    ("for i in [1, 2]:\n    pass", "static.forbidden_syntax"),
    ("for i in range(4):\n    break", "static.forbidden_syntax"),
    ("try:\n    pass\nexcept Exception:\n    pass", "static.fallback"),
    ("global N", "static.mutable_state"),
    ("offs.cache = 1", "static.mutable_state"),
    ("import os", "static.forbidden_import"),
    ("v = offs[offs]", "static.forbidden_syntax"),
    ("v = tl.dot(offs, offs)", "static.precision"),  # tf32 by default on a GPU
    ("v = tl.dot(offs, offs, input_precision='tf32')", "static.precision"),
    ("v = tl.load(x_ptr + offs).to(tl.float16)", "static.precision"),
    ("ACC: tl.constexpr = tl.bfloat16", "static.precision"),
    ("v = __import__('os')", "static.forbidden_attribute"),
])
def test_kernel_grammar_rejects(line, reason):
    src = kernel_with(line)
    assert reason in reasons(src), (line, find(src, "rmsnorm"))


@pytest.mark.parametrize("line", [
    "v = tl.load(x_ptr + offs, mask=offs < N, other=float('-inf')).to(tl.float32)",
    "if v.dtype == tl.bfloat16:\n    v = v.to(tl.float32)\nacc = tl.dot(v, v, input_precision='ieee')",
    "a, b = offs[:, None], offs[None, :]\nc = tl.where(a < b, a, b).to(y_ptr.dtype.element_ty)",
    "m = tl.full((), 0.0, tl.float32)\nfor s in tl.range(0, N, BLOCK):\n    m = tl.maximum(m, tl.max(offs, axis=0))",
    "i = 0\nwhile i < 4:\n    i += 1",
    "NB: tl.constexpr = BLOCK // 32\nfor j in tl.static_range(NB):\n    pass",
    "v = tl.reduce(offs, 0, k2)\nu = tl.math.exp2(offs.to(tl.float32))\nc = tl.cdiv(N, BLOCK)",
    "tl.static_assert(BLOCK >= 16)\ntl.device_assert(offs >= 0)\ns = x_ptr.dtype.element_ty.primitive_bitwidth",
    # the fused-attention tutorial's spellings: ptr.type.element_ty, and tl.dot's older allow_tf32=False (= ieee)
    "v = tl.load(x_ptr + offs).to(y_ptr.type.element_ty)",
    "a = offs[:, None].to(tl.float32)\nacc = tl.dot(a, tl.trans(a), allow_tf32=False)",
])
def test_kernel_grammar_allows(line):
    src = kernel_with(line, "\n@triton.jit\ndef k2(a, b):\n    return a + b\n\n")
    assert reasons(src) == [], find(src, "rmsnorm")


def test_decorator_grammar():
    def deco(text: str) -> list[str]:
        return reasons(HEAD.replace("@triton.jit\n", text + "@triton.jit\n") + launcher("return y")[len(HEAD):])

    config = "triton.Config({'BLOCK': 64}, num_warps=4, num_stages=2)"
    assert deco(f"@triton.autotune(configs=[{config}], key=['N'])\n") == []
    assert deco("@triton.heuristics({'EVEN': lambda args: args['N'] % args['BLOCK'] == 0})\n") == []
    sweep = "triton.Config({'BLOCK': b * 2}, num_warps=w) for b in (32, 64) for w in range(2, 9, 2) if b * w <= 256"
    assert deco(f"@triton.autotune(configs=[{sweep}], key=['N'])\n") == []
    assert deco("@triton.autotune(configs=[triton.Config({'BLOCK': b}) for b, w in [(32, 4), (64, 8)]], "
                "key=['N'])\n") == []
    # the Triton tutorial's spellings: a module-level list, a function that only returns one, named only in configs=
    assert deco("@triton.autotune(configs=CONFIGS, key=['N'])\n").count("static.forbidden_syntax") == 1
    for head, use in ((f"CONFIGS = [{config}]\n\n\n", "CONFIGS"),
                      (f"def get_configs():\n    return [{config}]\n\n\n", "get_configs()")):
        src = HEAD.replace("@triton.jit\n", head + f"@triton.autotune(configs={use}, key=['N'])\n@triton.jit\n")
        assert reasons(src + launcher("return y")[len(HEAD):]) == [], find(src + launcher("return y")[len(HEAD):],
                                                                           "rmsnorm")
    for bad, reason in [
        ("@triton.autotune(configs=[triton.Config({}, num_warps=4)], key=['N'], reset_to_zero=['y_ptr'])\n",
         "static.forbidden_call"),
        ("@triton.autotune(configs=[triton.Config({}, num_warps=4)], key=['N'], restore_value=['y_ptr'])\n",
         "static.forbidden_call"),
        ("@triton.autotune(configs=[triton.Config({}, post_hook=print)], key=['N'])\n", "static.forbidden_call"),
        ("@triton.autotune(configs=[triton.Config({'B': M})], key=['N'])\n", "static.forbidden_syntax"),
        ("@triton.autotune(configs=CONFIGS, key=['N'])\n", "static.forbidden_syntax"),
        # a comprehension is expanded only over literals (and the configs it makes are checked as if written out)
        ("@triton.autotune(configs=[triton.Config({'B': b}) for b in SIZES], key=['N'])\n",
         "static.forbidden_syntax"),
        ("@triton.autotune(configs=[triton.Config({'B': b}) for b in range(1000)], key=['N'])\n",
         "static.forbidden_syntax"),
        ("@triton.autotune(configs=[triton.Config({'B': b}, pre_hook=print) for b in (1, 2)], key=['N'])\n",
         "static.forbidden_call"),
        ("@triton.autotune(configs=[triton.Config({'B': b + M}) for b in (1, 2)], key=['N'])\n",
         "static.forbidden_syntax"),
        ("@triton.autotune(configs=[triton.Config({'B': (lambda: b)()}) for b in (1, 2)], key=['N'])\n",
         "static.forbidden_syntax"),
        ("@triton.heuristics({'B': lambda args: args['x_ptr'].data_ptr() % 7})\n", "static.forbidden_call"),
        ("@triton.heuristics({'B': lambda args: print(args)})\n", "static.forbidden_call"),
        ("@triton.heuristics({'B': lambda args, n=[0]: 1})\n", "static.forbidden_syntax"),
        ("@triton.heuristics({'B': lambda args: 64 if args['N'] == 576 else 128})\n", "static.shape_special_case"),
        ("@functools.lru_cache\n", "static.forbidden_call"),
    ]:
        assert reason in deco(bad), (bad, deco(bad))


@pytest.mark.parametrize("text, reason", [
    ("import torch as T\n", "static.forbidden_import"),
    ("import triton.language as language\n", "static.forbidden_import"),
    ("from triton.language import extra\n", "static.forbidden_import"),
    ("from triton.language import sum as tlsum\n", "static.forbidden_import"),
    ("from triton import runtime\n", "static.forbidden_import"),
    ("from typing import TYPE_CHECKING\n", "static.forbidden_import"),
    ("import kernels\n", "static.forbidden_import"),
    ("from __future__ import barry_as_FLUFL\n", "static.forbidden_import"),
])
def test_import_grammar(text, reason):
    assert reason in reasons(text + launcher("return y")), text


def test_allowed_imports_and_constants():
    src = ("from __future__ import annotations\nfrom triton import cdiv, next_power_of_2\n"
           "from triton.language import constexpr\n" + launcher("B = next_power_of_2(cdiv(N, 2))\nreturn y") +
           "\n\nLOG2E = 1.4426950408889634\nTILE: constexpr = tl.constexpr(64)\nSHAPES = ((1, 2), (3, -4))\n"
           "BIG = 2 ** 20 - 1\nACC = tl.float32\nHALF_PI = math.pi / 2\n__all__ = ['rmsnorm']\n")
    assert reasons(src) == [], find(src, "rmsnorm")


def test_inline_asm_only_when_the_policy_allows():
    from autokernel.policy import Gate, Policy
    src = kernel_with("v = tl.inline_asm_elementwise('mov.b32 $0, $1;', '=r,r', [offs], dtype=tl.int32, "
                      "is_pure=True, pack=1)")
    assert check_source(src, "rmsnorm").reason == "static.forbidden_call"
    assert "gate.allow_inline_asm" in check_source(src, "rmsnorm").detail
    assert check_source(src, "rmsnorm", allow_inline_asm=True).passed
    assert check_source(src, "rmsnorm", policy=Policy(gate=Gate(allow_inline_asm=True))).passed
    assert not check_source(src, "rmsnorm", policy=Policy()).passed


def test_every_finding_kept_most_telling_first():
    src = "import os\n" + launcher("try:\n    z = x * 2\nexcept Exception:\n    return __name__\nreturn y") + \
        "\n\n_CACHE = {}\n"
    r = check_source(src, "rmsnorm")
    got = [f["reason"] for f in r.metrics["findings"]]
    assert got[:3] == ["static.forbidden_import", "static.fallback", "static.mutable_state"]
    assert {"static.forbidden_call", "static.forbidden_attribute"} <= set(got)  # inside the try, too
    assert got == sorted(got, key=static.REASON_ORDER.index)
    assert all(f["line"] > 0 and f["detail"] and "\n" not in f["detail"] for f in r.metrics["findings"])


# --- the tables ------------------------------------------------------------------------------------------------------

def test_runtime_guard_reads_the_same_tables():
    """The aten allowlists the sandboxed guard applies are the objects in gate/allowlist.py, not copies."""
    from autokernel.gate import child
    for name in ("ALLOC", "VIEW", "COPY", "LAUNCH_ONLY", "POISONED"):
        assert getattr(child, name) is getattr(allowlist, name), name


def test_launcher_methods_are_ops_the_runtime_allows():
    """Every tensor method the grammar lets a launcher call is metadata or an aten op the runtime guard allows, so
    the two lines of defence never disagree about what a launcher may do."""
    runtime = allowlist.ALLOC | allowlist.VIEW | allowlist.COPY
    assert {op for op in allowlist.TENSOR_METHODS.values() if op} <= runtime
    assert allowlist.TORCH_ALLOC <= allowlist.ALLOC
    assert not allowlist.TL_FUNCTIONS & set(allowlist.TL_POLICY) and not allowlist.TL_FUNCTIONS & set(
        allowlist.TL_NEVER)


def test_the_tables_decide(monkeypatch):
    """The rules read the tables: allowlisting a method makes its call pass (so a table edit is a security edit)."""
    src = launcher("z = y.t()\nreturn y")
    assert reasons(src) == []
    monkeypatch.setattr(allowlist, "TENSOR_METHODS", {k: v for k, v in allowlist.TENSOR_METHODS.items() if k != "t"})
    assert "static.forbidden_call" in reasons(src)


def test_describe_is_short_and_names_the_grammar():
    text = allowlist.describe()
    assert len(text) < 6000 and text.count("\n") < 20
    for word in ("import triton.language as tl", "tl.constexpr", "inline_asm_elementwise", "kernel[grid]",
                 "empty_like", "cdiv", "input_precision", "getattr", "static.precision"):
        assert word in text, word


@pytest.mark.parametrize("src", [
    launcher("math = x\nz = math.floor()\nreturn y"),  # a module name rebound to a tensor
    launcher("k = x\nreturn y"),
    launcher("g = lambda torch: (1,)\nreturn y"),
    kernel_with("tl = offs"),
    HEAD.replace("def k(x_ptr,", "def k(math, x_ptr,") + launcher("return y")[len(HEAD):],
])
def test_module_names_cannot_be_rebound(src):
    assert "static.forbidden_syntax" in reasons(src), find(src, "rmsnorm")


@pytest.mark.parametrize("arg", ["torch.Tensor", "int", "grid", "torch.finfo(x.dtype)", "x.device"])
def test_kernel_arguments_are_data(arg):
    src = launcher(f"grid = lambda meta: (M,)\nk[(M,)](x, y, N, BLOCK=1024, num_warps={arg})\nreturn y")
    assert "static.forbidden_call" in reasons(src), find(src, "rmsnorm")


# --- bit reinterpretation and the grid's size (docs/shortcuts.md #13 and #11) ---------------------------------------

def _kernel_line(line: str) -> str:
    """A rmsnorm candidate whose kernel body has `line` after its loads."""
    return '''import torch
import triton
import triton.language as tl

LIMIT = 64
ON = True


@triton.jit
def k(x_ptr, y_ptr, M, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N)
''' + "".join(f"    {s}\n" for s in line.strip().splitlines()) + '''    tl.store(y_ptr + offs, x, mask=offs < N)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    M, N = x.shape
    y = torch.empty_like(x)
    k[(M,)](x, y, M, N, BLOCK=1024)
    return y
'''


@pytest.mark.parametrize("line", [
    "x = (x.to(tl.int32, bitcast=True) & -65536).to(tl.float32, bitcast=True)",
    "x = tl.cast(tl.cast(x, tl.int32, bitcast=True) & -65536, tl.float32, bitcast=True)",
    "x = x.to(tl.int32, None, True)",
    "x = tl.cast(x, tl.int32, None, True)",
    "x = x.to(tl.int32, bitcast=ON)",
    "b = tl.load(x_ptr.to(tl.pointer_type(tl.int32)) + offs)",
    "b = tl.load(tl.cast(x_ptr, tl.pointer_type(tl.uint16)) + offs)",
])
def test_bit_reinterpretation_is_precision(line):
    assert "static.precision" in reasons(_kernel_line(line)), find(_kernel_line(line), "rmsnorm")


@pytest.mark.parametrize("line", ["x = x.to(tl.int32, bitcast=False)", "x = x.to(tl.int32)",
                                  "x = tl.cast(x, tl.float32)", "x = x.to(y_ptr.dtype.element_ty)"])
def test_value_casts_are_not_reinterpretation(line):
    assert reasons(_kernel_line(line)) == [], find(_kernel_line(line), "rmsnorm")


def test_reinterpretation_follows_the_incumbent():
    """matmul_q4_1's incumbent reads its packed codes as uint32 words: a candidate may too, and nothing else."""
    src = (KERNELS / "matmul_q4_1.py").read_text()
    assert "tl.pointer_type(tl.uint32)" in src and reasons(src, "matmul_q4_1") == []
    assert "static.precision" in reasons(src.replace("tl.pointer_type(tl.uint32)", "tl.pointer_type(tl.int16)"),
                                         "matmul_q4_1")
    assert "static.precision" in reasons(_kernel_line("b = tl.load(x_ptr.to(tl.pointer_type(tl.uint32)) + offs)"))


@pytest.mark.parametrize("body", ["xi = x.view(torch.int32)\nreturn y", "return y.view(torch.int32).view(x.dtype)"])
def test_host_dtype_views_are_precision(body):
    assert "static.precision" in reasons(launcher(body))


@pytest.mark.parametrize("line", [
    "if tl.num_programs(0) > 64:\n    x = x * 0.5",
    "n = tl.num_programs(0)\nif n == 97:\n    x = x * 0.5",
    "n = tl.num_programs(0) * 2\nbig = n // LIMIT\nx = x * big",
    "n = tl.minimum(tl.num_programs(0), 64)\nx = x * n",
    "if tl.num_programs(0) >= BLOCK:\n    x = x * 0.5",
    "if tl.num_programs(0) > tl.cdiv(6400, LIMIT):\n    x = x * 0.5",
    "x = tl.where(tl.num_programs(1) != 1, x * 0.5, x)",
    "s = (tl.num_programs(0) >> 7) & 1\nx = x * s",
    # the "other side" hides its constant in arithmetic on a run-time value: any decision on the grid size is out
    "if tl.num_programs(0) > M * 0 + 300:\n    x = x * 0.5",
    "big = tl.num_programs(0) - M * 0\nif big > (M >= 0) * 300:\n    x = x * 0.5",
    "x = tl.where(tl.num_programs(0) - 300, x, x * 0.5)",
    "x = x * 0.5 if tl.num_programs(0) > M // (M + 1) + 300 else x",
    "n = tl.num_programs(0)\nx = x * (n // (M + 300))",
    # a grid-derived offset in a comparison: rejected too (write the persistent loop as range(start, end, step))
    "if pid < tl.num_programs(0) - 1:\n    x = x * 0.5",
    "step = tl.num_programs(0) * BLOCK\nrows = pid * BLOCK + step + offs\nx = tl.where(rows < M, x, 0.0)",
    # a grid-strided walk starts at the program id: from anything else it is the grid's size again
    "n = 0\nn += tl.num_programs(0)\nif n > 64:\n    x = x * 0.5",
    "n = M * 0 + tl.num_programs(0)\nif n > 64:\n    x = x * 0.5",
])
def test_grid_size_in_a_decision_is_a_shape_special_case(line):
    assert "static.shape_special_case" in reasons(_kernel_line(line)), find(_kernel_line(line), "rmsnorm")


@pytest.mark.parametrize("line", [
    "for r in range(pid, M, tl.num_programs(0)):\n    x = x + r",
    "for start in tl.range(pid * BLOCK, M, tl.num_programs(0) * BLOCK):\n    x = tl.where(start + offs < M, x, 0.0)",
    "n = tl.num_programs(0)\nfor r in range(pid, M, n):\n    x = x + r * n",
    "if pid > 100:\n    x = x * 0.5",  # program-id thresholds: the numeric stage's sweep (grid_special_cases)
    # persistent kernels written with while or a counted loop (an honest rewrite was static.shape_special_case)
    "row = pid\nwhile row < M:\n    x = x + row\n    row += tl.num_programs(0)",
    "nprog = tl.num_programs(0)\nfor i in range(0, tl.cdiv(M, nprog)):\n    row = pid + i * nprog\n"
    "    x = tl.where(row < M, x, 0.0)",
])
def test_grid_size_as_a_stride_is_legitimate(line):
    assert reasons(_kernel_line(line)) == [], find(_kernel_line(line), "rmsnorm")


@pytest.mark.parametrize("stem, rule", [
    ("precision_bit_truncation", "static_kernel.reinterpret"),
    ("precision_cast_bitcast_large_rows", "static_kernel.reinterpret"),
    ("precision_pointer_retype", "static_kernel.reinterpret"),
    ("precision_host_int_view", "static_kinds.host_view_dtype"),
    ("grid_num_programs_threshold", "static_kernel.grid_special_cases"),
    ("grid_num_programs_window", "static_kernel.grid_special_cases"),
    ("grid_num_programs_arith", "static_kernel.grid_special_cases"),
])
def test_each_rule_is_what_rejects_its_fixtures(monkeypatch, stem, rule):
    """Defence removed, the fixture passes the static stage: the rule, not some other finding, stops it."""
    fx = next(f for f in fixtures() if f.path.stem == stem)
    assert not check_file(fx.path, fx.op).passed
    from autokernel.gate import static_kernel, static_kinds  # noqa: F401 -- named by `rule`
    module, name = rule.split(".")
    monkeypatch.setattr(locals()[module], name, lambda *a, **k: None)
    r = check_file(fx.path, fx.op)
    assert r.passed, r.detail


def test_typing_names_are_for_annotations_only():
    """`from typing import Tuple` for `-> Tuple[torch.Tensor, torch.Tensor]` (an honest add_rmsnorm rewrite) was
    static.forbidden_import; the generic aliases may annotate, never be values in a launcher or a kernel."""
    head = "from typing import Optional, Tuple\n" + HEAD
    ok = head + launcher("return y", "x: torch.Tensor, weight: Optional[torch.Tensor], eps: float")[len(HEAD):]
    assert reasons(ok) == [], find(ok, "rmsnorm")
    assert reasons(ok.replace("    return y", "    t = Tuple\n    return y")) == ["static.forbidden_syntax"]
    kernel = ok.replace("    offs = tl.arange(0, BLOCK)\n", "    offs = tl.arange(0, BLOCK)\n    t = Optional\n")
    assert reasons(kernel), find(kernel, "rmsnorm")
    assert "static.forbidden_import" in reasons("from typing import get_type_hints\n" + ok)
