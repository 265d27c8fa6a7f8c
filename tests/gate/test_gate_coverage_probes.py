"""Coverage as a gate requirement (autokernel/gate/coverage.py): the probes, what they count, what is exempt, how the
parent merges and judges the child's record, and where the steering goes. Whole-gate runs of the coverage fixtures
are in test_gate_cheats.py / test_gate_redteam.py (headers), the defence-off runs in test_gate_coverage.py."""
from __future__ import annotations

import ast

import numpy as np
import pytest
import torch

from autokernel.gate import coverage, coverage_probe, coverage_steer, numeric
from autokernel.git import report
from autokernel.ops import get

SRC = '''
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, N, FLAG: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    if FLAG:
        tl.store(x_ptr + offs, tl.where(mask, 1.0, 0.0), mask=mask)


def launch(x, M, big):
    N = x.numel()
    assert M < 10 ** 6
    if M > 10 ** 7:
        raise ValueError("too big")
    if N == 0:
        return x
    y = x if x.stride(-1) == 1 else x.contiguous()
    if x.stride(-1) != 1:
        x = x.contiguous()
    b = 4 if M > 600 else 2
    w = min(M, 1024)
    ok = big and M > 3
    g = max(1, min(M, 64))
    return b, w, ok, g, y
'''


def _by_text(sites):
    return {(s.kind, s.text) for s in sites.values()}


def test_sites_are_every_block_condition_and_clamp_but_the_exempt_ones():
    got = _by_text(coverage.sites(SRC))
    for want in [("cond", "offs < N"), ("cond", "FLAG"), ("cond", "mask"), ("cond", "M > 600"),
                 ("pick", "min(M, 1024)"), ("cond", "big"), ("cond", "M > 3"), ("pick0", "max(1, min(M, 64))"),
                 ("pick", "min(M, 64)"), ("block", "offs = tl.arange(0, BLOCK)"),
                 ("block", "tl.store(x_ptr + offs, tl.where(mask, 1.0, 0.0), mask=mask)")]:
        assert want in got, want
    texts = {t for _, t in got}
    # exempt: the assert, the raise guard, the empty-input guard, both contiguous-copy alternatives
    assert not texts & {"M < 10 ** 6", "M > 10 ** 7", "N == 0", "x.stride(-1) == 1", "x.stride(-1) != 1",
                        "return x", "x = x.contiguous()"}
    kernel = {s.text for s in coverage.sites(SRC).values() if s.kernel}
    assert "offs < N" in kernel and "M > 600" not in kernel


def test_a_size_name_bound_to_a_comparison_is_no_empty_guard():
    src = "def f(x):\n    M = x.shape[0]\n    big = M > 600\n    if big:\n        M2 = 1\n    if M:\n        z = 2\n"
    got = _by_text(coverage.sites(src))
    assert ("cond", "big") in got and ("block", "M2 = 1") in got
    assert not any(t == "M" for _, t in got)  # M is an element count: `if M:` is an empty guard


def test_instrumented_code_computes_what_the_plain_code_does():
    src = SRC.split("def launch")[1]
    plain = "def launch" + src
    ns_plain, ns_probed = {}, {}
    exec(compile(plain, "f.py", "exec"), ns_plain)
    rec = coverage_probe.Recorder()
    exec(coverage_probe.compile_instrumented(rec)(plain, "f.py", ns_probed), ns_probed)
    x = torch.arange(6.0)
    for M, big in [(1, True), (700, False), (5000, True)]:
        assert ns_plain["launch"](x, M, big)[:4] == ns_probed["launch"](x, M, big)[:4]
    seen = {coverage.sites(plain)[k].text: v for k, v in rec.seen.items()}
    assert seen["M > 600"] & coverage.TRUE and seen["M > 600"] & coverage.FALSE
    assert seen["min(M, 1024)"] & coverage.TRUE and seen["min(M, 1024)"] & coverage.FALSE
    assert seen["big"] == coverage.REACHED | coverage.TRUE | coverage.FALSE


def test_the_recorder_reads_elementwise_conditions_and_clamps():
    import triton.language as tl
    rec = coverage_probe.Recorder()
    rec.cond("a", np.array([True, False]))
    rec.cond("b", np.array([True, True]))
    rec.cond("c", tl.constexpr(0))
    rec.cond("d", torch.ones(2))  # a torch tensor is never read (that would be host compute in the guard's eyes)
    assert rec.seen == {"a": 7, "b": 3, "c": 5, "d": 9}
    assert rec.pick("e:pick", np.minimum, np.array([1, 5]), np.array([3, 3])).tolist() == [1, 3]
    assert rec.seen["e:pick"] == 7
    rec.pick("f:pick", min, 4, 4)  # a tie picks no side
    rec.pick("g:pick0", max, 1, 1)  # ... except on a literal 0/1 side: the same value as an empty input's
    assert rec.seen["f:pick"] == 1 and rec.seen["g:pick0"] == 3
    assert not coverage.RECORDER.isidentifier()  # no source can name the recorder


def test_the_parent_takes_only_known_sites_and_int_bits_from_the_child():
    known = coverage.sites(SRC)
    key = next(k for k, s in known.items() if s.text == "M > 600")
    into: dict[str, int] = {}
    coverage.merge(into, {key: 3, "999:0:cond": 7, 5: 7}, known)
    coverage.merge(into, {key: "7"}, known)
    coverage.merge(into, ["not", "a", "dict"], known)
    assert into == {key: 3}
    coverage.merge(into, {key: 4 | 1024}, known)
    assert into == {key: 7}


def test_missing_names_what_was_never_seen_and_skips_kernels_where_they_compile():
    known = coverage.sites(SRC)
    seen = {k: coverage.REACHED | coverage.TRUE | coverage.FALSE for k in known}
    assert coverage.missing(known, seen) == []
    key = next(k for k, s in known.items() if s.text == "offs < N")
    seen[key] = coverage.REACHED | coverage.TRUE
    gaps = coverage.missing(known, seen)
    assert [(g.text, why) for g, why in gaps] == [("offs < N", "never false")]
    assert coverage.missing(known, seen, kernels_measured=False) == []
    assert "line" in coverage.describe(gaps, 12) and "offs < N" in coverage.describe(gaps, 12)


def test_constants_of_unreached_conditions_include_float_edges():
    site = coverage.Site("1:0:cond", 1, "cond", "600.5 < M < 700.5", False)
    assert {600, 601, 700, 701} <= coverage_steer.constants([(site, "never true")])


def test_steering_stays_in_the_ops_envelope_and_keeps_tied_dimensions():
    dec = get("attention_decode")
    planned = numeric.plan(dec, None, [torch.float32], ["normal"], 0, 1024, set())
    site = coverage.Site("1:0:cond", 1, "cond", "kv_len > 3000", False)
    done: set[str] = set()
    extra = []
    for round_ in range(3):
        extra += coverage_steer.steer(dec, planned, [(site, "never true")], 7, round_, 1024, done, numeric.DISTS)
    assert extra
    for shape, *_ in extra:
        assert shape["S"] >= shape["L"] and shape["Hq"] % shape["Hkv"] == 0 and shape["D"] % 16 == 0
        assert 16 <= shape["D"] <= 256  # head dims in 16s up to 256 (coverage_steer.STEER_DIMS)
        assert shape["L"] <= 1024 or shape["L"] == shape["S"]
    rms = get("rmsnorm")
    planned = numeric.plan(rms, None, [torch.float32], ["normal"], 0, 0, set())
    site = coverage.Site("1:0:cond", 1, "cond", "N > 4096", False)
    shapes = [s for s, *_ in coverage_steer.steer(rms, planned, [(site, "never true")], 1, 0, 0, set(), numeric.DISTS)]
    assert {"M": 4, "N": 4097} in shapes or any(s["N"] == 4097 for s in shapes)
    assert all(s["N"] <= 8192 for s, *_ in coverage_steer.steer(rms, planned, [], 1, 1, 0, set(), numeric.DISTS))


def test_a_head_size_heuristic_is_steered_past_the_model_head_dim():
    """helper-38: flash attention's `BLOCK_N = 64 if BLOCK_D <= 64 else 32`, honest, was coverage.unreached: every
    model and odd shape has D <= 64 and the head dim was not steerable."""
    att = get("attention")
    planned = numeric.plan(att, None, [torch.float32], ["normal"], 0, 0, set())
    site = coverage.Site("1:0:cond", 1, "cond", "BLOCK_D <= 64", False)
    shapes = [s for s, *_ in coverage_steer.steer(att, planned, [(site, "never false")], 3, 0, 0, set(),
                                                  numeric.DISTS)]
    assert any(s["D"] > 64 for s in shapes), shapes


def test_module_level_code_is_not_instrumented():
    src = "X = 3 if 2 > 1 else 4\n\ndef f(m):\n    return m > X\n"
    tree, sites = coverage.instrument(ast.parse(src), src)
    assert {s.text for s in sites.values()} == {"return m > X", "m > X"}  # the function's block and comparison


def test_the_commit_says_what_the_numeric_stage_did_not_reach():
    gate = {"stages": [{"name": "numeric", "metrics": {"reach": {"dim": "M", "vouched": 1024, "production": 8192,
                                                                  "est_s": 58.0, "checked": False}}}]}
    assert "NOT CHECKED past M = 1024 of production's 8192" in report.reach_line(gate)
    gate["stages"][0]["metrics"]["reach"]["checked"] = True
    assert report.reach_line(gate) is None
    gate["stages"][0]["metrics"]["reach"]["thresholds_left"] = [2047, 2048]
    assert "NOT CHECKED at M = 2047, 2048, where the kernel's thresholds fall" in report.reach_line(gate)


@pytest.mark.slow
def test_the_call_at_productions_maximum_is_the_defence_past_the_cpu_cap(tmp_path, monkeypatch):
    """The reach fixture (keys past a fixed 1280-key window dropped) is exact up to the interpreter's 1024-row cap:
    without the calls past the cap (production's maximum, the secret size per octave: no reach budget) it is accepted,
    and the verdict says how far it was vouched for."""
    from gate_fixtures import QUICK_DTYPES, fixtures

    from autokernel.gate import verify
    from autokernel.paths import INSTALLED_LAYOUT
    from autokernel.policy import Policy
    fx = next(f for f in fixtures() if f.id == "attention_decode/reach_fixed_key_window")
    monkeypatch.setattr(numeric, "REACH_BUDGET_S", 0.0)
    monkeypatch.setattr(numeric, "REACH_WORK", 0.0)
    monkeypatch.setattr(numeric, "REACH_TOP_WORK", 0.0)  # production's maximum is in the floor where linear
    v = verify(fx.op, fx.path, run_dir=tmp_path, dtypes=QUICK_DTYPES, dists=fx.dists, stages=[],
               kernels_dir=INSTALLED_LAYOUT.kernels,
               shapes=[{"B": 1, "Hq": 9, "Hkv": 3, "S": 256, "L": 200, "D": 64}],
               policy=Policy(gate={"max_rows": 8192}))
    assert v.accepted, (v.reason, v.detail)
    assert "vouched up to L = 1024 of production's 8192" in v.stages[-1].detail


def test_a_candidates_constants_cannot_multiply_the_plan():
    """Bounded work (issue: a dead line of constants grew a plan from ~100 cases to 1,107): the thresholds a file
    compares add at most thresholds.MAX_ROWS_FROM_THRESHOLDS range cases, the smallest, and at most
    schedule.MAX_CROSSINGS crossing sizes are planned again in the other dtypes and on the other traced shapes, and
    with "outliers" values in every dtype."""
    from autokernel.gate import schedule, thresholds
    src = open(numeric.__file__.replace("autokernel/gate/numeric.py", "kernels/rmsnorm.py")).read()
    lines = "".join(f"    c{i} = M * {i + 7} + {i * 3 + 1}\n" for i in range(3000))
    big = src.replace("    BLOCK_N = triton.next_power_of_2(N)\n", "    BLOCK_N = triton.next_power_of_2(N)\n" + lines)
    spec = get("rmsnorm")
    base = numeric.plan(spec, None, None, None, 1, 1024, thresholds.extract(src))
    th = thresholds.extract(big)
    assert len(th) > 3000
    bloated = numeric.plan(spec, None, None, None, 1, 1024, th)
    again = schedule.MAX_CROSSINGS * (2 * len(spec.dtypes) - 1 + len(spec.model_shapes))
    assert len(bloated) - len(base) <= thresholds.MAX_ROWS_FROM_THRESHOLDS + again
    assert thresholds.names("A = 3\nB = A * 100\n") == {"A": 3, "B": 300}


def test_an_output_that_is_a_view_of_a_much_larger_buffer_is_refused():
    """Bounded memory: the fixture rmsnorm/bloat_narrow_view (a right answer in a 64x buffer) is rejected by this;
    a plain output, a padded block and a transposed one are not."""
    from autokernel.gate import judge
    assert judge.bloated(torch.empty(64 * 4, 576).narrow(0, 0, 4))
    assert judge.bloated(torch.empty(4, 576)) is None
    assert judge.bloated(torch.empty(4, 1024)[:, :576]) is None  # a row padded to a power of 2
    assert judge.bloated(torch.empty(576, 4).t()) is None
    assert judge.bloated(torch.empty(0)) is None


def test_a_write_past_an_output_is_seen_by_the_guard_bytes_and_only_by_them(tmp_path):
    """Canaries: the fixture rmsnorm/oob_store_tail writes one element past its output on the last row. Its output
    is right (nothing else in the gate sees the write); the guard bytes around the output's storage do."""
    from gate_fixtures import FIXTURES

    from autokernel import kernel_loader
    from autokernel.gate import child
    from autokernel.ops.spec import upcast
    spec = get("rmsnorm")
    kw = spec.make_inputs({"M": 5, "N": 37}, torch.float32, "cpu", torch.Generator().manual_seed(0))
    copy = tmp_path / "rmsnorm.py"
    copy.write_bytes((FIXTURES / "rmsnorm" / "oob_store_tail.py").read_bytes())
    mod = kernel_loader.load_kernel("rmsnorm", copy)
    try:
        fences: list = []
        real_empty = torch.empty
        made = []

        def fenced_empty(*a, **k):
            made.append(child.fenced(real_empty(*a, **k), fences))
            return made[-1]
        torch.empty = fenced_empty
        try:
            y = mod.rmsnorm(**kw)
        finally:
            torch.empty = real_empty
        ref = spec.reference(**upcast(kw))
        assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-6)  # right where anyone looks
        assert child.breached(fences) == 0  # ... and the write past the end is caught
        fences2: list = []
        clean = child.fenced(torch.ones(8), fences2)
        clean.mul_(2)
        assert child.breached(fences2) is None
    finally:
        kernel_loader.load_kernel("rmsnorm")


def test_a_product_of_truths_is_a_condition_like_their_conjunction():
    """Branch-free blending: (M > 600) * (g < 0.5) scales a cheap path in arithmetic, with no if or where; the
    product is a site that must be seen true (both at once), like `&`, casts included."""
    src = ("def f(M, g, a, b):\n    c = (M > 600).to(tl.float32) * (g < 0.5).to(tl.float32)\n"
           "    d = (M > 600) * 3\n    return a + c * (b - a) + d\n")
    texts = {s.text for s in coverage.sites(src).values() if s.kind == "cond"}
    assert "(M > 600).to(tl.float32) * (g < 0.5).to(tl.float32)" in texts
    assert "(M > 600) * 3" not in texts and "M > 600" in texts  # a truth times a number is arithmetic


def test_nary_min_max_and_clamps_are_picks_too():
    """min(M, 1024, N) and max((M, 16)) clamp like their two-way forms; tl.clamp must bite and pass through."""
    src = ("def f(M, N, x):\n    a = min(M, 1024, N * 4)\n    b = max((M, 16))\n"
           "    c = tl.clamp(x, 0.0, 6.0)\n    return a, b, c\n")
    sites = coverage.sites(src)
    assert sorted(s.kind for s in sites.values() if s.kind != "block") == ["clamp", "pick", "pick", "pick"]
    rec = coverage_probe.Recorder()
    ns = {"tl": type("T", (), {"clamp": staticmethod(lambda x, lo, hi: np.clip(x, lo, hi))})}
    exec(coverage_probe.compile_instrumented(rec)(src, "f.py", ns), ns)
    a, b, c = ns["f"](3, 2000, np.array([-1.0, 2.0, 9.0]))
    assert (a, b, c.tolist()) == (3, 16, [0.0, 2.0, 6.0])  # the same values as uninstrumented
    clamp = next(k for k, s in sites.items() if s.kind == "clamp")
    assert rec.seen[clamp] == coverage.REACHED | coverage.TRUE | coverage.FALSE
    picks = [rec.seen[k] for k, s in sites.items() if s.kind == "pick"]
    assert len(picks) == 3 and all(p & coverage.REACHED for p in picks)


def test_every_autotune_config_is_a_site_the_gate_must_run():
    """A GPU runs the config it times fastest; the gate runs each on some key and judges it (fixtures
    rmsnorm/autotune_wrong_config rejected, rmsnorm/legit_autotune_configs accepted)."""
    src = ("@triton.autotune(configs=[triton.Config({'B': 64}), triton.Config({'B': 128})], key=['N'])\n"
           "@triton.jit\ndef k(x, N, B: tl.constexpr):\n    pass\n")
    got = {k: s.text for k, s in coverage.sites(src).items() if k.startswith("autotune:")}
    assert got == {"autotune:k:0": "triton.Config #1 of k's autotune",
                   "autotune:k:1": "triton.Config #2 of k's autotune"}
    one = src.replace(", triton.Config({'B': 128})", "")
    assert not [k for k in coverage.sites(one) if k.startswith("autotune:")]  # one config: nothing to choose


def test_a_device_asserts_condition_is_exempt_like_an_assert():
    """A defensive `tl.device_assert((start >= 0) & (start <= kv_len))` in an honest attention_decode rewrite was
    coverage.unreached: its condition never false on the op's valid inputs (the reference is undefined elsewhere).
    Like an assert statement, a failing side is an error, never a value: exempt, whole (tl.static_assert too); the
    same comparison outside it is still a site."""
    src = SRC.replace("    mask = offs < N\n", "    mask = offs < N\n"
                      "    tl.device_assert((N >= 0) & (N < 10 ** 9), 'N')\n"
                      "    tl.static_assert(BLOCK >= 16)\n    z = N < 10 ** 9\n")
    got = _by_text(coverage.sites(src))
    texts = {t for _, t in got}
    assert not texts & {"(N >= 0) & (N < 10 ** 9)", "N >= 0", "BLOCK >= 16"}, texts
    assert ("cond", "N < 10 ** 9") in got  # the same comparison as a value is a site


def test_a_program_past_the_kernels_own_bound_may_exit_unseen():
    """`if row >= M: return` with grid (M,) (an honest rmsnorm rewrite) was coverage.unreached: the launch never
    overshoots, so the exit is never taken. A program id against one of the kernel's own parameters, body a bare
    return, is exempt; a bound the kernel computes, a loaded value, or anything but a return stays a site."""
    src = '''import triton.language as tl
@triton.jit
def k(x_ptr, M, N):
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    if pid >= M:
        return
    if M <= row:
        return
    if row >= M - M // 4097:
        return
    v = tl.load(x_ptr)
    if v >= M:
        return
    if pid >= N:
        tl.store(x_ptr, 0.0)
    q = pid + 1
    if q >= M:
        return
'''
    got = {t for kind, t in _by_text(coverage.sites(src)) if kind == "cond"}
    assert got == {"row >= M - M // 4097", "v >= M", "pid >= N", "q >= M"}, got
