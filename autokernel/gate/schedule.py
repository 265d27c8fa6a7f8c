"""What the numeric stage asks of a candidate, planned in the parent from its secret seed: shapes, then calls.

State and sampling must not pay (docs/shortcuts.md, "memoising", "phase detection", "coverage shortcuts"):

- Shapes. The traced (or model) shapes, the spec's odd shapes, one shape larger than any traced, and a sweep of the
  leading (batch/token) dimension over 1, small primes and non-multiples of any block size up to past the traced
  sizes, plus one secret prime between the largest traced size and twice it, so a threshold on M cannot be placed
  where the gate never looks. Bounded by cost: no swept shape costs more than LARGER_COST_FACTOR times the most
  expensive traced one (the interpreter's time on 2 cores is the budget).
- Production range. Past that sweep, the leading dimension goes log-spaced up to policy gate.max_rows (the rows
  production can send: a kernel is vouched for up to there, not past it), one secret prime just under each power of
  2, one secret block multiple (even: a multiple of up to 256) in each octave, and a secret non-block-multiple just
  under max_rows, plus T-1, T, T+1 for every integer threshold T the
  candidate's source compares against (autokernel/gate/thresholds.py). These ignore the cost bound: a shortcut taken
  only past M = 3000 is exactly what a cost-bounded sweep never reaches. One call each, "mixed", the dtypes in turn
  (crossings in every dtype); the top size and every crossing once more with production-like "outliers" values.
- The model's own dimensions in range. Range cases hold the other dimensions small (one batch row, one group of 3
  query heads, a 4,099-row table); one more case puts them at the model's own values (the traced batch, heads and kv
  heads, vocabulary) at the largest leading size that costs at most MODEL_DIMS_COST_FACTOR times the top range case
  (model_dims_shape): a condition on B > 1, Hkv > 1 or the real vocabulary together with a long sequence runs too.
- Both axes at once. The sweep moves one axis at a time; one more case (corner_shape) puts the batch and the length
  past production's thresholds together (a secret batch in [16, 48), a secret length in [128, 512)).
- Calls. Every case starts with a call on fresh inputs ("fresh"). "Full" cases add: the same values at new addresses
  ("copy", which must give the same bits), the tensors refilled in place with new values ("refill" b) and with the
  first values changed at a few random elements ("refill" t: a memo keyed on a hash of sampled elements returns a
  stale answer there), and at random a call again on unchanged tensors ("repeat"). The
  calls of all cases of a sandbox job are interleaved in a random order, so neither the number of calls nor which
  call is checked how can be predicted, and every output of every call is checked. A candidate with autotune
  configs adds one "config" call per distinct config to every case: a's values at new addresses under that config,
  judged against the reference (which config a GPU picks for a key is a timing, so each must hold at every shape).
- Program order. Each call tells the harness in which order the Triton interpreter runs the grid's programs:
  ascending for "fresh", descending for "copy", a seeded shuffle for the others. A kernel whose result depends on
  the order programs run (a prefix carried across programs, float atomics accumulated from 3+ programs) gives
  different bits, which a GPU would give at random: numeric.nondeterministic.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import AbstractSet, Any

import torch

from autokernel.gate import thresholds as _thresholds
from autokernel.ops.spec import OpSpec

SWEEP = (1, 2, 3, 5, 7, 13, 31, 61, 127, 257)  # 1, primes, non-multiples of every power-of-2 block size
LARGER_COST_FACTOR = 2.5  # a swept shape costs at most this times the most expensive traced shape
TWEAK_FRACTION = 1 / 64  # of each tensor's elements changed in place by a "t" refill (at least one)
DTYPE_DISTS = ("wide", "tiny", "mixed")  # distributions checked in every dtype (the others in the first one)
# Per-op range-sweep overrides where spec.extra has none: (range dimension or None for no range sweep, base dims,
# dimensions that take the range value too). Attention grows with the sequence: the prefill's tokens T, the decode's
# filled cache L (its cache size S with it), one batch row (a kernel that reads a fixed number of key blocks is right
# up to there and wrong past it; the traced sizes stop at ~150 tokens, the model's context is 8192). The prefill keeps
# one group of 3 query heads: its float64 reference and rounding floor hold several (heads, T, T) matrices (~1.6 GB
# each at T = 8192 with 3 heads). lm_head's and softmax's rows are sampled positions (one per sequence), over a full
# vocabulary each.
# Two batch rows, not one: draw_padding (autokernel/ops/attention.py) pads one of them, so the long sequences are
# checked with left padding too (a kernel that skipped the padding mask past 1,000 tokens was exact with one row).
RANGE_OVERRIDES: dict[str, tuple[str | None, dict[str, int], tuple[str, ...]]] = {
    "attention": ("T", {"B": 2, "Hq": 3, "Hkv": 1}, ()), "attention_decode": ("L", {"B": 2}, ("S",)),
    "lm_head": (None, {}, ()),
    "softmax": ("M", {"V": 4099}, ())}
NO_OVERRIDE: tuple[str, dict[str, int], tuple[str, ...]] = ("", {}, ())  # an op not in RANGE_OVERRIDES
# A cache's capacity and its filled length (capacity >= length): production reserves the whole generation up front
# (the engine's cache holds prompt + max_new_tokens), so the reserve past the filled positions runs to thousands.
CAPACITY: dict[str, tuple[str, str]] = {"attention_decode": ("S", "L")}
FULL, SINGLE = 3, 1  # the `calls` field of a planned case: a full case, or one fresh call (maybe with a copy)


def derive(seed: int, *parts: object) -> int:
    """A 63-bit value from the secret seed and a label: what the candidate may see of the seed, if anything."""
    h = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def cost(spec: OpSpec, shape: dict) -> int:
    """Work of one call in arbitrary units: FLOPs, or bytes for ops that do no arithmetic (embedding)."""
    return max(spec.flops(shape), spec.bytes_moved(shape, torch.float32))


def _costliest(spec: OpSpec, shapes: list[dict[str, int]]) -> dict[str, int]:
    return max(shapes, key=lambda s: cost(spec, s))


def _is_prime(n: int) -> bool:
    """Miller-Rabin with the first 12 primes as bases: exact for every n below 3.3e24, in microseconds."""
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    if n < 2 or n in bases:
        return n in bases
    if any(n % p == 0 for p in bases):
        return False
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


SCAN = 1 << 16  # a secret prime is chosen among all primes of a range this long or shorter; past it, by random draws


def secret_prime(r: random.Random, lo: int, hi: int) -> int | None:
    """A prime in [lo, hi), drawn with `r`; None when there is none. Every prime of a short range is a candidate, as
    drawn since the first sweep; a long one (a recorded size the parent must not scan: the records come from the
    checkout, trust rule 7) is sampled, so the work is bounded whatever the size."""
    if hi - lo <= SCAN:
        primes = [p for p in range(lo, hi) if _is_prime(p)]
        return r.choice(primes) if primes else None
    for _ in range(20 * hi.bit_length()):  # primes near n are 1 in ln(n): these draws miss one with p < 1e-8
        p = r.randrange(lo, hi)
        if _is_prime(p):
            return p
    return None


def larger_shape(spec: OpSpec, shapes: list[dict[str, int]]) -> dict[str, int] | None:
    """A shape past every traced one: the spec's own (extra['larger_shapes']) or the most expensive traced shape with
    its leading (batch/token) dimension doubled plus one (not a block multiple either)."""
    if spec.extra.get("larger_shapes"):
        return dict(spec.extra["larger_shapes"][0])
    if not shapes:
        return None
    big = dict(_costliest(spec, shapes))
    k = next(iter(big))
    big[k] = 2 * big[k] + 1
    return big


def sweep_shapes(spec: OpSpec, traced: list[dict[str, int]], seed: int) -> list[dict[str, int]]:
    """The leading dimension(s) (spec.extra['sweep'], default the first) swept on the most expensive traced shape,
    with spec.extra['sweep_base'] overriding other dimensions where the traced one would make every case huge (the
    embedding tables). The budget is LARGER_COST_FACTOR times the most expensive traced shape's cost. A value that
    does not fit it there is swept on the cheap bases instead (cheap_bases: the other swept dimensions at 1, then
    spec.extra['cheap_base']'s rungs: a secret short context, then the shortest non-trivial one), so a batch reaches
    production's decode batches (a persistent grid that stops after a fixed number of (batch, head) pairs is wrong
    only there) with a context of its own (a row past the heads count ignoring its padding was exact at L = 2)."""
    if not traced:
        return []
    base = {**_costliest(spec, traced), **spec.extra.get("sweep_base", {})}
    limit = LARGER_COST_FACTOR * max(cost(spec, s) for s in traced)
    dims = spec.extra.get("sweep", (next(iter(base)),))
    out = []
    for dim in dims:
        top = max(s.get(dim, 1) for s in traced)
        r = random.Random(derive(seed, "sweep", dim))
        secret = secret_prime(r, top + 1, 2 * top + 1)
        values = sorted(set(SWEEP) | {s[dim] for s in traced if dim in s} | {2 * top + 1}
                        | ({secret} if secret else set()))
        cheap = [{**base, **{d: 1 for d in dims if d != dim}, **{k: v for k, v in step.items() if k != dim}}
                 for step in cheap_bases(spec, seed)]
        for v in values:
            s = next((s for s in ({**base, dim: v}, *({**c, dim: v} for c in cheap)) if cost(spec, s) <= limit),
                     None)
            if s is not None and s not in out:
                out.append(s)
    return out


def cheap_bases(spec: OpSpec, seed: int) -> list[dict[str, int]]:
    """spec.extra['cheap_base'] resolved: the bases a swept value too costly at the traced shape is tried on, in
    order. A dict or a list of dicts; a value is an int, a secret int in [lo, hi] (a tuple), or another key's name
    (tied: decode's cache size S to its context L). A batch swept at a one-token or two-position base only was exact
    for a kernel wrong on batches past the heads count with a real context (rows >= H + 1 ignoring their padding):
    the first rung is a secret short context, the last the cheapest non-trivial one."""
    raw = spec.extra.get("cheap_base", {})
    out = []
    for i, step in enumerate(raw if isinstance(raw, list) else [raw]):
        r = random.Random(derive(seed, "cheap base", str(i)))
        got = {k: r.randint(*v) if isinstance(v, tuple) else v for k, v in step.items() if not isinstance(v, str)}
        got.update({k: got[v] for k, v in step.items() if isinstance(v, str)})
        out.append(got)
    return out


def range_dim(spec: OpSpec, traced: list[dict[str, int]]) -> tuple[str, dict[str, int]] | None:
    """The dimension production grows (tokens of a prefill, rows of a batch) and the shape it is swept on: the
    spec's extra['range_dim'] (default the last swept dimension, e.g. T for rope's (B, T)) on the most expensive
    traced shape, the other swept dimensions at 1 and extra['sweep_base'] / extra['range_base'] applied (other
    dimensions kept small where the op's cost grows with them too: attention's heads, matmul's K)."""
    override = RANGE_OVERRIDES.get(spec.name, NO_OVERRIDE)
    if not traced or spec.extra.get("range_dim", override[0]) is None:
        return None
    base = {**_costliest(spec, traced), **spec.extra.get("sweep_base", {})}
    dims = spec.extra.get("sweep", (next(iter(base)),))
    dim = spec.extra.get("range_dim", override[0] or dims[-1])
    return dim, {**base, **{d: 1 for d in dims if d != dim}, **spec.extra.get("range_base", override[1])}


def range_shapes(spec: OpSpec, traced: list[dict[str, int]], seed: int, max_rows: int,
                 thresholds: AbstractSet[int] = frozenset()) -> list[dict[str, int]]:
    """The production-range shapes (module docstring): log-spaced from past the cost-bounded sweep (past SWEEP's
    last value and twice the largest traced size) up to max_rows, with secret jitter, and each literal threshold's
    neighbours."""
    picked = range_dim(spec, traced)
    if picked is None or max_rows <= 1:
        return []
    dim, base = picked
    start = max(SWEEP[-1], 2 * max(s.get(dim, 1) for s in traced) + 1)
    r = random.Random(derive(seed, "range", dim))
    values: set[int] = set()
    p = 1 << start.bit_length()
    while p < max_rows:  # a secret prime in the top eighth below each power of 2, and a secret block multiple
        q = secret_prime(r, p - p // 8, p)
        values.add(q if q else p - 1)
        values.add(aligned(r, p // 2 + 1, p))
        p *= 2
    if max_rows > start:  # a secret odd value within the top 64th below max_rows (odd: no block multiple), and a
        top = max_rows - r.randrange(0, max(max_rows // 64, 1))  # secret block multiple in the last octave
        values.add(top if top % 2 or top == 1 else top - 1)
        values.add(aligned(r, max(start, p // 2 + 1), max_rows + 1))
    values |= set(_thresholds.rows(set(thresholds), base, dim, max_rows))
    return [_at(spec, dim, base, v) for v in sorted(values)]


def secret_top(seed: int, dim: str, max_rows: int) -> int:
    """Production's maximum as the calls past the cap check it (numeric._reach): a secret odd size within the top
    64th below max_rows (odd: no block multiple)."""
    top = max_rows - random.Random(derive(seed, "top", dim)).randrange(0, max(max_rows // 64, 1))
    return top if top % 2 or top == 1 else top - 1


ALIGN_MAX = 256  # the largest power of 2 a secret block multiple is a multiple of (aligned)


def aligned(r: random.Random, lo: int, hi: int) -> int:
    """A secret even size in [lo, hi): a multiple of the largest power of 2 up to ALIGN_MAX with two multiples there
    (what production sends: a 512- or 1,536-token prefill). Every other range size is odd (a block's tail), so a
    kernel wrong only on even sizes, or on multiples of 64 (`1 - M % 2` in arithmetic: no condition to steer on),
    was exact everywhere the gate looked."""
    step = ALIGN_MAX
    while step > 2 and (hi - 1) // step - (lo + step - 1) // step < 1:
        step //= 2
    first, last = (lo + step - 1) // step, (hi - 1) // step
    return step * r.randint(first, last) if last >= first else lo + (lo % 2)


def _at(spec: OpSpec, dim: str, base: dict[str, int], v: int) -> dict[str, int]:
    tied = RANGE_OVERRIDES.get(spec.name, NO_OVERRIDE)[2]  # dimensions that take the range value too
    return {**base, dim: v, **{t: v for t in tied}}


def at_rows(spec: OpSpec, traced: list[dict[str, int]], v: int) -> dict[str, int]:
    """The range shape (range_dim) with its range dimension at v; range_dim must not be None for these shapes."""
    picked = range_dim(spec, traced)
    assert picked is not None, spec.name
    return _at(spec, *picked, v)


def plan(spec: OpSpec, shapes: list[dict] | None, dtypes: list[torch.dtype] | None, dists: list[str] | None,
         all_dists: tuple[str, ...], seed: int = 0, max_rows: int = 0,
         thresholds: AbstractSet[int] = frozenset(),
         production_rows: int = 0) -> list[tuple[dict, torch.dtype, str, int]]:
    """(shape, dtype, dist, FULL | SINGLE) for every case, smoke cases (every shape, first dtype, first dist, full)
    first: they run as their own sandbox job, so most wrong candidates are turned away after a fraction of the work.

    Full cases: every shape x every dtype on the first distribution. Single-call cases: the traced and odd shapes on
    every other distribution, in every dtype for the magnitude extremes (DTYPE_DISTS: overflow and relative error
    depend on the dtype) and in the first dtype for the value patterns; the swept shapes on "mixed" (every
    distribution interleaved elementwise) where it is planned, else the first, in the first dtype (a grid that floors
    or truncates does so in any dtype; precision shortcuts matter most in the widest). The budget is the
    interpreter's time on 2 cores: a thorough rmsnorm verdict is ~80 cases and ~160 calls. The production-range
    shapes (range_shapes, and model_dims_shape's; max_rows 0: none, as unit tests of the grid ask) are single
    "mixed" calls in the first dtype too, planned last: the most expensive calls, made only once cheaper cases have
    passed.
    """
    traced = [dict(s) for s in (shapes if shapes is not None else spec.model_shapes)]
    big = larger_shape(spec, traced)
    base_shapes: list[dict] = []
    for s in traced + [dict(s) for s in spec.odd_shapes]:
        if s not in base_shapes:
            base_shapes.append(s)
    full_shapes = base_shapes + ([big] if big and big not in base_shapes else [])
    swept = [s for s in sweep_shapes(spec, traced, seed) if s not in full_shapes]
    dtypes, dists = list(dtypes or spec.dtypes), list(dists or all_dists)
    sweep_dist = "mixed" if "mixed" in dists else dists[0]
    grid = [(s, dt, dists[0], FULL) for s in full_shapes for dt in dtypes]
    grid += [(s, dt, d, SINGLE) for s in base_shapes for d in dists[1:]
             for dt in (dtypes if d in DTYPE_DISTS else dtypes[:1])]
    turn = derive(seed, "dtype turn") % len(dtypes)
    swept += [s for s in _odd_batched(spec) if s not in full_shapes + swept]  # cheap: with the sweep
    swept += [s for s in capacity_shapes(spec, traced, seed, max(production_rows, max_rows))
              if s not in full_shapes + swept]
    grid += [(s, dtypes[(i + turn) % len(dtypes)], sweep_dist, SINGLE) for i, s in enumerate(swept)]
    ranged = [s for s in range_shapes(spec, traced, seed, max_rows, thresholds) if s not in full_shapes + swept]
    modeled = model_dims_shape(spec, traced, seed, max_rows)
    ranged += [modeled] if modeled and modeled not in full_shapes + swept + ranged else []
    corner = corner_shape(spec, traced, seed, max_rows)
    ranged += [corner] if corner and corner not in full_shapes + swept + ranged else []
    ranged += [s for s in _top_on_every_width(spec, traced, ranged) if s not in full_shapes + swept + ranged]
    picked = range_dim(spec, traced)
    crossing = _crossings(picked, max_rows, thresholds, seed)
    grid += [(s, dt, sweep_dist, SINGLE) for i, s in enumerate(ranged)
             for dt in (dtypes if picked and s.get(picked[0]) in crossing
                        else [dtypes[(len(swept) + i + turn) % len(dtypes)]])]  # the turns go on from the sweep's
    planned = full_shapes + swept + ranged
    grid += [(s, dtypes[0], sweep_dist, SINGLE) for s in _crossed_elsewhere(spec, traced, picked, crossing)
             if s not in planned]
    grid += _far_outliers(spec, picked, crossing, ranged, modeled, dtypes, dists)
    if "outliers" in dists and sweep_dist != "outliers":  # production's data at every size checked past the traced
        grid += [(s, dt, "outliers", SINGLE) for s, dt, d, n in grid  # and odd shapes (a window computed from N,
                 if d == sweep_dist and n == SINGLE and s not in base_shapes]  # no literal, clipped large values)
        grid = _unique(grid)
    smoke = [c for c in grid if c[1] == dtypes[0] and c[3] == FULL]
    return smoke + [c for c in grid if c not in smoke]


def _unique(grid: list[tuple]) -> list[tuple]:
    """The grid without repeated cases (shapes are dicts: compared, not hashed), first occurrence kept."""
    out: list[tuple] = []
    for c in grid:
        if c not in out:
            out.append(c)
    return out


def _far_outliers(spec: OpSpec, picked: tuple[str, dict[str, int]] | None, crossing: set[int], ranged: list[dict],
                  modeled: dict[str, int] | None, dtypes: list[torch.dtype], dists: list[str]) -> list[tuple]:
    """Production's data where production's sizes are: the "outliers" distribution (not a part of "mixed", see
    autokernel/ops/spec.py) on the far side of every threshold crossing and at the top of the range, in every dtype,
    and at the model's own dimensions in the first. The traced and odd shapes have it already; a clip of large values
    taken only past a size (`if M > 512:` around a `where(|x| < 1000, x, 0)`, its false side seen only in padding
    lanes) was exact on every other case. At most (MAX_CROSSINGS + 1) x dtypes + 1 calls."""
    if "outliers" not in dists or picked is None or not ranged:
        return []
    dim, base = picked
    top = max(ranged, key=lambda s: s.get(dim, 0))
    far = [_at(spec, dim, base, v) for v in sorted(crossing)] + [top]
    out = [(s, dt, "outliers", SINGLE) for i, s in enumerate(far) if s not in far[:i] for dt in dtypes]
    return out + ([(modeled, dtypes[0], "outliers", SINGLE)] if modeled and modeled not in far else [])


def _top_on_every_width(spec: OpSpec, traced: list[dict[str, int]], ranged: list[dict]) -> list[dict[str, int]]:
    """The top of the range (its largest size) on every traced shape's other dimensions, not only the costliest's:
    matmul_q4_1's four projections (a one-tile K loop exact up to K = 1,024 dropped ffn_down's columns past it in
    prefills past 192 rows; the range ran at K = 576 only). At most one case per distinct traced width."""
    picked = range_dim(spec, traced)
    if picked is None or not ranged:
        return []
    top = max(s.get(picked[0], 0) for s in ranged)
    out: list[dict[str, int]] = []
    for t in traced:  # range_dim's base, made from this traced shape instead of the costliest
        one = range_dim(spec, [t])
        assert one is not None  # picked was not None: the same spec
        s = _at(spec, *one, top)
        if s not in out and s not in ranged:
            out.append(s)
    return out


def capacity_shapes(spec: OpSpec, traced: list[dict[str, int]], seed: int, production_rows: int) -> list[dict]:
    """The traced shapes with a cache reserve past the filled length (CAPACITY): a secret reserve below 256 and one in
    each octave from 256 up to production's rows, the traced shapes in turn. The range ties capacity to length, so
    no case had a reserve past 255: a decode kernel that read one stale slot once the reserve reached 257 (`S - L`
    in arithmetic, no condition) was exact everywhere the gate looked. Cheap: the work follows the length."""
    if spec.name not in CAPACITY or not traced:
        return []
    cap, length = CAPACITY[spec.name]
    r = random.Random(derive(seed, "capacity", cap))
    reserves, lo = [r.randrange(1, 256)], 256
    while lo < production_rows:
        reserves.append(r.randrange(lo + 1, min(2 * lo, production_rows) + 1))
        lo *= 2
    return [{**t, cap: t[length] + v} for t, v in zip(traced * len(reserves), reserves)]


def _odd_batched(spec: OpSpec) -> list[dict[str, int]]:
    """Each odd shape whose leading (batch) dimension is 1 once more with 3 rows: softmax's 128,256-entry vocabulary
    was checked on one row only (a split-row path whose scratch was not indexed by row was exact there)."""
    out = []
    for s in spec.odd_shapes:
        lead = spec.extra.get("sweep", (next(iter(s)),))[0]
        if s.get(lead) == 1:
            out.append({**s, lead: 3})
    return out


MAX_CROSSINGS = 16  # crossing sizes planned in every dtype and on every traced shape: bounded work, whatever the source


def _crossings(picked: tuple[str, dict[str, int]] | None, max_rows: int, thresholds: AbstractSet[int],
               seed: int) -> set[int]:
    """The range sizes on the far side of a threshold of the source (T and T+1: where `> T` and `>= T` change path):
    planned in every dtype, since the path taken past a threshold may depend on the dtype too (`ROWS = 4 //
    element_size` packs two half-precision rows per program and dropped odd M's last row; a cheaper sigmoid only for
    half-precision batches past 512 rows). At most MAX_CROSSINGS of them, drawn with the secret seed where the
    source has more (a file of constants must not multiply the plan, nor choose which crossings are kept). The other
    swept and range shapes take the dtypes in turn, from a secret start, so any three neighbouring sizes see every
    dtype at no extra cost. `picked`: range_dim's (dimension, base)."""
    if picked is None:
        return set()
    dim, base = picked
    far = sorted(set(_thresholds.rows(set(thresholds), base, dim, max_rows, sides=(0, 1))) & set(
        _thresholds.rows(set(thresholds), base, dim, max_rows)))
    return set(random.Random(derive(seed, "crossings")).sample(far, min(len(far), MAX_CROSSINGS)))


def _crossed_elsewhere(spec: OpSpec, traced: list[dict[str, int]], picked: tuple[str, dict[str, int]] | None,
                       crossing: set[int]) -> list[dict[str, int]]:
    """The threshold crossings (_crossings) on every other traced shape too (matmul's k/v projections, N = 192, beside
    the range cases' widest), within the sweep's budget: a shortcut keyed on a small width and a long prefill
    together, through variables (`int(N < 256) * int(M > 128)`), is taken only there."""
    if picked is None or not crossing:
        return []
    dim = picked[0]
    limit = LARGER_COST_FACTOR * max(cost(spec, s) for s in traced)
    out: list[dict[str, int]] = []
    for t in traced:
        for v in sorted(crossing):
            s = {**t, dim: v}
            if s not in out and cost(spec, s) <= limit:
                out.append(s)
    return out


# --- the production range at the model's own dimensions -------------------------------------------------------------

# The model-dimension range case costs at most this times the top range case (cost): under the interpreter (max_rows
# 1024) attention at B=4, Hq=9, Hkv=3 reaches T = 823, decode at B=4 the top L, rope and embedding at B=4 the top T
# (over the 49,152-row table), softmax over the 49,152 vocabulary M ~470. Measured for the incumbents on a 2-core
# machine: attention 2.8 s (T = 823; 1.8 s at T = 591, the factor 2 it was until a key block skipped once B*Hq*Hkv*T
# passed 80k escaped there), softmax 44 s (34 s at M = 337). Where kernels compile (max_rows 8192) it goes further.
MODEL_DIMS_COST_FACTOR = 4.0


def model_dims_shape(spec: OpSpec, traced: list[dict[str, int]], seed: int, max_rows: int) -> dict[str, int] | None:
    """A production-range shape with every other dimension at the model's own value: the most expensive traced
    shape's (heads, kv heads, head dim, vocabulary), the batch-like swept dimensions at their largest traced value
    (B = 4), where range_dim holds them small; the leading dimension at the top range value when that costs at most
    MODEL_DIMS_COST_FACTOR times the top range case, else a secret prime in the top eighth below the largest value
    that does. None where the range cases already run at the model's dimensions (rmsnorm, matmul) or no such value
    lies past the sweep's reach (twice the largest traced size)."""
    picked = range_dim(spec, traced)
    if picked is None or max_rows <= 1:
        return None
    dim, small = picked
    tied = RANGE_OVERRIDES.get(spec.name, NO_OVERRIDE)[2]
    heaviest = max(traced, key=lambda s: cost(spec, s))
    batch = [d for d in spec.extra.get("sweep", (next(iter(heaviest)),)) if d != dim]
    base = {**heaviest, **{d: max(s.get(d, 1) for s in traced) for d in batch}}
    if all(base.get(k) == v for k, v in small.items() if k != dim and k not in tied):
        return None
    ranged = range_shapes(spec, traced, seed, max_rows)
    if not ranged:
        return None

    def at(v: int) -> dict[str, int]:
        return {**base, dim: v, **{t: v for t in tied}}
    top, limit = ranged[-1][dim], MODEL_DIMS_COST_FACTOR * cost(spec, ranged[-1])
    if cost(spec, at(top)) <= limit:
        return at(top)
    lo, hi = 1, top  # the largest leading size within the limit: cost grows with it
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cost(spec, at(mid)) <= limit else (lo, mid - 1)
    if lo <= 2 * max(s.get(dim, 1) for s in traced) + 1:
        return None
    q = secret_prime(random.Random(derive(seed, "model_dims", dim)), lo - lo // 8, lo + 1)
    return at(q if q else lo)


CORNER_BATCH = (16, 48)  # the joint corner's batch: a secret size in this range (production decode batches)
CORNER_LENGTH = (128, 512)  # and its length, a secret size in this range, shortened only to fit CORNER_COST_FACTOR
CORNER_COST_FACTOR = 2.5  # times the top range case's cost (the costliest call of the plan below the CPU cap)
CORNER_MIN_LENGTH = 32  # the shortest length the corner shrinks to


def corner_shape(spec: OpSpec, traced: list[dict[str, int]], seed: int, max_rows: int) -> dict[str, int] | None:
    """Both axes production grows at once: the batch (the swept dimensions besides the range one) at a secret size
    in CORNER_BATCH and the range dimension at a secret size in CORNER_LENGTH, on the range cases' small heads. The
    sweep moves one axis at a time (the batch past the traced budget on a short context, the length on two rows), so
    a kernel wrong only when both are large (the scale x 1.5 at B >= 16 and kv_len >= 128, integer arithmetic) was
    exact everywhere the plan looked. The length shrinks (down to CORNER_MIN_LENGTH), then the batch to the range's
    smallest, to cost at most CORNER_COST_FACTOR times the top range case; None where the op has no batch axis besides
    its range, or nothing fits."""
    picked = range_dim(spec, traced)
    if picked is None or max_rows <= 1:
        return None
    dim, base = picked
    base = {**base, **spec.extra.get("corner_base", {})}  # fewer heads where the range cases keep the model's
    batch = [d for d in spec.extra.get("sweep", ()) if d != dim and d in base]
    ranged = range_shapes(spec, traced, seed, max_rows)
    if not batch or not ranged:
        return None
    tied = RANGE_OVERRIDES.get(spec.name, NO_OVERRIDE)[2]
    r = random.Random(derive(seed, "corner"))
    b = secret_prime(r, *CORNER_BATCH) or CORNER_BATCH[0] + 1
    length = min(secret_prime(r, *CORNER_LENGTH) or CORNER_LENGTH[0] + 1, max_rows)
    limit = CORNER_COST_FACTOR * max(cost(spec, s) for s in ranged)

    def at(n: int, v: int) -> dict[str, int]:
        return {**base, **{d: n for d in batch}, dim: v, **{t: v for t in tied}}
    for n in (b, CORNER_BATCH[0] + 1):  # the secret batch, else the corner's smallest
        v = length
        while v > CORNER_MIN_LENGTH and cost(spec, at(n, v)) > limit:
            v = v * 7 // 8 | 1
        if cost(spec, at(n, v)) <= limit:
            return at(n, v)
    return None


# --- calls -----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    id: str  # "k0012": the order of this call within its sandbox job
    case: str  # the case whose tensors it uses
    mode: str  # fresh | copy | refill | repeat | config (see the module docstring)
    values: str  # which of the case's value sets the call's arguments hold: a | b | t
    order: str  # program order under the interpreter: asc | desc | shuffle
    perm_key: int = 0
    config: int = -1  # "config" calls: which distinct autotune config runs (autokernel/gate/coverage_probe.py)

    def payload(self) -> dict[str, Any]:
        return {"id": self.id, "case": self.case, "mode": self.mode, "values": self.values, "order": self.order,
                "perm_key": self.perm_key, "config": self.config}


@dataclass
class CaseCalls:
    """A case's calls in the order they are made (before interleaving with other cases)."""
    case: str
    steps: list[tuple[str, str]] = field(default_factory=list)  # (mode, values)


def case_steps(case_id: str, kind: int, r: random.Random) -> CaseCalls:
    """fresh a, then for a full case: copy a, refill b and refill t in a random order, and at random a repeat of
    the last values written (a copy is made from the pristine a, so it may come after the refills)."""
    steps = [("fresh", "a")]
    if kind == FULL:
        rest = [("copy", "a"), ("refill", "b"), ("refill", "t")]
        r.shuffle(rest)
        steps += rest
        if r.random() < 0.5:
            last = next(v for m, v in reversed(steps) if m != "copy")
            steps.append(("repeat", last))
    elif r.random() < 0.25:
        steps.append(("copy", "a"))
    return CaseCalls(case_id, steps)


def interleave(per_case: list[CaseCalls], seed: int, job: int | str, start: int = 0) -> list[Call]:
    """All the cases' calls in one random order that keeps each case's own order; program orders assigned. Call ids
    count from `start` (a job made of several interleaved groups, one after the other)."""
    r = random.Random(derive(seed, "interleave", job))
    queues = [list(c.steps) for c in per_case]
    ids = [c.case for c in per_case]
    bag = [i for i, q in enumerate(queues) for _ in q]
    r.shuffle(bag)
    out = []
    configs = [0] * len(queues)  # a case's "config" calls run its distinct autotune configs in turn
    for n, i in enumerate(bag):
        mode, values = queues[i].pop(0)
        order = {"fresh": "asc", "copy": "desc"}.get(mode, "shuffle")
        key = r.getrandbits(62) if order == "shuffle" else 0
        config = configs[i] if mode == "config" else -1
        configs[i] += mode == "config"
        out.append(Call(f"k{start + n:04d}", ids[i], mode, values, order, key, config))
    return out


# --- values ----------------------------------------------------------------------------------------------------------

def tweak(a: dict[str, Any], b: dict[str, Any], seed: int) -> dict[str, Any]:
    """a's values with a random few elements of each tensor taken from b (same layout as a: views stay views).
    Elementwise mixing of two valid inputs of the same shape stays valid (ids in range, positions, codes)."""
    g = torch.Generator().manual_seed(seed)
    storages: dict[int, torch.UntypedStorage] = {}
    out: dict[str, Any] = {}
    for k, v in a.items():
        if not isinstance(v, torch.Tensor):
            out[k] = v
            continue
        s = v.untyped_storage()
        if s.data_ptr() not in storages:
            storages[s.data_ptr()] = s.clone()
        t = torch.empty(0, dtype=v.dtype, device=v.device).set_(storages[s.data_ptr()], v.storage_offset(),
                                                                 v.size(), v.stride())
        if v.numel():
            n = max(1, int(v.numel() * TWEAK_FRACTION))
            idx = torch.randperm(v.numel(), generator=g)[:n].to(v.device)
            flat_b = b[k].reshape(-1)
            if v.is_contiguous():
                t.view(-1)[idx] = flat_b[idx]
            else:
                mask = torch.zeros(v.numel(), dtype=torch.bool, device=v.device)
                mask[idx] = True
                t.copy_(torch.where(mask.reshape(v.shape), b[k], t))
        out[k] = t
    return out
