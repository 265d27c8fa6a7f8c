"""One dtype -> tolerance table, derived rather than guessed, and the one comparison of a call's outputs with it.

A kernel's output is compared with a float64 reference. It may be off by at most twice the error that eager torch
makes in the same dtype on the same inputs (so a kernel is held to the standard of the library it replaces), plus a
few units in the last place of the dtype, relative to the output's scale (so a near-exact eager result does not
demand bit-exactness from a different but exact summation order). Where an op amplifies rounding, or sums long dot
products whose eager error depends on the machine's BLAS, eager's error counts as at least a float32 rounding floor
derived from the inputs (OpSpec.rounding); a float32 output there is compared element by element (compare()).

`compare_outputs()` applies that rule, and everything around it, to one call's outputs. The gate's numeric stage
(autokernel/gate/judge.py), the benchmark's re-check of timed outputs (autokernel/bench/rounds.py) and the kernel
tests (tests/kernels/opcheck.py) all call it, so none of them can pass what another rejects: layout, poison left in
place, overflow to ±inf, NaN/Inf where the reference is finite and the broken-eager bound are decided here once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from autokernel.ops.spec import upcast

EAGER_FACTOR = 2.0  # flash-attention's test_layer_norm.py rule
ULPS = 4.0  # few-ulp slack, relative to the output's max magnitude
# When eager torch itself breaks on an input (an fp16 x.pow(2) overflowing to inf, so a row comes out zero), 2x its
# error is a tolerance that cannot fail. Eager counts as broken when it is non-finite where the float64
# reference is finite, or off by more than BROKEN_EAGER_FRACTION of the output's scale (imprecise is not broken: a
# float32 rope at position 8000 is off by ~500 ulps and keeps its derived bound). The bound then is what the rule
# gives a healthy eager of ~2 ulps: 2 x 2 + 4 = 8 ulps of the output's scale.
BROKEN_EAGER_FRACTION = 0.125
BROKEN_EAGER_ULPS = 8.0


@dataclass(frozen=True)
class Closeness:
    ok: bool
    max_err: float  # max |out - ref64|
    eager_err: float  # max |eager - ref64|
    bound: float  # EAGER_FACTOR * max(eager_err, floor) + ULPS * eps * scale
    scale: float  # max |ref64|
    floor: float = 0.0  # max of the op's rounding floor (OpSpec.rounding); 0 where it has none

    def detail(self) -> str:
        where = " at the element nearest its bound" if self.floor else ""
        floor = f", float32 rounding floor up to {self.floor:.3g}" if self.floor else ""
        return (f"max error {self.max_err:.3g} vs bound {self.bound:.3g}{where} "
                f"(eager error {self.eager_err:.3g}{floor}, output scale {self.scale:.3g})")


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def compare(out: torch.Tensor, ref64: torch.Tensor, eager: torch.Tensor, dtype: torch.dtype,
            floor: torch.Tensor | None = None, eager_err: float | None = None, elementwise: bool = False) -> Closeness:
    """Is `out` (computed in `dtype`) as close to the float64 truth as eager torch is? The bare rule:
    compare_outputs() is what decides a verdict. `floor` (elementwise, OpSpec.rounding) is the error float32
    accumulation can make where the op amplifies rounding: eager's error, one rounding order among many, counts as at
    least that there. For a float32 output with a floor every term is per element: 2 x max(floor, eager's error
    there) + ULPS ulps of the element. `eager_err` replaces the measured eager error (compare_outputs() does where
    eager itself broke). `elementwise` (an op without cancellation: References.elementwise): every dtype's output
    is judged per element, half precision too."""
    r = ref64.detach().to(torch.float64).cpu()
    o = out.detach().to(torch.float64).cpu()
    e = eager.detach().to(torch.float64).cpu()
    finite = bool(torch.isfinite(o).all())
    scale = float(r.abs().max()) if r.numel() else 0.0
    overridden = eager_err is not None
    if eager_err is None:
        eager_err = float((e - r).abs().max()) if r.numel() else 0.0
    tiny = torch.finfo(dtype).tiny
    slack = ULPS * eps(dtype) * max(scale, tiny)
    if floor is None or not r.numel():
        max_err = float((o - r).abs().max()) if r.numel() else 0.0
        bound = EAGER_FACTOR * eager_err + slack
        return Closeness(finite and max_err <= bound, max_err if finite else float("inf"), eager_err, bound, scale)
    err = (o - r).abs()
    f = floor.detach().to(torch.float64).cpu()
    if elementwise or dtype == torch.float32 and not overridden:
        # The floor models float32 arithmetic: for a float32 output it is the whole allowance, element by element.
        # Eager's error and the few ulps count where they are, not at the output's worst element, which would hand
        # every element the slack of the largest (a kernel cutting operands to 19 bits passed at K = 576 on that).
        # Below the smallest normal float32 arithmetic is absolute (gradual underflow: a sum of L products whose
        # terms underflow is off by up to ~L/2 denormal steps, and a GPU flushes them to zero): ULPS of `tiny` there.
        # An op without cancellation (`elementwise`) is judged so in every dtype; where eager broke (an fp16 x^2
        # overflowing beside a massive activation) its term is the few ulps a healthy eager makes, of each element.
        eager_term = (e - r).abs() if not overridden else \
            (BROKEN_EAGER_ULPS - ULPS) / EAGER_FACTOR * eps(dtype) * r.abs()
        allowed = EAGER_FACTOR * torch.maximum(f, eager_term) + ULPS * (eps(dtype) * r.abs()).clamp(min=tiny)
    else:  # narrower outputs add their own rounding, and tensor-core arithmetic, that the float32 floor leaves out
        allowed = EAGER_FACTOR * f.clamp(min=eager_err) + slack
    worst = int(torch.argmax(torch.nan_to_num(err / allowed, nan=float("inf"))))  # the element nearest its bound
    max_err, bound = float(err.reshape(-1)[worst]), float(allowed.reshape(-1)[worst])
    return Closeness(finite and max_err <= bound, max_err if finite else float("inf"), eager_err, bound, scale,
                     float(floor.max()))


@dataclass(frozen=True)
class References:
    """What one call's outputs are compared with (compare_outputs(outs, r.ref64, r.eager, unwritten, r.floors)):
    the float64 truth, eager torch in the call's dtype, and per output the op's float32 rounding floor
    (OpSpec.rounding) or None."""
    ref64: list
    eager: list
    floors: list
    any_layout: bool = False  # a target's op: its launcher's outputs may be views in any layout (Liger's rope)
    declared: dict | None = None  # a target's declared {atol, rtol}: replaces the derived bound (docs/targets.md)
    # an op without cancellation (OpSpec.extra['elementwise']: rmsnorm, add_rmsnorm, silu_mul): each element of
    # every dtype judged by its own ulps (a half-precision residual on a grid of 4 ulps of its row's largest
    # magnitude, a third of it zeroed, passed the output-scale bound in bf16)
    elementwise: bool = False


def references(spec, kwargs: dict) -> References:
    """The references for one call's inputs, each computed on private copies (a reference never sees, or changes,
    the tensors a kernel gets). The one place the gate, the benchmark and the kernel tests get them from. A target's
    op (autokernel/target/contract.py) has them from its reference's own sandboxed job: spec.extra['references']."""
    table = spec.extra.get("references")
    if table is not None:
        return table(kwargs)

    def outs(r):
        return list(r) if isinstance(r, (tuple, list)) else [r]
    ref64 = outs(spec.reference(**upcast(kwargs)))
    eager = outs(spec.reference(**{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}))
    floors = outs(spec.rounding(**upcast(kwargs))) if spec.rounding is not None else [None] * len(ref64)
    return References(ref64, eager, floors, elementwise=bool(spec.extra.get("elementwise")))


@dataclass(frozen=True)
class Comparison:
    """One call's outputs compared: reason None when every output passed, else the first failure's code (numeric.
    bad_output | unwritten | nonfinite | mismatch) and one line naming the output; `ratios` is max error / bound per
    float dtype over the outputs compared so far (1.0 is the limit: the gate's numeric slack)."""
    reason: str | None
    detail: str = ""
    ratios: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.reason is None


def compare_outputs(outs: list, ref64: list, eager: list,
                    unwritten: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
                    floors: list | None = None, any_layout: bool = False, declared: dict | None = None,
                    elementwise: bool = False) -> Comparison:
    """Every element of every output of one call against the float64 reference `ref64` and eager torch `eager` (the
    reference run in the call's dtype), in order: count, type, shape, dtype and layout (contiguous where eager is),
    elements never written (`unwritten(t)`: a mask of the elements still holding the allocation poison, the gate's
    harness.poisoned; None where nothing was poisoned), then the values. `floors`: per output, the op's float32
    rounding floor or None (references() gives all three lists)."""
    ratios: dict[str, float] = {}
    if len(outs) != len(eager):
        return Comparison("numeric.bad_output", f"{len(outs)} outputs, the reference has {len(eager)}", ratios)
    for i, (o, e, r) in enumerate(zip(outs, eager, ref64)):
        f = floors[i] if floors else None
        why = _layout(i, o, e, any_layout) or _unwritten(i, o, unwritten) or \
            _values(i, o, e, r, f, ratios, declared, elementwise)
        if why:
            return Comparison(*why, ratios)
    return Comparison(None, "", ratios)


def _layout(i: int, o, e: torch.Tensor, any_layout: bool = False) -> tuple[str, str] | None:
    if type(o) is not torch.Tensor:
        return "numeric.bad_output", f"output {i} is a {type(o).__name__}, not a plain torch.Tensor"
    if o.shape != e.shape or o.dtype != e.dtype:
        return "numeric.bad_output", f"output {i} is {tuple(o.shape)} {o.dtype}, the reference {tuple(e.shape)} " \
                                     f"{e.dtype}"
    if e.is_contiguous() and not o.is_contiguous() and not any_layout:
        return "numeric.bad_output", f"output {i} is not contiguous (strides {o.stride()}), the reference is"
    return None


def _unwritten(i: int, o: torch.Tensor, unwritten) -> tuple[str, str] | None:
    stale = unwritten(o) if unwritten is not None else None
    if stale is None or not bool(stale.any()):
        return None
    first = [int(x) for x in torch.nonzero(stale.reshape(o.shape))[0]]
    return "numeric.unwritten", f"{int(stale.sum())} of {o.numel()} elements of output {i} never written, first at " \
                                f"{first}"


def _values(i: int, o: torch.Tensor, e: torch.Tensor, r: torch.Tensor, floor: torch.Tensor | None,
            ratios: dict[str, float], declared: dict | None = None,
            elementwise: bool = False) -> tuple[str, str] | None:
    o, e, r = o.detach().cpu(), e.detach().cpu(), r.detach().cpu()
    if not o.is_floating_point():
        differ = int((o != r.to(o.dtype)).sum())
        return ("numeric.mismatch", f"output {i}: {differ} elements differ") if differ else None
    r = r.to(torch.float64)
    # where the true value overflows the output dtype (fp16 products past 65504), inf is the right answer;
    # elements whose reference is not finite at all are not compared
    representable = torch.isfinite(r.to(o.dtype))
    if not bool(representable.all()):
        o64 = o.to(torch.float64)
        overflow = torch.isfinite(r) & ~representable
        wrong_way = overflow & ~((o64.abs() >= torch.finfo(o.dtype).max) & (o64.sign() == r.sign()))
        if bool(wrong_way.any()):
            return "numeric.mismatch", f"output {i}: {int(wrong_way.sum())} elements past the {o.dtype} range are " \
                                       "not ±inf of the right sign"
        o, r, e = o[representable], r[representable], e[representable]
        floor = floor.cpu()[representable] if floor is not None else None
    finite_ref = torch.isfinite(r)
    bad = ~torch.isfinite(o.to(torch.float64)) & finite_ref
    if bool(bad.any()):
        return "numeric.nonfinite", f"{int(bad.sum())} NaN/Inf in output {i} where the reference is finite"
    if declared:
        return _declared(i, o, r, finite_ref, declared, ratios)
    return _bound(i, o, e, r, finite_ref, floor, ratios, elementwise)


def _declared(i: int, o: torch.Tensor, r: torch.Tensor, finite_ref: torch.Tensor, declared: dict,
              ratios: dict[str, float]) -> tuple[str, str] | None:
    """A target's own tolerance (autokernel.toml `tolerance = {atol, rtol}`): |o - r| <= atol + rtol * |r|, each
    element, against the float64 reference."""
    err = (o.to(torch.float64) - r).abs()[finite_ref]
    allowed = (declared.get("atol", 0.0) + declared.get("rtol", 0.0) * r.abs())[finite_ref]
    ratio = float((err / allowed.clamp(min=1e-300)).max()) if err.numel() else 0.0
    name = str(o.dtype).removeprefix("torch.")
    ratios[name] = max(ratios.get(name, 0.0), ratio)
    if ratio <= 1.0:
        return None
    k = int(torch.argmax(err / allowed.clamp(min=1e-300)))
    return "numeric.mismatch", f"output {i}: error {float(err[k]):.3g} vs the declared tolerance's " \
                               f"{float(allowed[k]):.3g} (atol {declared.get('atol', 0.0):g}, rtol " \
                               f"{declared.get('rtol', 0.0):g})"


def _bound(i: int, o: torch.Tensor, e: torch.Tensor, r: torch.Tensor, finite_ref: torch.Tensor,
           floor: torch.Tensor | None, ratios: dict[str, float], elementwise: bool = False) -> tuple[str, str] | None:
    """The derived bound (compare), or BROKEN_EAGER_ULPS of the output's scale where eager itself broke."""
    c = compare(o, r, e, o.dtype, floor, elementwise=elementwise)
    ulp_scale = eps(o.dtype) * max(c.scale, torch.finfo(o.dtype).tiny)
    eager_broken = not bool(torch.isfinite(e.to(torch.float64))[finite_ref].all()) or \
        c.eager_err > BROKEN_EAGER_FRACTION * c.scale
    if eager_broken:  # judged as if eager were healthy: (BROKEN_EAGER_ULPS - ULPS) / EAGER_FACTOR ulps off
        broken = c.eager_err
        c = compare(o, r, e, o.dtype, floor, eager_err=(BROKEN_EAGER_ULPS - ULPS) / EAGER_FACTOR * ulp_scale,
                    elementwise=elementwise)
        detail = f"max error {c.max_err:.3g} vs bound {c.bound:.3g} ({BROKEN_EAGER_ULPS:g} ulps of scale " \
                 f"{c.scale:.3g}: eager torch itself is off by {broken:.3g} here)"
    else:
        detail = c.detail()
    ok, bound = c.ok, c.bound
    name = str(o.dtype).removeprefix("torch.")
    ratio = c.max_err / bound if bound > 0 else (0.0 if c.max_err == 0 else float("inf"))
    ratios[name] = max(ratios.get(name, 0.0), ratio)
    return None if ok else ("numeric.mismatch", f"output {i}: {detail}")
