import math

import pytest

from autokernel.policy import Ops, Policy
from autokernel.profile.rank import amdahl, rank, roof_ms, targets

PEAKS = {"gbps": 1000.0, "gflops": {"float32": 10_000.0, "bfloat16": 100_000.0}, "source": "test"}


def _op(total_ms, e2e_share, shapes):
    return {"calls": sum(s["calls"] for s in shapes), "total_ms": total_ms, "share": e2e_share,
            "e2e_share": e2e_share, "gbps": 1.0, "gflops": 1.0, "flops_per_call": 1.0, "bytes_per_call": 1.0,
            "shapes": shapes}


def _shape(calls, flops, bytes_, dtype="float32"):
    return {"shape": {"M": 1}, "calls": calls, "flops": flops, "bytes": bytes_, "dtype": dtype}


def _trace():
    # matmul: 10 calls of 1 MB / 2 MFLOP at 1000 GB/s -> memory-bound, 1 us per call
    # rope: 4 calls, 1e9 FLOP fp32 at 10 TFLOP/s = 0.1 ms each -> compute-bound
    return {"roofline": PEAKS, "ops": {
        "matmul": _op(1.0, 0.5, [_shape(10, 2e6, 1e6)]),
        "rope": _op(0.8, 0.4, [_shape(4, 1e9, 1e3)]),
        "lm_head": _op(0.1, 0.1, [_shape(1, 1e3, 1e6)]),
    }}


def test_amdahl():
    assert amdahl(0.5, 2.0) == pytest.approx(1 / 0.75)
    assert amdahl(0.0, 100.0) == 1.0
    assert amdahl(1.0, 4.0) == pytest.approx(4.0)
    assert amdahl(0.9, 1e12) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        amdahl(0.5, 0.0)


def test_roof_ms_takes_the_slower_bound_per_shape():
    t, bound = roof_ms(_trace()["ops"]["matmul"], PEAKS)
    assert t == pytest.approx(10 * 1e6 / 1e12 * 1e3) and bound == "memory"  # 10 x 1 us
    t, bound = roof_ms(_trace()["ops"]["rope"], PEAKS)
    assert t == pytest.approx(4 * 1e9 / 1e13 * 1e3) and bound == "compute"  # 4 x 0.1 ms
    bf16 = {"shapes": [_shape(1, 1e9, 1e3, "bfloat16")]}
    assert roof_ms(bf16, PEAKS)[0] == pytest.approx(1e9 / 1e14 * 1e3)  # the tensor-core peak for bf16
    assert roof_ms(bf16, {"gbps": None, "gflops": {}}) == (None, None)


def test_gain_is_share_times_headroom_and_amdahl_agrees():
    by_op = {t.op: t for t in rank(_trace(), Policy())}
    mm = by_op["matmul"]
    assert mm.headroom == pytest.approx(1 - 0.01 / 1.0)
    assert mm.gain == pytest.approx(0.5 * mm.headroom)
    assert mm.e2e_speedup == pytest.approx(amdahl(0.5, 1.0 / 0.01))
    assert mm.e2e_speedup == pytest.approx(1 / (1 - mm.gain))
    rp = by_op["rope"]
    assert rp.headroom == pytest.approx(0.5) and rp.gain == pytest.approx(0.2)


def test_ranked_by_gain_not_share():
    tr = _trace()
    tr["ops"]["rope"] = _op(0.8, 0.45, [_shape(4, 1e9, 1e3)])  # more time than its headroom can win back
    tr["ops"]["silu_mul"] = _op(0.5, 0.3, [_shape(1, 1, 1)])  # less time, ~all of it headroom
    order = [t.op for t in targets(tr, Policy())]
    assert order == ["matmul", "silu_mul", "rope"]


def test_already_at_roofline_has_no_headroom():
    tr = {"roofline": PEAKS, "ops": {"matmul": _op(1e-6, 0.5, [_shape(10, 2e6, 1e6)])}}
    (t,) = rank(tr, Policy())
    assert t.headroom == 0.0 and t.gain == 0.0 and t.e2e_speedup == 1.0


def test_protected_denied_and_allow_are_listed_but_never_targets():
    ranked = rank(_trace(), Policy())  # default policy protects lm_head
    assert [t.status for t in ranked if t.op == "lm_head"] == ["protected"]
    assert ranked[-1].op == "lm_head" and "lm_head" not in [t.op for t in targets(_trace(), Policy())]
    pol = Policy(ops=Ops(protected=["lm_head"], deny=["rope"]))
    assert {t.op: t.status for t in rank(_trace(), pol)} == {"matmul": "target", "rope": "denied",
                                                            "lm_head": "protected"}
    pol = Policy(ops=Ops(protected=[], allow=["rope"]))
    assert [t.op for t in targets(_trace(), pol)] == ["rope"]
    assert {t.op: t.status for t in rank(_trace(), pol)}["matmul"] == "not allowed"


def test_unknown_peaks_rank_by_share():
    tr = _trace()
    tr["roofline"] = {"gbps": None, "gflops": {}}
    ranked = targets(tr, Policy())
    assert [t.op for t in ranked] == ["matmul", "rope"] and all(t.gain is None for t in ranked)
    assert all(math.isfinite(t.e2e_share) for t in ranked)


def test_rank_the_prompt_and_the_bench_share_one_floor():
    """One roofline (autokernel/bench/roofline.py): the headroom rank computes from a trace, the floor the agent's
    prompt shows per shape and the floor the benchmark's implausibility check uses are the same number."""
    import torch

    from autokernel import device
    from autokernel.agent.prompt import roofline as prompt_roofline
    from autokernel.agent.prompt import shape_rows
    from autokernel.bench import roofline
    from autokernel.ops import get

    spec, shape = get("rmsnorm"), {"M": 96, "N": 576}
    flops, nbytes = spec.flops(shape), spec.bytes_moved(shape, torch.float32)
    bench = roofline.floor_ms(flops, nbytes, torch.float32, roofline.peak_for(device.fingerprint()))
    traced = roofline.describe(device.fingerprint())  # what a trace taken here stores
    ranked, _ = roof_ms({"shapes": [{"calls": 3, "flops": flops, "bytes": nbytes, "dtype": "float32"}]}, traced)
    (row,) = shape_rows("rmsnorm", [{"shape": shape, "calls": 3, "dtype": "float32", "now_s": None}],
                        prompt_roofline())
    assert bench > 0
    assert ranked == pytest.approx(3 * bench, rel=1e-12)
    assert row["_floor_s"] * 1e3 == pytest.approx(bench, rel=1e-12)
