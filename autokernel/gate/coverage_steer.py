"""Coverage steering (parent side): extra numeric cases aimed at what the probes never saw (autokernel/gate/
coverage.py), within a budget a candidate cannot multiply (policy gate.coverage_cases)."""
from __future__ import annotations

import math
import random
import re

from autokernel.gate.coverage import Site

_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?(?:e[+-]?\d+)?)")


_NAME = re.compile(r"[A-Za-z_]\w*")


def constants(gaps: list[tuple[Site, str]], named: dict[str, int] | None = None) -> set[int]:
    """Integer thresholds in the text of unreached conditions: each number's floor and ceiling (a float literal
    `600.5 < M` is a threshold too), and their neighbours; `named`: the file's int constants, for names in the text
    (`M > LIMIT`)."""
    out: set[int] = set()
    known = named or {}
    for s, _ in gaps:
        numbers = _NUMBER.findall(s.text) + [str(known[n]) for n in _NAME.findall(s.text) if n in known]
        for m in numbers:
            try:
                v = float(m)
            except ValueError:
                continue
            if 1 < v < 1 << 24 and math.isfinite(v):
                out |= {math.floor(v) - 1, math.floor(v), math.ceil(v), math.ceil(v) + 1}
    return {v for v in out if v > 0}


def dense_values(top: int, seed: int, per_octave: int = 3) -> list[int]:
    """Secret values, `per_octave` per power of two from 2 up to `top` (a window between two sweep points is not
    safe: some value lands in most windows of an octave's width / per_octave)."""
    r = random.Random(seed)
    out = set()
    lo = 2
    while lo < top:
        hi = min(2 * lo, top)
        out |= {r.randint(lo, hi) for _ in range(per_octave)}
        lo *= 2
    return sorted(out)


# Dimensions the steering may set to any multiple of the step up to the maximum, besides the swept and range
# dimensions (any size up to max_rows): the ones an op's launcher takes at any size, within the envelope production
# sends (rows of one block up to 8192 wide, vocabularies up to 256k, head dims up to 256). Head counts are not free
# (GQA groups). Attention's head dim is, in 16s up to 256 (models use 64, 80, 96, 128, 256; the odd shapes 16 and 48):
# a head-size heuristic (flash attention's `BLOCK_N = 64 if BLOCK_D <= 64 else 32`) was unreachable at D <= 64.
STEER_DIMS: dict[str, dict[str, tuple[int, int]]] = {
    "rmsnorm": {"N": (1, 8192)}, "add_rmsnorm": {"N": (1, 8192)}, "silu_mul": {"N": (1, 1 << 15)},
    "softmax": {"V": (1, 1 << 18)}, "matmul": {"N": (1, 1 << 14), "K": (1, 1 << 14)},
    "matmul_q4_1": {"N": (1, 1 << 14), "K": (32, 1 << 14)}, "lm_head": {"V": (1, 1 << 18), "K": (1, 8192)},
    "embedding": {"V": (1, 1 << 18), "D": (1, 8192)}, "embedding_q8_0": {"V": (1, 1 << 18), "D": (32, 8192)},
    "rope": {"H": (1, 64), "D": (2, 256)}, "attention": {"B": (1, 16), "D": (16, 256)},
    "attention_decode": {"B": (1, 16), "D": (16, 256)}}
UNBOUNDED = 1 << 30  # the swept and range dimensions: bounded by cost and max_rows instead

MAX_STEER_CONSTANTS = 64  # numbers from unreached conditions tried per verdict (the case budget bounds it anyway)
DENSE_REACH = 16  # later rounds try other dimensions up to this many times their traced size (within the cost cap)


def _steerable(spec, shape: dict) -> dict[str, tuple[int, int]]:
    from autokernel.gate import schedule
    dims = {d: (1, UNBOUNDED) for d in spec.extra.get("sweep", (next(iter(shape)),))}
    rng = schedule.range_dim(spec, [shape])
    if rng:
        dims[rng[0]] = (1, UNBOUNDED)
    return {d: lim for d, lim in {**dims, **STEER_DIMS.get(spec.name, {})}.items() if d in shape}


def _on_step(v: int, lim: tuple[int, int]) -> list[int]:
    step, top = lim
    out = [v] if step <= 1 else sorted({max(step, v - v % step), v - v % step + step})
    return [w for w in out if 0 < w <= top]


def steer(spec, planned: list, gaps: list[tuple[Site, str]], seed: int, round_: int, max_rows: int,
          done: set[str], dists: tuple[str, ...], named: dict[str, int] | None = None) -> list[tuple]:
    """Extra planned cases (shape, dtype, dist, SINGLE) aimed at what is unreached. Round 0: every number in an
    unreached condition, its floor, ceiling and neighbours, on every dimension of the first planned shape and of the
    range sweep's. Later rounds: secret sizes, several per octave, on the range dimension up to max_rows and on every
    other free dimension up to DENSE_REACH times its traced value. No shape costs more than the plan's most
    expensive one, except on
    the range dimension (up to max_rows, as the plan's own range cases); each shape once per verdict (`done`,
    updated)."""
    from autokernel.gate import schedule
    shapes = [p[0] for p in planned]
    if not shapes:
        return []
    dtype, cap = planned[0][1], max(schedule.cost(spec, s) for s in shapes)
    base = dict(shapes[0])
    rng = schedule.range_dim(spec, shapes)
    r = random.Random(schedule.derive(seed, "coverage", round_))
    free = _steerable(spec, base)
    tied = schedule.RANGE_OVERRIDES.get(spec.name, schedule.NO_OVERRIDE)[2]  # take the range value too (S = L)

    def at(shape: dict, d: str, v: int) -> tuple[dict, bool]:
        ranged = rng is not None and d == rng[0]
        return {**shape, d: v, **({t: v for t in tied} if ranged else {})}, ranged

    want: list[tuple[dict, bool]] = []  # (shape, on the range dimension)
    if round_ == 0:
        for c in sorted(constants(gaps, named))[:MAX_STEER_CONSTANTS]:
            for d, lim in free.items():
                want += [at(base, d, v) for v in _on_step(c, lim)]
                if rng and d in rng[1]:
                    want += [at(rng[1], d, v) for v in _on_step(c, lim)]
        for d, (step, top) in free.items():  # a dimension taken in blocks (matmul_q4_1's K in 32s): the sizes a
            v = 2 * step  # remainder test `K % BLOCK_K` is 0 at are the block-aligned ones, powers of two up to the
            while step > 1 and v <= min(base[d], top):  # traced size (random sizes miss them often)
                want.append(at(base, d, v))
                v *= 2
    else:
        if rng and max_rows > 1:
            want += [at(rng[1], rng[0], v) for v in dense_values(max_rows, r.getrandbits(63))]
        for d, lim in free.items():
            values = dense_values(min(DENSE_REACH * base[d] + 1, lim[1]), r.getrandbits(63), per_octave=1)
            want += [at(base, d, w) for v in values for w in _on_step(v, lim)[:1]]
        r.shuffle(want)
    out = []
    for shape, ranged in want:
        key = ",".join(f"{k}={v}" for k, v in shape.items())
        over = schedule.cost(spec, shape) > cap and not (ranged and rng is not None and shape[rng[0]] <= max_rows)
        if key in done or over:
            continue
        done.add(key)
        out.append((shape, dtype, dists[r.randrange(len(dists))], schedule.SINGLE))
    return out
