"""Statistics of an A/B timing, computed in the parent (trusted) from raw per-repetition times.

Speedups are paired by repetition index: repetition r timed the incumbent and the candidate back to back on the same
inputs, so their ratio cancels whatever the machine was doing at the time (clock drift, thermal state, a neighbour's
job). The estimate is the median of the per-repetition log-ratios. Medians, not means: one preempted repetition
must not decide a verdict.

Intervals: a percentile bootstrap over repetitions, widened to contain the distribution-free order-statistic
(sign-test) interval of the same median. The bootstrap alone runs short at the repetition counts a CPU run affords:
simulated 95% intervals of a median covered 92-93% of the time at 10-14 repetitions and ~95% only from ~30 on
(400 trials each, normal and t3 noise); the order-statistic interval covers at least its nominal level at any count
(97-99% there). A wider interval only makes acceptance harder, which is the safe direction for a proof.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

Times = Union[Sequence[float], np.ndarray]  # one file's times of one shape, ms: a list, or a float64 array (reps,)

N_BOOT = 2000
_CHUNK = 1 << 22  # bootstrap index matrices are built this many elements at a time (bounded memory at 10^4 reps)


@dataclass(frozen=True)
class Interval:
    est: float
    lo: float
    hi: float

    def contains(self, x: float) -> bool:
        return self.lo <= x <= self.hi

    def __str__(self) -> str:
        return f"{self.est:.3f} [{self.lo:.3f}, {self.hi:.3f}]"


def _boot_medians(x: np.ndarray, rng: np.random.Generator, n_boot: int = N_BOOT) -> np.ndarray:
    """Medians of `n_boot` resamples (with replacement) of x."""
    n = len(x)
    rows = max(1, _CHUNK // max(n, 1))
    out = []
    for start in range(0, n_boot, rows):
        k = min(rows, n_boot - start)
        out.append(np.median(x[rng.integers(0, n, size=(k, n))], axis=1))
    return np.concatenate(out)


def _percentiles(boot: np.ndarray, confidence: float) -> tuple[float, float]:
    a = (1 - confidence) / 2
    lo, hi = np.quantile(boot, [a, 1 - a])
    return float(lo), float(hi)


def _order_stat_k(n: int, confidence: float) -> int:
    """Largest k with P(Binomial(n, 1/2) <= k - 1) <= (1 - confidence) / 2: then [x_(k), x_(n+1-k)] (sorted,
    1-based) covers the median with probability >= confidence. 0 means even [min, max] falls short."""
    a, cdf, k = (1 - confidence) / 2, 0.0, 0
    log_half_n = n * math.log(2)
    while k <= n // 2:
        p = math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - log_half_n)
        if cdf + p > a:
            break
        cdf += p
        k += 1
    return k


def order_stat_ci(x: np.ndarray, confidence: float) -> tuple[float, float]:
    """Distribution-free interval for the median of x (the sign-test interval)."""
    s = np.sort(np.asarray(x, np.float64))
    k = max(1, _order_stat_k(len(s), confidence))
    return float(s[k - 1]), float(s[len(s) - k])


def median_ci(times: Times, confidence: float, seed: int = 0) -> Interval:
    x = np.asarray(times, dtype=np.float64)
    lo, hi = _percentiles(_boot_medians(x, np.random.default_rng(seed)), confidence)
    return Interval(float(np.median(x)), lo, hi)


def log_ratios(incumbent: Times, candidate: Times) -> np.ndarray:
    a, b = np.asarray(incumbent, np.float64), np.asarray(candidate, np.float64)
    assert a.shape == b.shape and a.ndim == 1 and len(a) > 0, (a.shape, b.shape)  # (reps,) each, paired
    return np.log(a) - np.log(b)


def paired_speedup(incumbent: Times, candidate: Times, confidence: float,
                   seed: int = 0) -> Interval:
    """incumbent time / candidate time (> 1: the candidate is faster), paired by repetition."""
    lr = log_ratios(incumbent, candidate)
    lo, hi = _log_ci(lr, confidence, np.random.default_rng(seed))
    return Interval(float(np.exp(np.median(lr))), float(np.exp(lo)), float(np.exp(hi)))


def _log_ci(lr: np.ndarray, confidence: float, rng: np.random.Generator) -> tuple[float, float]:
    b_lo, b_hi = _percentiles(_boot_medians(lr, rng), confidence)
    o_lo, o_hi = order_stat_ci(lr, confidence)
    return min(b_lo, o_lo), max(b_hi, o_hi)


def weighted_speedup(pairs: Sequence[tuple[Times, Times]], weights: Sequence[float],
                     confidence: float, seed: int = 0) -> Interval:
    """The traced workload's time in the op, incumbent over candidate: 1 / sum_i(w_i / s_i), w_i each shape's share
    of the incumbent's traced time (its weight: calls x median time), s_i its paired speedup (the median of its
    per-round ratios). The harmonic mean, never above the geometric one: a win on some shapes cannot hide a loss on
    others (4x on half the time and 0.5x on the other half is 0.89x, the workload slower, where a geometric mean
    says 1.41x).

    Interval: the bootstrap of that ratio (each shape's repetitions resampled on their own), widened to the same
    ratio at the per-shape interval ends (increasing in each, so it holds whenever every per-shape interval does).
    """
    w = np.asarray(weights, np.float64)
    assert len(w) == len(pairs) and (w >= 0).all() and w.sum() > 0, w
    w = w / w.sum()
    rng = np.random.default_rng(seed)
    lrs = [log_ratios(a, b) for a, b in pairs]

    def log_ratio(logs) -> np.ndarray:  # log of 1 / sum(w / s), from each shape's log speedup (arrays broadcast)
        return -np.log(sum(wi * np.exp(-np.asarray(li, np.float64)) for wi, li in zip(w, logs)))

    est = float(log_ratio([np.median(lr) for lr in lrs]))
    lo, hi = _percentiles(np.asarray(log_ratio([_boot_medians(lr, rng) for lr in lrs])), confidence)
    per_shape = [_log_ci(lr, confidence, rng) for lr in lrs]
    lo = min(lo, float(log_ratio([p[0] for p in per_shape])))
    hi = max(hi, float(log_ratio([p[1] for p in per_shape])))
    return Interval(float(np.exp(est)), float(np.exp(lo)), float(np.exp(hi)))


def rse_of_median(times: Times) -> float:
    """Relative standard error of the median, from the MAD (robust to the odd preempted repetition)."""
    x = np.asarray(times, np.float64)
    if len(x) < 3:
        return float("inf")
    med = np.median(x)
    sigma = 1.4826 * np.median(np.abs(x - med))
    return float(1.2533 * sigma / np.sqrt(len(x)) / med) if med > 0 else float("inf")


def se_of_weighted_log_ratio(pairs: Sequence[tuple[Times, Times]],
                             weights: Sequence[float]) -> float:
    """Standard error of weighted_speedup's log estimate (sum of weighted medians of per-round log-ratios), from each
    shape's MAD: what the rounds loop compares with bench.rse_target (~ the relative error of the speedup)."""
    w = np.asarray(weights, np.float64)
    if not len(pairs) or w.sum() <= 0:
        return float("inf")
    w = w / w.sum()
    var = 0.0
    for wi, (a, b) in zip(w, pairs):
        lr = log_ratios(a, b)
        if len(lr) < 3:
            return float("inf")
        se = 1.2533 * 1.4826 * np.median(np.abs(lr - np.median(lr))) / np.sqrt(len(lr))
        var += (wi * se) ** 2
    return float(np.sqrt(var))
