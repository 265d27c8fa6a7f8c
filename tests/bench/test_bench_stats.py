"""The statistics on synthetic timings: wins are found, noise and drift are not mistaken for wins, physics holds."""
import numpy as np
import pytest

from autokernel.bench import roofline, stats
from autokernel.bench.measure import decide
from autokernel.ops import get
from autokernel.policy import Bench

SHAPES = [dict(s) for s in get("rmsnorm").model_shapes]
BENCH = Bench()
GPU = roofline.gpu_peak("NVIDIA H100 80GB HBM3")


def raw(pairs: list[tuple[np.ndarray, np.ndarray]], wall=None, device="cuda") -> dict:
    """The rounds' figures for an incumbent and one candidate, one (incumbent, candidate) time pair per shape; `wall`:
    the wall clock around the same calls (one pair for every shape)."""
    return {"device": device, "files": [{"path": "inc.py", "status": "ok"}, {"path": "cand.py", "status": "ok"}],
            "cases": [{"shape": s, "dtype": "bfloat16", "reps": len(a), "times_ms": [list(a), list(b)],
                       "wall_ms": wall or [[], []]} for s, (a, b) in zip(SHAPES, pairs)]}


def noisy(rng, n, base_ms, noise):
    return base_ms * np.exp(rng.normal(0, noise, n))


def verdict(pairs, bench=BENCH, peak=GPU, wall=None, device="cuda"):
    return decide("rmsnorm", raw(pairs, wall, device), [1] * len(pairs), bench, peak, ["incumbent", "candidate"])[1]


def test_a_known_5_percent_win_is_detected():
    rng = np.random.default_rng(0)
    pairs = [(noisy(rng, 200, 0.02, 0.02), noisy(rng, 200, 0.02 / 1.05, 0.02)) for _ in SHAPES]
    r = verdict(pairs)
    assert r.accepted and r.reason is None, r
    assert r.speedup.contains(1.05) and r.speedup.lo > BENCH.min_speedup
    for s in r.shapes:
        assert s.speedup.contains(1.05)


def test_noise_alone_is_not_a_win():
    accepted, covered = 0, 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        pairs = [(noisy(rng, 30, 0.02, 0.05), noisy(rng, 30, 0.02, 0.05)) for _ in SHAPES]
        r = verdict(pairs)
        accepted += r.accepted
        covered += r.speedup.contains(1.0)
    assert accepted == 0
    assert covered >= 19  # a 95% interval; ours is built conservative


def test_interleaving_cancels_a_drifting_clock():
    # The machine speeds up 40% over the run (thermal/boost settling). A and B are identical.
    n = 200
    rng = np.random.default_rng(1)
    clock = np.linspace(1.4, 1.0, 2 * n)  # slowdown factor at each of 2n consecutive calls
    a_inter, b_inter = 0.02 * clock[0::2], 0.02 * clock[1::2]  # A B A B ...
    a_seq, b_seq = 0.02 * clock[:n], 0.02 * clock[n:]  # all of A, then all of B
    jitter = lambda x: x * np.exp(rng.normal(0, 0.01, n))  # noqa: E731
    inter = verdict([(jitter(a_inter), jitter(b_inter))] * len(SHAPES))
    seq = verdict([(jitter(a_seq), jitter(b_seq))] * len(SHAPES))
    assert inter.speedup.contains(1.0) and not inter.accepted, inter.speedup
    assert seq.accepted and seq.speedup.lo > 1.1  # what the same timings say when not interleaved: a false win


def test_a_tenfold_speedup_is_implausible():
    rng = np.random.default_rng(2)
    pairs = [(noisy(rng, 50, 0.02, 0.02), noisy(rng, 50, 0.02 / 20, 0.02)) for _ in SHAPES]
    r = verdict(pairs)
    assert not r.accepted and r.reason == "bench.implausible"
    assert "faster than the incumbent" in r.detail


def test_faster_than_the_roofline_is_implausible():
    # rmsnorm M=96 N=576 bf16 moves ~222 KB: at 1 GB/s that is >= 0.22 ms, so 0.019 ms is not physics.
    slow_device = roofline.Peak("slow", 1.0, {"bfloat16": 1.0})
    rng = np.random.default_rng(3)
    pairs = [(noisy(rng, 100, 0.02, 0.01), noisy(rng, 100, 0.02 / 1.05, 0.01)) for _ in SHAPES]
    r = verdict(pairs, peak=slow_device)
    assert not r.accepted and r.reason == "bench.implausible"
    assert "roofline floor" in r.detail
    assert verdict(pairs).accepted  # the same timings on an H100 are fine


def test_cuda_events_longer_than_the_host_clock_are_implausible():
    rng = np.random.default_rng(4)
    a, b = noisy(rng, 50, 0.02, 0.01), noisy(rng, 50, 0.019, 0.01)
    r = verdict([(a, b)], wall=[list(a * 1.5), list(b / 2)])
    assert r.reason == "bench.implausible" and "host clock" in r.detail


def test_waiting_while_the_cpu_clock_stands_still_is_implausible_on_cpu():
    # CPU verdicts use the process's CPU time. A file that hands its work to something outside the process and waits
    # shows little CPU time but long calls: its wall time per CPU second far above the incumbent's.
    rng = np.random.default_rng(7)
    a, b = noisy(rng, 12, 2.0, 0.01), noisy(rng, 12, 1.0, 0.01)
    load = np.exp(rng.normal(0.8, 0.3, 12))  # a loaded machine: both files' calls stretched alike, round by round
    honest = verdict([(a, b)], peak=None, wall=[list(a * load), list(b * load)], device="cpu")
    assert honest.accepted and abs(honest.speedup.est - 2.0) < 0.1, honest
    waited = verdict([(a, b)], peak=None, wall=[list(a * load), list(b * load * 4)], device="cpu")
    assert not waited.accepted and waited.reason == "bench.implausible" and "wall time per CPU second" in waited.detail


def test_weights_follow_the_traced_time_share():
    # Shape 0 runs 1000x more often and is 5% slower in the candidate; shape 1 is 30% faster. Time share wins.
    rng = np.random.default_rng(5)
    pairs = [(noisy(rng, 100, 0.02, 0.01), noisy(rng, 100, 0.021, 0.01)),
             (noisy(rng, 100, 0.02, 0.01), noisy(rng, 100, 0.02 / 1.3, 0.01))]
    r = decide("rmsnorm", raw(pairs), [1000, 1], BENCH, GPU, ["incumbent", "candidate"])[1]
    assert r.speedup.est < 1.0 and not r.accepted


def test_a_win_on_some_shapes_does_not_hide_a_loss_on_others():
    # Two shapes holding equal shares of the incumbent's traced time: the candidate 4x faster on one, 2x slower on
    # the other. The workload's time in the op grows (1 / (0.5/4 + 0.5*2) = 0.89x); a weighted geometric mean of the
    # per-shape speedups (what decided before) says 1.41x and accepted it: a candidate tuned for the shapes with the
    # biggest wins at the cost of the rest.
    rng = np.random.default_rng(11)
    pairs = [(noisy(rng, 100, 0.02, 0.01), noisy(rng, 100, 0.02 / 4, 0.01)),
             (noisy(rng, 100, 0.02, 0.01), noisy(rng, 100, 0.02 * 2, 0.01))]
    r = decide("rmsnorm", raw(pairs), [1, 1], BENCH, GPU, ["incumbent", "candidate"])[1]
    assert abs(r.speedup.est - 1 / (0.5 / 4 + 0.5 * 2)) < 0.02 and r.speedup.hi < 1.0, r.speedup
    assert not r.accepted and r.reason == "bench.no_win"
    same = stats.weighted_speedup([(np.full(9, 2.0), np.full(9, 1.0))] * 3, [1, 5, 2], 0.95)
    assert np.isclose(same.est, 2.0) and np.isclose(same.lo, 2.0)  # one speedup everywhere: that speedup


@pytest.mark.parametrize("n,k", [(6, 1), (10, 2), (30, 10), (100, 40)])
def test_order_statistic_interval_matches_the_sign_test_table(n, k):
    assert stats._order_stat_k(n, 0.95) == k


def test_intervals_cover_at_small_counts():
    rng = np.random.default_rng(6)
    hits = sum(stats.paired_speedup(noisy(rng, 10, 1, 0.1), noisy(rng, 10, 1, 0.1), 0.95, seed=t).contains(1.0)
               for t in range(200))
    assert hits >= 190  # >= 95% of 200 (the percentile bootstrap alone gets ~93%)


def test_peak_table_names():
    assert roofline.gpu_peak("NVIDIA H200").gbps == 4800
    assert roofline.gpu_peak("NVIDIA H100 PCIe").gbps == 2000
    assert roofline.gpu_peak("NVIDIA A100-SXM4-80GB").gbps == 2039
    assert roofline.gpu_peak("NVIDIA L4").name == "L4"
    assert roofline.gpu_peak("NVIDIA L40S") is None
    cpu = roofline.cpu_peak()
    assert cpu.gbps > 0.1 and cpu.source.startswith("measured")
