"""Coverage shortcuts (docs/shortcuts.md): a kernel exact for small M that cheats only for large M.

The cov_* fixtures under fixtures/rmsnorm/ go through the whole gate in test_gate_cheats.py (the legitimate one in
test_gate_redteam.py; their `# max-rows` header sets policy gate.max_rows). Here: the threshold extraction and the
range plan as units, and the proof that each cheating cov_* fixture is accepted with the defence off (max_rows 0: the
cost-bounded sweep alone), so the red-team verdict is the range sweep's doing.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from gate_fixtures import QUICK_DTYPES, QUICK_SHAPES, fixtures

from autokernel.gate import schedule, thresholds, verify
from autokernel.ops import get
from autokernel.paths import INSTALLED_LAYOUT
from autokernel.policy import Policy

COV = [f for f in fixtures() if f.path.stem.startswith("cov_")]


def test_thresholds_are_read_from_every_comparison():
    src = '''
LIMIT = 1 << 12
BIG = LIMIT + 2
@triton.heuristics({"B": lambda a: 64 if a["M"] >= 7000 else 32})
@triton.jit
def k(x, M, N, LOW: tl.constexpr):
    row = tl.program_id(0)
    if row > 4000:
        pass
def launch(x):
    M, N = x.shape
    low = M * N > 3 * 1000 * 576
    grid = (M if M < 5000 else M // 2,)
    half = BLOCK if triton.next_power_of_2(M) <= 2048 else BLOCK // 2
    ok = M != BIG and N == 1 and x.ndim == 2 and M > -9 and M >= LIMIT
'''
    got = thresholds.extract(src)
    assert {4096, 7000, 4000, 3000, 1728000, 5000, 2048, 4098} <= got
    assert not got & {0, 1, -9}  # 1 and below are not thresholds (`N == 1`, `M > -9`)
    assert thresholds.extract("def f(:\n") == set()


def test_thresholds_passed_as_arguments_are_read_where_the_parameter_is_compared():
    """A constant reaches the comparison through a parameter: positional and keyword launch arguments, a Config
    dict, a default. Only names that some comparison uses count (a block size passed along is no threshold)."""
    src = '''
@triton.jit
def k(x, M, LO, HI: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr):
    if (M > LO) & (M < HI) | (M > CAP):
        pass
def helper(m, lim=900):
    return m >= lim
def launch(x):
    k[(1,)](x, x.shape[0], 333, HI=337, CAP=CAP_ROWS, BLOCK=4096)
CAP_ROWS = 2 * 700
configs = [triton.Config({"LO": 1500})]
'''
    got = thresholds.extract(src)
    assert {333, 337, 1400, 900, 1500} <= got and 4096 not in got
    fx = next(f for f in COV if f.path.stem == "cov_threshold_kernel_arg")
    assert {333, 337} <= thresholds.extract(fx.path.read_bytes())


def test_constants_that_arithmetic_combines_with_a_shape_are_thresholds():
    """A comparison hidden in arithmetic: the window [520, 904) has no comparison in the file."""
    src = (
        "def launch(x):\n"
        "    M, N = x.shape\n"
        "    n_sum = N - (N // 2) * (1 - min(1, abs((M - 520) // 384)))\n"
        "    step = max(0, M - 2 * 700) & 4095\n"
        "    block = 4096\n"
    )
    got = thresholds.extract(src)
    assert {520, 384, 1400, 4095} <= got and 4096 not in got  # a constant assigned, not combined, is no threshold
    fx = next(f for f in COV if f.path.stem == "cov_arith_window")
    assert {384, 520} <= thresholds.extract(fx.path.read_bytes())


def test_threshold_rows_put_each_threshold_on_both_sides():
    rows = thresholds.rows({3000, 1728000}, {"M": 4, "N": 576}, "M", 8192)
    assert {2999, 3000, 3001} <= set(rows)  # T itself
    assert {2999, 3000, 3001} <= set(thresholds.rows({1728000}, {"M": 4, "N": 576}, "M", 8192))  # T // N
    assert max(rows) <= 8192 and min(rows) >= 1
    assert thresholds.rows({10 ** 6}, {"M": 4, "N": 1}, "M", 8192) == []  # past max_rows: not vouched for


def test_range_reaches_max_rows_with_secret_jitter():
    spec = get("rmsnorm")
    traced = [{"M": 4, "N": 576}]
    a = schedule.range_shapes(spec, traced, seed=1, max_rows=8192)
    b = schedule.range_shapes(spec, traced, seed=2, max_rows=8192)
    ms = [s["M"] for s in a]
    assert all(s["N"] == 576 for s in a)
    assert max(ms) > 8192 - 8192 // 64 and max(ms) <= 8192  # near the top ...
    odd, even = [m for m in ms if m % 2], [m for m in ms if not m % 2]
    for p in (512, 1024, 2048, 4096):  # one odd value just under each power of 2 on the way (a block's tail) ...
        assert any(p - p // 8 <= m < p for m in odd), p
    for p in (512, 1024, 2048, 4096, 8192):  # ... and a secret block multiple in each octave (production's sizes)
        assert [m for m in even if p // 2 < m <= p and m % 64 == 0], (p, even)
    assert ms != [s["M"] for s in b]  # the values follow the secret seed
    assert schedule.range_shapes(spec, traced, seed=1, max_rows=0) == []


def test_plan_adds_range_and_threshold_cases_as_single_mixed_calls():
    spec = get("rmsnorm")
    dists = ("normal", "mixed")
    base = schedule.plan(spec, [{"M": 4, "N": 576}], [torch.float32], list(dists), dists, 3)
    ranged = schedule.plan(spec, [{"M": 4, "N": 576}], [torch.float32], list(dists), dists, 3, 8192, {3000})
    new = [c for c in ranged if c not in base]
    assert {2999, 3000, 3001} <= {c[0]["M"] for c in new}
    assert all(c[2] == "mixed" and c[3] == schedule.SINGLE for c in new)
    assert ranged[:len(base)] == base  # planned last: cheaper cases turn most wrong kernels away first


def test_rope_and_attention_range_their_tokens_up_to_the_context():
    rope = get("rope")
    shapes = schedule.range_shapes(rope, [dict(s) for s in rope.model_shapes], 5, 8192)
    assert shapes and all(s["B"] == 1 for s in shapes) and max(s["T"] for s in shapes) > 8000
    att = get("attention")  # prefill: two rows (one padded), one group of query heads, tokens up to the context
    shapes = schedule.range_shapes(att, [dict(s) for s in att.model_shapes], 5, 8192)
    assert shapes and all(s["B"] == 2 and s["Hq"] == 3 and s["Hkv"] == 1 for s in shapes)
    assert max(s["T"] for s in shapes) > 8000
    dec = get("attention_decode")  # decode: the filled cache L, the cache's size S with it
    shapes = schedule.range_shapes(dec, [dict(s) for s in dec.model_shapes], 5, 8192)
    assert shapes and all(s["B"] == 2 and s["S"] == s["L"] for s in shapes) and max(s["L"] for s in shapes) > 8000


def test_a_range_case_at_the_models_own_dimensions():
    """Range cases hold the other dimensions small (one batch row, 3 query heads over 1 kv head, a 4,099-row table),
    so a condition on B > 1, Hkv > 1 or the 49,152 vocabulary together with a long sequence never ran (issue 25).
    One more case puts them at the model's values, far past the sweep, at most MODEL_DIMS_COST_FACTOR times the top
    range case's cost; none where the range already runs at them (rmsnorm's hidden size, matmul's N and K)."""
    want = {"attention": {"B": 4, "Hq": 9, "Hkv": 3, "D": 64}, "attention_decode": {"B": 4, "Hq": 9, "Hkv": 3},
            "rope": {"B": 4, "H": 9}, "softmax": {"V": 49152}, "embedding": {"B": 4, "V": 49152, "D": 576},
            "embedding_q8_0": {"B": 4, "V": 49152}}
    for op, dims in want.items():
        spec = get(op)
        traced = [dict(s) for s in spec.model_shapes]
        dim = schedule.range_dim(spec, traced)[0]
        for max_rows in (1024, 8192):
            top = schedule.range_shapes(spec, traced, 5, max_rows)[-1]
            shape = schedule.model_dims_shape(spec, traced, 5, max_rows)
            assert {k: shape[k] for k in dims} == dims, (op, shape)
            assert schedule.cost(spec, shape) <= schedule.MODEL_DIMS_COST_FACTOR * schedule.cost(spec, top)
            assert shape[dim] > 2 * max(s[dim] for s in traced) + 1 and shape[dim] >= max_rows // 8, (op, shape)
            assert shape.get("S", shape[dim]) == shape[dim]  # decode: the cache's size with it
        dists = ("normal", "mixed")
        planned = schedule.plan(spec, None, [torch.float32], list(dists), dists, 5, 1024)
        assert (schedule.model_dims_shape(spec, traced, 5, 1024), torch.float32, "mixed", schedule.SINGLE) in planned
    for op in ("rmsnorm", "add_rmsnorm", "silu_mul", "matmul"):
        assert schedule.model_dims_shape(get(op), [dict(s) for s in get(op).model_shapes], 5, 8192) is None


def _old_gate(fx, tmp_path, coverage: bool = False):
    return verify(fx.op, fx.path, run_dir=tmp_path / f"{fx.path.stem}-{coverage}", shapes=QUICK_SHAPES.get(fx.op),
                  dtypes=QUICK_DTYPES, dists=fx.dists, stages=[], kernels_dir=INSTALLED_LAYOUT.kernels,
                  policy=Policy(gate={"max_rows": 0, "require_coverage": coverage}))


@pytest.mark.slow
def test_cov_fixtures_pass_without_the_range_sweep_and_coverage(tmp_path):
    """Each cheating cov_* fixture is accepted with max_rows 0 and no coverage requirement: the defences, not
    something else, reject it; and the coverage requirement alone (no range sweep) rejects every one of them."""
    cheats = [f for f in COV if f.expect != "accepted"]
    assert len(cheats) >= 8
    with ThreadPoolExecutor(max_workers=2) as pool:
        verdicts = list(pool.map(lambda f: _old_gate(f, tmp_path), cheats))
        covered = list(pool.map(lambda f: _old_gate(f, tmp_path, coverage=True), cheats))
    assert [v.verdict for v in verdicts] == ["accepted"] * len(cheats), [(v.candidate, v.reason) for v in verdicts]
    assert not [v for v in covered if v.accepted], [(v.candidate, v.reason) for v in covered if v.accepted]
