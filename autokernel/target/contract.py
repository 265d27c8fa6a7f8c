"""A declared op of a target checkout as an OpSpec: the gate's one description of an op, built from the declaration
(autokernel.toml) and the launcher's calls recorded in the live workload (autokernel/target/launches.py), so a user
writes no input generator (docs/targets.md).

- Layouts. Each recorded argument layout of the launcher (tensors: dtype, shape, strides; scalars, strings) becomes
  a layout the gate makes cases in. The dimension production grows (tokens: a prefill of 7, decode steps of 1) is
  found, not declared: across layouts that differ only in sizes, the tensor dimensions (and integer arguments) that
  change together carry it. A case's shape is {"M": that size, "layout": index}; the leading-dimension sweep, the
  production range and the coverage steering then move M as they do for autokernel's own ops. A launcher seen with
  one size only keeps its recorded sizes (said in the spec's doc).
- Values. Fresh random values in the recorded layouts (the same strides pattern, dense: a permuted view stays
  permuted), every distribution of autokernel.ops.spec; integer tensors in [0, M); float scalars the recorded value
  half the time, else log-uniform within a factor 10 of it (0.0: uniform in [-1, 1]); integers, strings and None as
  recorded (modes and sizes the launcher's callers pass).
- The reference is the checkout's own function (untrusted code): it never runs here. Before a chunk of cases is
  judged, one sandboxed job runs it on every value set the chunk uses, in float64 and in the inputs' dtype
  (autokernel/target/refjob.py), and what came back is what those value sets are judged against.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from autokernel import paths
from autokernel.errors import UserError
from autokernel.ops.spec import OpSpec, sample
from autokernel.ops.tolerance import References
from autokernel.sandbox.channel import load_blob
from autokernel.target import declaration as decl
from autokernel.target.discover import LauncherCalls

ODD_M = (1, 3, 37)  # the odd sizes every layout is checked at, as autokernel's row ops are
MAX_CASE_BYTES = 1 << 28  # a case's launcher arguments; a generous bound on what one job may be asked to allocate
FLOATS = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
INTS = {"int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8,
        "bool": torch.bool}


@dataclass(frozen=True)
class Layout:
    args: tuple[tuple[str, tuple], ...]  # (parameter, description) in signature order (discover._signature)
    token: dict[str, tuple[int, ...]]  # tensor parameter -> its dimensions that carry M
    token_ints: tuple[str, ...]  # integer parameters equal to M
    dtype: torch.dtype  # the first float tensor's dtype: the case dtype replaces it
    m: tuple[int, ...]  # the M values the workload sent in this layout
    order: dict[str, tuple[int, ...]] = field(default_factory=dict)  # per tensor: dims, outermost first


def layouts(calls: LauncherCalls) -> list[Layout]:
    """The launcher's recorded layouts, those that differ only in the token size merged (module docstring)."""
    groups: dict[tuple, list[list[tuple]]] = {}
    for sig in calls.signatures:
        groups.setdefault(_skeleton(sig), []).append(sig)
    out = []
    for sigs in groups.values():
        out += _merge(sigs)
    return out


def _skeleton(sig: list[tuple]) -> tuple:
    """What must be equal for two layouts to be one layout at different sizes: names, kinds, dtypes, ranks, and
    the values of everything that is not a tensor or an integer."""
    return tuple((n, d[0], d[1] if d[0] == "tensor" else None, len(d[2]) if d[0] == "tensor" else None,
                  None if d[0] in ("tensor", "int") else d[1]) for n, d in sig)


def _columns(sig: list[tuple]) -> dict[tuple, int]:
    """Every size in a layout: (parameter, dim) -> size for tensors, (parameter, None) -> value for integers."""
    out: dict[tuple, int] = {}
    for n, d in sig:
        if d[0] == "tensor":
            out.update({(n, i): int(v) for i, v in enumerate(d[2])})
        elif d[0] == "int":
            out[(n, None)] = int(d[1])
    return out


def _merge(sigs: list[list[tuple]]) -> list[Layout]:
    cols = [_columns(s) for s in sigs]
    keys = list(cols[0])
    varying = [k for k in keys if len({c[k] for c in cols}) > 1]
    # the token columns: the largest set of varying columns equal to each other in every layout
    best: list[tuple] = []
    for k in varying:
        same = [j for j in varying if all(c[j] == c[k] for c in cols)]
        if len(same) > len(best):
            best = same
    rest = [k for k in varying if k not in best]
    merged: dict[tuple, list[int]] = {}
    base: dict[tuple, list[tuple]] = {}
    for sig, c in zip(sigs, cols):
        key = tuple(c[k] for k in rest)  # layouts that differ elsewhere too stay apart
        merged.setdefault(key, []).append(c[best[0]] if best else 0)
        if key not in base or (best and c[best[0]] > _m(base[key], best)):
            base[key] = sig  # the largest recorded size: its strides tell the dimension order best
    out = []
    for key, ms in merged.items():
        sig = base[key]
        token: dict[str, list[int]] = {}
        for n, i in best:
            if i is not None:
                token.setdefault(n, []).append(i)
        dtype = next((FLOATS[d[1]] for _, d in sig if d[0] == "tensor" and d[1] in FLOATS), torch.float32)
        order = {n: _order(d[3]) for n, d in sig if d[0] == "tensor"}
        out.append(Layout(tuple((n, tuple(d)) for n, d in sig), {n: tuple(v) for n, v in token.items()},
                          tuple(n for n, i in best if i is None), dtype,
                          tuple(sorted(set(ms))) if best else (), order))
    return out


def _m(sig: list[tuple], best: list[tuple]) -> int:
    return _columns(sig)[best[0]]


def _order(strides) -> tuple[int, ...]:
    """Dimensions outermost first, by recorded stride (ties: the later dimension inner, as in a contiguous tensor)."""
    return tuple(sorted(range(len(strides)), key=lambda i: (-int(strides[i]), i)))


def _dense(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a dense tensor of `shape` whose dimensions lie in memory in `order` (outermost first)."""
    strides = [0] * len(shape)
    step = 1
    for i in reversed(order):
        strides[i] = step
        step *= max(1, shape[i])
    return tuple(strides)


def _strides(shape: tuple[int, ...], order: tuple[int, ...], recorded: tuple[int, ...],
             recorded_strides: tuple[int, ...]) -> tuple[int, ...]:
    """Strides for `shape` in the recorded layout, gaps included: each dimension (innermost first) starts past what
    the inner ones span plus the gap it had when recorded (a q sliced from a fused qkv keeps rows a qkv row apart, a
    padded pitch stays padded); dense where the record was dense (then `_dense`). Size-1 dimensions had no
    meaningful stride, and a broadcast one (stride 0) is made dense (the gate writes values elementwise): no gap."""
    strides = [0] * len(shape)
    span, rec_span = 1, 1  # elements spanned by the dimensions placed so far: now, and when recorded
    for i in reversed(order):
        rs, rn = int(recorded_strides[i]), int(recorded[i])
        gap = max(0, rs - rec_span) if rn > 1 and rs > 0 else 0
        strides[i] = span + gap if span > 1 or gap else 1
        span += (max(1, shape[i]) - 1) * strides[i]
        rec_span += (rn - 1) * rs
    return tuple(strides)


# --- inputs ---------------------------------------------------------------------------------------------------------

Columns = dict[str, list[list[tuple[str, int | None]]]]  # size name -> per layout: the (parameter, dim) carrying it


def shape_dims(layout: Layout, m: int, over: dict | None = None) -> dict[str, tuple[int, ...]]:
    """Each tensor parameter's shape at token size m, with the declared sizes `over` ({(parameter, dim): size})."""
    out = {}
    over = over or {}
    for n, d in layout.args:
        if d[0] == "tensor":
            dims = list(d[2])
            for i in layout.token.get(n, ()):
                dims[i] = m
            for i in range(len(dims)):
                dims[i] = over.get((n, i), dims[i])
            out[n] = tuple(dims)
    return out


def _over(shape: dict, columns: Columns | None) -> dict[tuple[str, int | None], int]:
    """The case's declared sizes as {(parameter, dim or None): size}: the columns of each size the case names."""
    out = {}
    for name, per_layout in (columns or {}).items():
        if name in shape:
            for col in per_layout[shape.get("layout", 0)]:
                out[col] = int(shape[name])
    return out


def make_inputs_for(layouts_: list[Layout], constraints: dict[str, dict[str, int]] | None = None,
                    columns: Columns | None = None):
    constraints = constraints or {}

    def make_inputs(shape: dict, dtype, device, gen, dist="normal") -> dict[str, Any]:
        layout = layouts_[shape.get("layout", 0)]
        m = shape["M"]
        over = _over(shape, columns)
        shapes = shape_dims(layout, m, over)
        out: dict[str, Any] = {}
        for n, d in layout.args:
            if d[0] == "tensor":
                out[n] = _tensor(shapes[n], layout.order[n], d[1], layout.dtype, dtype, device, gen, dist, m,
                                 constraints.get(n, {}), d[2], d[3])
        for n, d in layout.args:  # scalars after every tensor, so the tensors stay what the seed made them
            if d[0] != "tensor":
                out[n] = m if n in layout.token_ints else over.get((n, None), _scalar(d, gen, constraints.get(n)))
        return {n: out[n] for n, _ in layout.args}
    return make_inputs


def _tensor(shape, order, dtype_name: str, primary: torch.dtype, case_dtype, device, gen, dist: str, m: int,
            rule: dict[str, int], recorded: tuple[int, ...] | None = None,
            recorded_strides: tuple[int, ...] | None = None):
    """One input: fresh values in the recorded layout (gaps included: `_strides`), under the declaration's `inputs`
    rule for it, if any. A gap holds values of the same kind, so a kernel that reads it reads plausible noise."""
    dt = _dtype(dtype_name, primary, case_dtype)
    dense = _dense(shape, order)
    strides = dense if recorded is None or recorded_strides is None else \
        _strides(tuple(shape), order, tuple(recorded), tuple(recorded_strides))
    if strides == dense:
        t = torch.empty_strided(shape, strides, dtype=dt, device=device)
    else:
        size = 1 + sum((n - 1) * st for n, st in zip(shape, strides)) if all(shape) else 0
        t = torch.as_strided(_values((size,), dt, device, gen, dist, m, rule), tuple(shape), strides)
    return _fill(t, shape, device, gen, dist, m, rule)


def _values(shape, dt: torch.dtype, device, gen, dist: str, m: int, rule: dict[str, int]) -> torch.Tensor:
    """A dense buffer of values of the tensor's kind (a gapped layout's storage)."""
    if dt.is_floating_point:
        return sample(tuple(shape), dt, device, gen, dist)
    if dt == torch.bool:
        return (torch.rand(tuple(shape), generator=gen) > 0.5).to(device)
    return _ints(shape, gen, m, rule).to(dtype=dt, device=device)


def _ints(shape, gen, m: int, rule: dict[str, int]) -> torch.Tensor:
    """Integer values in the declared [low, high), else in [0, M) (token ids, positions)."""
    lo, hi = rule.get("low", 0), rule.get("high", max(1, m))
    return torch.randint(lo, max(lo + 1, hi), tuple(shape), generator=gen)


def _fill(t: torch.Tensor, shape, device, gen, dist: str, m: int, rule: dict[str, int]) -> torch.Tensor:
    if t.dtype.is_floating_point:
        v = sample(tuple(shape), t.dtype, device, gen, dist)
        rep = rule.get("repeat", 1)
        if rep > 1 and shape and shape[-1] % rep == 0:  # the last dimension: its first 1/rep, repeated
            v = v[..., : shape[-1] // rep].repeat(*([1] * (len(shape) - 1)), rep)
        t.copy_(v)
    elif t.dtype == torch.bool:
        t.copy_(torch.rand(tuple(shape), generator=gen) > 0.5)
    else:
        t.copy_(_ints(shape, gen, m, rule))
    return t


def constrain_for(constraints: dict[str, dict[str, int]]):
    def constrain(kwargs: dict) -> None:
        """The declared `repeat` rules re-applied in place (after the gate mixes or tweaks values elementwise)."""
        for n, rule in constraints.items():
            v, rep = kwargs.get(n), rule.get("repeat", 1)
            if isinstance(v, torch.Tensor) and v.is_floating_point() and rep > 1 and v.dim() and \
                    v.shape[-1] % rep == 0:
                w = v.shape[-1] // rep
                for i in range(1, rep):
                    v[..., i * w:(i + 1) * w].copy_(v[..., :w])
    return constrain


def _dtype(name: str, primary: torch.dtype, case_dtype: torch.dtype) -> torch.dtype:
    dt = FLOATS.get(name) or INTS.get(name)
    if dt is None:
        raise ValueError(f"dtype {name!r} is not one the gate makes inputs in")
    return case_dtype if dt == primary else dt


def _scalar(d: tuple, gen: torch.Generator, rule: dict | None = None):
    """A float argument: half the time the recorded value or one of the declared common ones (`common = [1e-5,
    1e-6]`, values production sends that this workload did not), else drawn over the declared range (log-uniform
    where it is positive: `inputs = { eps = { low = 1e-6, high = 1e-5 } }`), else within a factor 10 of the recorded
    value (0.0: uniform in [-1, 1]). An int or bool argument with declared `common` values (`group = { common = [32,
    128] }`): the recorded value or one of them, evenly. Other kinds, and other ints and bools, as recorded."""
    kind, value = d[0], d[1] if len(d) > 1 else None
    if kind in ("int", "bool") and rule and rule.get("common"):
        cast = bool if kind == "bool" else int
        values = [value] + [cast(c) for c in rule["common"] if cast(c) != value]
        return values[int(torch.randint(0, len(values), (1,), generator=gen))]
    if kind == "dtype":  # held as recorded, like a mode
        return getattr(torch, str(value))
    if kind != "float":
        return value
    assert value is not None  # a recorded float: ("float", value) (discover._signature)
    if int(torch.randint(0, 2, (1,), generator=gen)):
        common = [float(value)] + [float(c) for c in (rule or {}).get("common", ()) if float(c) != float(value)]
        return common[int(torch.randint(0, len(common), (1,), generator=gen))] if len(common) > 1 else float(value)
    u = float(torch.rand((), generator=gen, dtype=torch.float64))
    if rule and "low" in rule and "high" in rule:
        lo, hi = float(rule["low"]), float(rule["high"])
        return lo * (hi / lo) ** u if lo > 0 else lo + (hi - lo) * u
    if value == 0.0:
        return 2 * u - 1
    return math.copysign(abs(value) * 10 ** (2 * u - 1), value)


def check_inputs(op: decl.Op, lays: list[Layout]) -> None:
    """The declared `inputs` rules against the launcher's recorded arguments: each names a parameter, `repeat` a float
    tensor, integer `low`/`high` an integer tensor, `low`/`high` a float argument; UserError otherwise."""
    for name, rule in op.inputs.items():
        kinds = {dict(lay.args).get(name, ("missing",))[0:2] for lay in lays}
        where = f"[ops.{op.name}] inputs.{name}"
        for kind in kinds:
            if kind[0] == "missing":
                raise UserError(f"{where}: the launcher has no parameter {name} (docs/targets.md)")
            tensor = kind[0] == "tensor"
            floating = kind[1] in FLOATS if tensor else kind[0] == "float"
            ranged = "low" in rule or "high" in rule
            integer = not tensor and kind[0] in ("int", "bool")
            if "common" in rule and (tensor or not (floating or integer)):
                raise UserError(f"{where}: common applies to a float, int or bool argument; {name} is {kind[0]} "
                                f"(docs/targets.md)")
            if "common" in rule and integer and not all(type(c) is (bool if kind[0] == "bool" else int)
                                                        for c in rule["common"]):
                raise UserError(f"{where}: {name} is {kind[0]}, so its common values are {kind[0]}s "
                                f"(docs/targets.md)")
            if integer and set(rule) - {"common"}:
                raise UserError(f"{where}: {name} is {kind[0]}, which takes common only (an int's range, if "
                                f"production varies it, is a `sizes` entry) (docs/targets.md)")
            if "repeat" in rule and not (tensor and floating):
                raise UserError(f"{where}: repeat applies to a float tensor (docs/targets.md)")
            if ranged and tensor and floating:
                raise UserError(f"{where}: low/high apply to an integer tensor or a float argument (docs/targets.md)")
            if ranged and tensor and not all(type(rule.get(k, 0)) is int for k in ("low", "high")):
                raise UserError(f"{where}: an integer tensor's low and high are integers (docs/targets.md)")
            if ranged and not tensor and (not floating or not ("low" in rule and "high" in rule)):
                raise UserError(f"{where}: low and high (both) apply to a float argument; {name} is "
                                f"{kind[0]} (docs/targets.md)")


def held_ints(op: decl.Op, lays: list[Layout]) -> list[str]:
    """The launcher's integer and bool arguments the gate never varies: not the token count, not a declared size's
    column, no declared `common` values (a bool's other value is one more call site production may have)."""
    sized = {p for s in op.sizes.values() for p, dim in s.of if dim is None}
    varied = {n for n, rule in op.inputs.items() if rule.get("common")}
    out: list[str] = []
    for lay in lays:
        for n, d in lay.args:
            if d[0] in ("int", "bool") and n not in lay.token_ints and n not in sized | varied and n not in out:
                out.append(n)
    return out


def shape_of_for(layouts_: list[Layout]):
    def shape_of(**kwargs) -> dict[str, int]:
        for i, layout in enumerate(layouts_):
            for n, dims in layout.token.items():
                t = kwargs.get(n)
                if isinstance(t, torch.Tensor) and dims:
                    return {"M": int(t.shape[dims[0]]), "layout": i}
        return {"M": 0, "layout": 0}
    return shape_of


def bytes_for(layouts_: list[Layout], columns: Columns | None = None):
    def bytes_moved(shape: dict, dtype) -> int:
        layout = layouts_[shape.get("layout", 0)]
        total = 0
        for n, dims in shape_dims(layout, shape["M"], _over(shape, columns)).items():
            d = dict(layout.args)[n]
            total += math.prod(dims) * torch.empty((), dtype=_dtype(d[1], layout.dtype, dtype)).element_size()
        return total
    return bytes_moved


# --- references: the checkout's function, run in its own sandboxed job --------------------------------------------

def digest(kwargs: dict) -> str:
    """A value set's identity: every tensor's dtype, shape, strides and bytes, every scalar's repr."""
    h = hashlib.sha256()
    for k in sorted(kwargs):
        v = kwargs[k]
        h.update(k.encode())
        if isinstance(v, torch.Tensor):
            h.update(f"{v.dtype}{tuple(v.shape)}{v.stride()}".encode())
            flat = v.detach().reshape(-1).contiguous().cpu()
            h.update(flat.view(torch.uint8).numpy().tobytes() if flat.dtype != torch.bool else flat.numpy().tobytes())
        else:
            h.update(repr((type(v).__name__, v)).encode())
    return h.hexdigest()


class ReferenceTable:
    """What the checkout's reference returned for each value set, filled by `prepare` (one sandboxed job for many
    value sets) and read by the judge (autokernel.ops.tolerance.references through spec.extra['references'])."""

    def __init__(self, root: Path, reference: str, job_dir: Path, limits, tolerance: dict | None = None):
        self.root, self.reference, self.job_dir, self.limits = root, reference, job_dir, limits
        self.tolerance = tolerance
        # the launcher returns no tensor: its outputs are these arguments (`inplace`); None: the end-to-end stage's
        # calls, whose outputs are the arguments each call changed (autokernel/target/refjob.py)
        self.inplace: list[str] | None = None
        # how many outputs the launcher's calls are compared on (spec(): its returned tensors, the declared
        # `outputs`, or its in-place outputs); None: unknown (the end-to-end stage's calls)
        self.expect: tuple[int, str] | None = None
        self.table: dict[str, References] = {}
        self.jobs = 0
        self.seconds = 0.0

    def prepare(self, value_sets: list[dict]) -> None:
        from autokernel import sandbox
        from autokernel.target import refjob
        todo: dict[str, dict] = {}
        for kw in value_sets:
            key = digest(kw)
            if key not in self.table:
                todo[key] = kw
        if not todo:
            return
        inputs = {f"{key[:32]}.pt": kw for key, kw in todo.items()}
        payload = {"root": str(self.root), "reference": self.reference, "sets": sorted(inputs),
                   "inplace": None if self.inplace is None else list(self.inplace)}
        res = sandbox.run(refjob.references, payload, self.job_dir, self.limits, inputs=inputs,
                          pythonpath=[self.root])
        self.jobs += 1
        self.seconds += res.wall_s
        if not res.ok:
            raise ReferenceError(f"the reference {self.reference} failed in its sandboxed job ({res.reason}: "
                                 f"{res.detail}); log: {self.job_dir}")
        data = res.data if isinstance(res.data, dict) else {}
        if data.get("failed"):
            raise ReferenceError(f"the reference {self.reference} raised: {str(data.get('detail'))[:300]}"
                                 + (f" (at {data['where']})" if data.get("where") else ""))
        got = data.get("sets")
        got = got if isinstance(got, dict) else {}
        for key in todo:
            self.table[key] = refs = _references(got.get(f"{key[:32]}.pt"), self.reference, self.tolerance)
            if self.expect is not None and len(refs.ref64) != self.expect[0]:
                n, what = self.expect
                raise ReferenceError(f"the reference {self.reference} returns {len(refs.ref64)} tensor(s), but "
                                     f"{n} output(s) of the launcher are compared ({what}): return those, in order")

    def __call__(self, kwargs: dict) -> References:
        r = self.table.get(digest(kwargs))
        if r is None:
            raise ReferenceError(f"no reference output for a value set the gate made (prepare() missed it): "
                                 f"{sorted(kwargs)}")
        return r


class ReferenceError(Exception):
    """The checkout's reference failed or returned what cannot be judged against: the user's to fix (exit 2)."""


def _references(blob, reference: str, tolerance: dict | None = None) -> References:
    if not isinstance(blob, bytes):
        raise ReferenceError(f"the reference {reference}'s job returned no outputs for a value set")
    try:
        data = load_blob(blob)
    except ValueError as e:  # whatever came back from the sandbox is data to check
        raise ReferenceError(f"the reference {reference}'s outputs do not load: {e}") from None
    ref64, eager = (data.get("ref64"), data.get("eager")) if isinstance(data, dict) else (None, None)
    ok = all(isinstance(x, list) and x and all(type(t) is torch.Tensor for t in x) for x in (ref64, eager))
    if not (ok and isinstance(ref64, list) and isinstance(eager, list)) or len(ref64) != len(eager):
        raise ReferenceError(f"the reference {reference} must return a tensor or a tuple of tensors (the outputs the "
                             "declaration compares, in order)")
    return References(ref64, eager, [None] * len(ref64), any_layout=True, declared=tolerance)


# --- the spec -------------------------------------------------------------------------------------------------------

def imported(source: str) -> list[str]:
    """The modules a kernel file imports (absolute imports, in order): the job imports the incumbent's before its
    first snapshot, so what importing them changes (a library that wraps torch.manual_seed) is not held against a
    candidate that imports exactly what the incumbent does."""
    import ast
    out: list[str] = []
    for node in paths.parse(source).body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        out += [n for n in names if n not in out and n != "__future__"]
    return out


SIZE_M = 3  # the token count the declared sizes' cases are made at: a few rows, every dtype and distribution


def size_columns(op: decl.Op, lays: list[Layout]) -> Columns:
    """Each declared size's columns in each layout, checked against what the launcher was called with: a tensor
    parameter's dimension (not one the token count moves) or an int parameter; UserError naming what is wrong."""
    out: Columns = {}
    for name, size in op.sizes.items():
        out[name] = []
        for lay in lays:
            args, cols = dict(lay.args), []
            for param, dim in size.of:
                d = args.get(param)
                where = f"[ops.{op.name}] sizes.{name}: {param}" + ("" if dim is None else f".shape[{dim}]")
                if d is None or (d[0] == "tensor") != (dim is not None) or (dim is None and d[0] != "int"):
                    raise UserError(f"{where} is not {'a tensor' if dim is not None else 'an int'} parameter of "
                                    f"the launcher (its parameters: {', '.join(args)}) (docs/targets.md)")
                if dim is not None:
                    if not -len(d[2]) <= dim < len(d[2]):
                        raise UserError(f"{where}: the argument has {len(d[2])} dimensions (docs/targets.md)")
                    dim %= len(d[2])
                    if dim in lay.token.get(param, ()):
                        raise UserError(f"{where} is the token count the gate already moves (docs/targets.md)")
                elif param in lay.token_ints:
                    raise UserError(f"{where} is the token count the gate already moves (docs/targets.md)")
                cols.append((param, dim))
            out[name].append(cols)
    return out


def size_values(size: decl.Size, name: str, seed: int) -> list[int]:
    """Low, high, a secret size between them (log-uniform from the verdict's seed, odd) and the declared `also`
    sizes: a kernel right only at the sizes named in a declaration or in this code is wrong at the secret one."""
    import random
    r = random.Random(f"{seed}:{name}")
    mid = int(round(size.low * (size.high / size.low) ** r.random())) | 1
    return sorted({size.low, min(max(mid, size.low), size.high), size.high, *size.also})


def spec(op: decl.Op, calls: LauncherCalls, table: ReferenceTable, seed: int = 0) -> OpSpec:
    """The gate's OpSpec for a declared op, from its launcher's recorded calls (module docstring)."""
    lays = layouts(calls)
    table.tolerance = dict(op.tolerance) if op.tolerance else None  # the declared tolerance, where one is declared
    incumbent = (table.root / op.file).read_text()
    if not lays:
        raise ReferenceError(f"[ops.{op.name}]: the workload's calls of {calls.launcher} left no layout the gate can "
                             "make inputs in")
    _makeable(op, calls.launcher, lays)
    table.inplace = inplace(op, calls)
    picked = decl.indices(op.outputs.get(calls.launcher))
    table.expect = (len(table.inplace), "the arguments it writes in place") if table.inplace else \
        (len(picked), "its declared `outputs`") if picked else \
        (sum(1 for d in calls.returns if d and d[0] == "tensor"), "the tensors it returned in the workload") \
        if calls.returns else None
    model = [{"M": m, "layout": i} for i, lay in enumerate(lays) for m in (lay.m or (0,))]
    odd = [{"M": m, "layout": i} for i, lay in enumerate(lays) if lay.m for m in ODD_M]
    columns = size_columns(op, lays)
    check_inputs(op, lays)
    odd += [{"M": SIZE_M if lay.m else 0, "layout": i, name: v}
            for name, size in op.sizes.items() for v in size_values(size, name, seed) for i, lay in enumerate(lays)]
    dtypes = tuple(dict.fromkeys([lay.dtype for lay in lays] + [FLOATS[d] for d in op.dtypes]))
    fixed = [lay for lay in lays if not lay.m]
    doc = (f"{op.doc} " if op.doc else "") + (
           f"{op.name}: the checkout's {calls.launcher} in {op.file}, judged against its reference "
           f"{op.references[calls.launcher]} "
           f"on the {len(lays)} argument layout(s) the workload sent")
    if fixed:
        doc += f"; {len(fixed)} layout(s) seen at one size only are checked at that size"
    extra = {"references": table, "prepare": table.prepare, "constrain": constrain_for(op.inputs),
             "range_dim": "M", "range_base": {}, "sweep": ("M",),
             "target": {"op": op.name, "file": op.file, "launcher": calls.launcher,
                        "outputs": decl.indices(op.outputs.get(calls.launcher)),
                        "written": list(calls.written), "module": decl.module_of(op.file), "root": str(table.root),
                        "inplace": list(table.inplace or ()),
                        "preload": imported(incumbent), "incumbent": incumbent},
             "layouts": lays}
    if op.tolerance:
        extra["tolerance"] = dict(op.tolerance)
    return OpSpec(name=f"target.{op.name}", reference=_never, make_inputs=make_inputs_for(lays, op.inputs, columns),
                  shape_of=shape_of_for(lays), flops=lambda s: 0, bytes_moved=bytes_for(lays, columns),
                  model_shapes=tuple(s for s in model if s["M"] or not lays[s["layout"]].m),
                  odd_shapes=tuple(odd), dtypes=dtypes, doc=doc, extra=extra)


def inplace(op: decl.Op, calls: LauncherCalls) -> list[str]:
    """The outputs of a launcher that returns no tensor (vLLM's `silu_and_mul(out, x) -> None`): the tensor
    arguments its recorded calls wrote, in parameter order, or those of them its `outputs` names (the others are
    scratch it may write as it likes: a split-KV decode's partial results); [] for one that returns its outputs.
    ReferenceError for such a launcher that wrote nothing (nothing to compare), `outputs` as indices for it (no
    return value to pick) or naming an argument it did not write, and `outputs` as names for one that returns."""
    declared = op.outputs.get(calls.launcher)
    names = decl.named(declared)
    if not calls.returns or any(d[0] == "tensor" for d in calls.returns):
        if names:
            raise ReferenceError(f"{calls.launcher} returns tensors: its `outputs` are indices into what it returns "
                                 f"(names, {names}, are for a launcher that returns none)")
        return []
    params = [n for n, _ in calls.signatures[0]] if calls.signatures else []
    out = [n for n in params if n in calls.written]
    if not out:
        raise ReferenceError(f"{calls.launcher} returned no tensor and wrote none of its tensor arguments in the "
                             "workload: the gate has no output to compare (declare the launcher that returns or "
                             "writes the op's result)")
    if declared is not None and not names:
        raise ReferenceError(f"{calls.launcher} returns no tensor: its outputs are the arguments it writes in place "
                             f"({', '.join(out)}); drop its `outputs`, or name those that are its result "
                             f"(outputs = [\"{out[0]}\"]; the others are then scratch)")
    if names:
        unwritten = [n for n in names if n not in out]
        if unwritten:
            raise ReferenceError(f"{calls.launcher}'s outputs name {', '.join(unwritten)}, which its calls in the "
                                 f"workload never wrote (it wrote {', '.join(out)})")
        return [n for n in params if n in names]
    return out


def _makeable(op: decl.Op, launcher: str, lays: list[Layout]) -> None:
    """ReferenceError unless the gate can rebuild every recorded argument, at a size one job may allocate: an object
    it has no rule for (e.g. a config object), or a recorded size past MAX_CASE_BYTES (the records come from the
    checkout's engine: trust rule 7)."""
    for lay in lays:
        for n, d in lay.args:
            if d[0] == "other":
                raise ReferenceError(f"{launcher}'s argument {n} was a {d[1]}; the gate rebuilds "
                                     "tensors, numbers, bools, strings, dtypes and None: declare a launcher that "
                                     "takes those (a thin wrapper around this one) instead")
        for m in lay.m or (0,):
            size = bytes_for([lay])({"M": m, "layout": 0}, lay.dtype)
            if size > MAX_CASE_BYTES:
                raise ReferenceError(f"a recorded layout of {launcher} at M={m} has {size} bytes of "
                                     f"arguments, more than one case may allocate ({MAX_CASE_BYTES}); profile a "
                                     "smaller workload")


def _never(**kwargs):
    raise ReferenceError("a target's reference runs only in its sandboxed job (ReferenceTable)")
