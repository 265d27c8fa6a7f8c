"""Declared sizes (`sizes` in an op's table, autokernel/target/contract.py): the workload's model has one hidden
size, the engine serves others. Without a declaration the gate holds every size but the token count at what the
workload sent, so a kernel exact only at that width is accepted; with `sizes` its columns move to low, high and a
secret size between them, and the same kernel is rejected."""
import re

import pytest
from test_target_gate import DECLARATION, NORM, checkout

from autokernel.errors import UserError
from autokernel.policy import Policy
from autokernel.target import contract
from autokernel.target import declaration as decl
from autokernel.target import gate as target_gate

SIZES = DECLARATION + 'sizes = { hidden = { of = ["x.shape[-1]"], low = 1, high = 1024, also = [37] } }\n'
FIXED_WIDTH = ("BLOCK=_block(x.shape[-1])", "BLOCK=32")  # the toy engine's rows are 32 wide


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _verify(root, tmp_path, source):
    path = tmp_path / "cand" / "norm.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(source)
    return target_gate.verify(root, "norm", path, policy=Policy.model_validate({"gate": {"max_rows": 1024}}),
                              seed=11, stages=[])


def test_a_kernel_exact_only_at_the_recorded_width_is_rejected_where_sizes_are_declared(tmp_path):
    assert FIXED_WIDTH[0] in NORM
    cheat = NORM.replace(*FIXED_WIDTH)
    v = _verify(checkout(tmp_path / "plain"), tmp_path, cheat)
    assert v.accepted, "the class: exact wherever the gate looks when only the token count moves"
    numeric = next(s for s in v.stages if s.name == "numeric")
    assert "NOT CHECKED at other widths" in numeric.detail  # and the verdict says so
    v = _verify(checkout(tmp_path / "sized", SIZES), tmp_path, cheat)
    assert not v.accepted
    assert v.failure.reason in ("numeric.mismatch", "numeric.unwritten"), v.failure.detail


def test_the_incumbent_is_accepted_at_the_declared_sizes(tmp_path):
    v = _verify(checkout(tmp_path / "sized", SIZES), tmp_path, NORM)
    assert v.accepted, [(s.name, s.reason, s.detail) for s in v.stages]
    shapes = v.stages[-1].metrics["shapes"]
    widths = {int(w) for s in shapes for w in re.findall(r"hidden=(\d+)", s)}
    assert {1, 37, 1024} <= widths and len(widths) == 4, shapes  # low, high, the declared also and the secret one
    assert "NOT CHECKED at other widths" not in v.stages[-1].detail and v.stages[-1].metrics["sizes"] == ["hidden"]


def test_the_secret_size_depends_on_the_seed():
    size = decl.Size((("x", -1),), 16, 8192)
    mids = {contract.size_values(size, "hidden", seed)[1] for seed in range(20)}
    assert len(mids) > 10 and all(16 < m < 8192 and m % 2 for m in mids)
    also = decl.Size((("x", -1),), 16, 8192, (431, 6))
    assert all({6, 16, 431, 8192} <= set(contract.size_values(also, "hidden", seed)) for seed in range(20))


def test_a_declared_common_value_is_drawn_and_without_it_never():
    """`common` adds the values production sends to a float argument's draws (the recorded value is one of them):
    a workload that ran one model's eps still gets the other models' exact eps in its cases."""
    import torch
    recorded = ("float", 1e-5)
    rule = {"low": 1e-6, "high": 1e-4}
    plain = [contract._scalar(recorded, torch.Generator().manual_seed(i), rule) for i in range(200)]
    common = [contract._scalar(recorded, torch.Generator().manual_seed(i), {**rule, "common": [1e-6, 3e-5]})
              for i in range(200)]
    assert 1e-6 not in plain and 3e-5 not in plain
    assert {1e-6, 3e-5, 1e-5} <= set(common) and all(1e-6 <= v <= 1e-4 for v in common)


# --- a float argument's declared range (inputs = { eps = { low = ..., high = ... } }) ------------------------------

# a term below an ulp within a factor 10 of the recorded 1e-5, and no branch for coverage to find untaken (a
# min(eps, 1e-3) is rejected as coverage.unreached already); at eps = 1e-2 it adds 10 %
EPS_OFF_FAR = ("_norm_kernel[(rows,)](x, y, eps,", "_norm_kernel[(rows,)](x, y, eps + 1e7 * eps ** 5,")


def test_a_kernel_exact_only_near_the_recorded_scalar_is_rejected_over_the_declared_range(tmp_path):
    """The gate draws a float argument within a factor 10 of what the workload sent (1e-5 here): a kernel whose eps
    term is off only far from it is exact there. Production's models use other eps; with the range declared, the
    draws cover them."""
    assert EPS_OFF_FAR[0] in NORM
    cheat = NORM.replace(*EPS_OFF_FAR)
    assert _verify(checkout(tmp_path / "plain"), tmp_path, cheat).accepted  # the class
    ranged = DECLARATION + "inputs = { eps = { low = 1e-6, high = 0.1 } }\n"
    v = _verify(checkout(tmp_path / "ranged", ranged), tmp_path, cheat)
    assert not v.accepted and v.failure.reason == "numeric.mismatch", v.failure.detail
    assert _verify(checkout(tmp_path / "ok", ranged), tmp_path, NORM).accepted


@pytest.mark.parametrize("line,expect", [
    ('sizes = { hidden = { of = ["y.shape[-1]"], low = 1, high = 64 } }', "is not a tensor parameter"),
    ('sizes = { hidden = { of = ["x.shape[0]"], low = 1, high = 64 } }', "the token count"),
    ('sizes = { hidden = { of = ["x.shape[5]"], low = 1, high = 64 } }', "dimensions"),
    ('sizes = { hidden = { of = ["eps"], low = 1, high = 64 } }', "is not an int parameter"),
    ('sizes = { hidden = { of = ["x.shape[-1]"], low = 64, high = 1 } }', "sizes:"),
    ('sizes = { M = { of = ["x.shape[-1]"], low = 1, high = 64 } }', "sizes:"),
    ('sizes = { hidden = { of = "x.shape[-1]", low = 1, high = 64 } }', "sizes:"),
    ("inputs = { eps = { repeat = 2 } }", "repeat applies to a float tensor"),
    ("inputs = { x = { low = 0, high = 5 } }", "apply to an integer tensor or a float argument"),
    ("inputs = { eps = { low = 1e-6 } }", "both"),
    ("inputs = { nope = { low = 1, high = 2 } }", "no parameter nope"),
    ("inputs = { eps = { low = 0.5, high = 0.1 } }", "A < B"),
    ("inputs = { x = { common = [1.0] } }", "common applies to a float, int or bool argument"),
    ("inputs = { eps = { common = [] } }", "common: 1 to 16 numbers"),
    ("inputs = { eps = { common = [\"1e-5\"] } }", "common: 1 to 16 numbers"),
    ('sizes = { hidden = { of = ["x.shape[-1]"], low = 1, high = 64, also = [0] } }', "sizes:"),
    ('sizes = { hidden = { of = ["x.shape[-1]"], low = 1, high = 64, also = 7 } }', "sizes:"),
    ('doc = "two\\nlines"', "doc: one line of printable text"),
    ("doc = 3", "doc: one line of printable text"),
    ('dtypes = ["int8"]', "dtypes: a list of"),
    ('dtypes = "bfloat16"', "dtypes: a list of"),
])
def test_a_bad_sizes_or_inputs_rule_is_a_user_error(tmp_path, line, expect):
    root = checkout(tmp_path / "bad", DECLARATION + line + "\n")
    with pytest.raises(UserError, match=expect):
        _verify(root, tmp_path, NORM)


# --- dtypes production runs besides the workload's (dtypes = ["float32", "bfloat16"]) -----------------------------

NO_UPCAST = ("x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0).to(tl.float32)",
             "x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0)")  # squares in the input's dtype


def test_a_kernel_exact_only_in_the_workloads_dtype_is_rejected_where_dtypes_are_declared(tmp_path):
    """The workload runs float32 (a CPU engine); production serves half precision. A kernel that drops the float32
    upcast is exact in float32, and in float16 its squares overflow past 256 (the gate's wide values reach
    hundreds), as on a GPU: accepted without `dtypes` (and the verdict says other dtypes were not checked),
    rejected with them; the incumbent is accepted in float16 and bfloat16 (the interpreter's bf16 arithmetic,
    casts and reductions as a GPU's: autokernel/interp.py)."""
    assert NO_UPCAST[0] in NORM
    cheat = NORM.replace(*NO_UPCAST)
    v = _verify(checkout(tmp_path / "plain"), tmp_path, cheat)
    assert v.accepted, "the class: exact in the only dtype the gate makes cases in"
    assert "NOT CHECKED in others" in next(s for s in v.stages if s.name == "numeric").detail
    typed = DECLARATION + 'dtypes = ["float16", "bfloat16"]\n'
    v = _verify(checkout(tmp_path / "typed", typed), tmp_path, cheat)
    assert not v.accepted and v.failure.reason in ("numeric.mismatch", "numeric.nonfinite"), v.failure.detail
    assert "float16" in v.failure.detail
    v = _verify(checkout(tmp_path / "ok", typed), tmp_path, NORM)
    assert v.accepted and "NOT CHECKED in others" not in v.stages[-1].detail, v.stages[-1].detail
    assert set(v.stages[-1].metrics["worst_error_ratio"]) == {"float32", "float16", "bfloat16"}  # judged in each


# --- an int argument production varies (inputs = { chunks = { common = [2, 4] } }) --------------------------------

CHUNKED = {  # the toy norm, per chunk of each row: the engine sends chunks=1, other models 2 or 4
    "toyt/ops/norm.py": '''
import torch
import triton
import triton.language as tl


@triton.jit
def _norm_kernel(x_ptr, y_ptr, eps, n, w, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < w
    base = row * n + tl.program_id(1) * w
    x = tl.load(x_ptr + base + offs, mask=m, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / w + eps)
    tl.store(y_ptr + base + offs, (x * r).to(y_ptr.dtype.element_ty), mask=m)


def norm(x, eps, chunks):
    x = x.contiguous()
    y = torch.empty_like(x)
    rows, w = x.numel() // x.shape[-1], x.shape[-1] // chunks
    _norm_kernel[(rows, chunks)](x, y, eps, x.shape[-1], w, BLOCK=triton.next_power_of_2(w))
    return y
''',
    "toyt/reference.py": '''
import torch


def norm(x, eps, chunks):
    g = x.reshape(*x.shape[:-1], chunks, x.shape[-1] // chunks)
    return (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)).reshape(x.shape)
'''}
ONE_CHUNK = ("rows, w = x.numel() // x.shape[-1], x.shape[-1] // chunks", "rows, w = x.numel() // x.shape[-1], "
             "x.shape[-1]\n    chunks = 1")  # right at the workload's chunks=1 only


def _chunked(root, declaration=DECLARATION):
    import textwrap

    from test_target_gate import ENGINE
    root = checkout(root, declaration)
    for rel, text in CHUNKED.items():
        (root / rel).write_text(textwrap.dedent(text))
    (root / "toyt/engine.py").write_text(textwrap.dedent(ENGINE.replace("1e-5)", "1e-5, 1)")))
    return root


def test_a_kernel_exact_only_at_the_recorded_int_argument_is_rejected_where_its_values_are_declared(tmp_path):
    """Integer arguments stay as recorded (they may be modes): a kernel that ignores `chunks` is exact at the
    workload's 1, and the verdict says chunks was held. Declared common values are drawn, and it is rejected."""
    cheat = CHUNKED["toyt/ops/norm.py"].replace(*ONE_CHUNK)
    assert cheat != CHUNKED["toyt/ops/norm.py"]
    v = _verify(_chunked(tmp_path / "plain"), tmp_path, cheat)
    assert v.accepted, "the class: exact at the only value the gate sends"
    numeric = next(s for s in v.stages if s.name == "numeric")
    assert numeric.metrics["held_ints"] == ["chunks"] and "chunks as the workload sent them" in numeric.detail
    varied = DECLARATION + "inputs = { chunks = { common = [2, 4] } }\n"
    v = _verify(_chunked(tmp_path / "varied", varied), tmp_path, cheat)
    assert not v.accepted and v.failure.reason == "numeric.mismatch", v.failure.detail
    v = _verify(_chunked(tmp_path / "ok", varied), tmp_path, CHUNKED["toyt/ops/norm.py"])
    assert v.accepted and v.stages[-1].metrics["held_ints"] == [], [(s.name, s.reason, s.detail) for s in v.stages]


@pytest.mark.parametrize("line,expect", [
    ("inputs = { chunks = { low = 1, high = 8 } }", "chunks is int, which takes common only"),
    ("inputs = { chunks = { common = [2.0] } }", "chunks is int, so its common values are ints"),
    ("inputs = { chunks = { common = [true] } }", "chunks is int, so its common values are ints"),
])
def test_a_bad_int_argument_rule_is_a_user_error(tmp_path, line, expect):
    with pytest.raises(UserError, match=expect):
        _verify(_chunked(tmp_path / "bad", DECLARATION + line + "\n"), tmp_path, CHUNKED["toyt/ops/norm.py"])


def test_held_arguments_are_the_ints_and_bools_nothing_varies():
    import torch
    lay = contract.Layout(args=(("x", ("tensor", "float32", (7, 32), (32, 1))), ("n", ("int", 7)),
                                ("group", ("int", 1)), ("causal", ("bool", True)), ("mode", ("str", "llama"))),
                          token={"x": (0,)}, token_ints=("n",), dtype=torch.float32, m=(1, 7))
    op = decl.Op("norm", "toyt/ops/norm.py", ["norm"], {"norm": "toyt.reference:norm"})
    assert contract.held_ints(op, [lay]) == ["group", "causal"]  # n is the token count; a str is a mode
    op.inputs = {"causal": {"common": [False]}}
    op.sizes = {"g": decl.Size((("group", None),), 1, 8)}
    assert contract.held_ints(op, [lay]) == []
    draws = {contract._scalar(("bool", True), torch.Generator().manual_seed(i), {"common": [False]}) for i in range(20)}
    assert draws == {True, False}
