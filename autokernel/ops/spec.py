"""The trusted description of one op: what it computes, on what inputs, and how much work that is.

A candidate kernel never supplies any of this (docs/design.md trust rule 1). Tests, the gate, the profiler and the
benchmark all read the same spec, so there is one copy of each reference.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

Shape = dict[str, int]
DISTRIBUTIONS = ("normal", "wide", "near_constant", "sparse", "tiny", "outliers")
# "outliers": LLM residual streams carry a few channels far out ("massive activations"): the embedded SmolLM2's
# add_rmsnorm inputs reach |h| = 22,552 on a 265-token prompt. One element in OUTLIER_EVERY at 10^2 .. 10^OUTLIER_EXP
# (log-uniform, random sign), the rest normal: a kernel that clips, drops or soft-saturates large values to save work
# (a `where(|x| < 1000, x, 0)` in the sum of squares) is exact on every other distribution and wrong there.
OUTLIER_EVERY, OUTLIER_EXP = 64, 4.5
# The parts of the gate's "mixed" values (autokernel/gate/numeric.py): not "outliers", which would put a key of
# |q.k| in the thousands in every attention row and make every softmax one-hot, so that the sweep and range cases
# (all "mixed") would check attention's precision nowhere.
MIXED = tuple(d for d in DISTRIBUTIONS if d != "outliers")
MODEL_ROWS = (1, 4, 96)  # tokens in one call of a row-wise op: decode at batch 1 and 4, and a 96-token prefill


@dataclass(frozen=True)
class OpSpec:
    name: str  # == the kernel file's stem == the launcher's name
    reference: Callable[..., Any]  # torch eager, same signature as the launcher; computes in its inputs' dtype
    make_inputs: Callable[..., dict[str, Any]]  # (shape, dtype, device, generator, dist) -> launcher kwargs
    shape_of: Callable[..., Shape]  # launcher kwargs -> shape dict (inverse of make_inputs)
    flops: Callable[[Shape], int]
    bytes_moved: Callable[[Shape, torch.dtype], int]
    model_shapes: tuple[Shape, ...]  # SmolLM2-135M prefill and decode shapes
    # Non-power-of-2, not block multiples, size 1. Checked in every dtype and distribution, with the full call
    # schedule, so each costs many interpreter calls: rows a prime just past 32 (37: whole row blocks up to 32 and a
    # tail) rather than more; more rows are the leading-dimension sweep's job (autokernel/gate/schedule.py).
    odd_shapes: tuple[Shape, ...]
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
    deterministic: bool = True
    # (float64 launcher kwargs) -> per output, elementwise, the error float32 accumulation can make on these inputs
    # where the op amplifies rounding (softmax over large logits): a first-order bound that eager's own error, one
    # rounding order among many, is held to at least (autokernel/ops/tolerance.py). None: eager's error stands.
    rounding: Callable[..., Any] | None = None
    doc: str = ""  # what the op computes, in words, for people and for the agent's prompt
    extra: dict[str, Any] = field(default_factory=dict)


def sample(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device, gen: torch.Generator,
           dist: str = "normal") -> torch.Tensor:
    """Activation-like values drawn to break shortcuts (docs/shortcuts.md #10, #12, #14)."""
    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    if dist == "wide":  # large range and magnitude: overflow-prone kernels fail here
        mag = torch.exp(torch.rand(shape, generator=gen) * 6.0 - 1.0)  # e^-1 .. e^5
        x = x * mag
    elif dist == "near_constant":  # rows nearly constant: constant-output kernels look right only on these
        x = 3.0 + 1e-2 * x
    elif dist == "sparse":  # zeros in places
        x = x * (torch.rand(shape, generator=gen) > 0.5)
    elif dist == "tiny":  # atol-hiding kernels fail on the relative check
        x = x * 1e-3
    elif dist == "outliers":
        far = torch.rand(shape, generator=gen) * OUTLIER_EVERY < 1
        mag = 10.0 ** (2.0 + (OUTLIER_EXP - 2.0) * torch.rand(shape, generator=gen))
        far = _channel_runs(far, gen)
        x = torch.where(far, torch.where(x < 0, -mag, mag), x)
    elif dist != "normal":
        raise ValueError(f"unknown distribution {dist!r}; one of {DISTRIBUTIONS}")
    return x.to(dtype=dtype, device=device)


def _channel_runs(far: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`far` with a few channels (last-dimension indices) far out down a run of consecutive rows each, as an LLM's
    massive activations sit in fixed channels token after token (SmolLM2's last layers: runs of 13-68 tokens at
    |h| >= 256): a kernel keyed on a channel large in several consecutive rows was exact on scattered outliers. Drawn
    from a generator derived from `gen`'s state without advancing it, so every other value of the case stays the
    seed's."""
    if far.dim() < 2 or far.numel() == 0:
        return far
    n, rows = far.shape[-1], far.numel() // far.shape[-1]
    g = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(gen.get_state().numpy().tobytes()).digest()[:8],
                                                     "little") >> 1)
    flat = far.reshape(rows, n).clone()
    for c in torch.randint(0, n, (max(1, n // 256),), generator=g).tolist():
        start = int(torch.randint(0, rows, (1,), generator=g))
        length = int(torch.randint(1, rows - start + 1, (1,), generator=g))
        flat[start:start + length, c] = True
    return flat.reshape(far.shape)


def leading(M: int, gen: torch.Generator) -> tuple[int, ...]:
    """The leading dimensions of M rows as the engine passes them (its hidden states are (B, T, N)): (1, M) three
    times in four (one prefill), (b, M // b) for a divisor b of M in 2..4 one in eight (a batch; (1, M) where M has
    none), else (M,). A launcher that reads the rank or shape[0] (`M // shape[0]`: tokens per sequence) saw only 2-D
    inputs, so a path keyed on the sequence length was never run."""
    u = int(torch.randint(0, 8, (1,), generator=gen))
    if u == 0:
        return (M,)
    b = [d for d in (2, 3, 4) if M % d == 0] if u == 1 else []
    pick = b[int(torch.randint(0, len(b), (1,), generator=gen))] if b else 1
    return (pick, M // pick)


def like(ref: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """`other`'s tensors in `ref`'s shapes and dtypes where they hold as many elements: values drawn for a refill,
    a part of "mixed" or another input set of the same case go into the same tensors, whatever leading dimensions or
    ids width each draw picked (leading, embedding.make_ids)."""
    out = dict(other)
    for k, v in other.items():
        r = ref.get(k)
        if isinstance(v, torch.Tensor) and isinstance(r, torch.Tensor) and v.numel() == r.numel() and (
                v.shape != r.shape or v.dtype != r.dtype):
            out[k] = v.reshape(r.shape).to(r.dtype)
    return out


def draw(gen: torch.Generator, lo: float, hi: float, common: tuple[float, ...] = ()) -> float:
    """A scalar argument (rope's theta, a temperature, an eps, a scale) for one case, drawn from the case's secret
    generator: half the time one of `common` (values production sends), else log-uniform over [lo, hi]. Make it after
    the case's tensors, so those stay what the seed made them before. A kernel that ignores the scalar, or is right
    at one value only, is wrong on most cases (docs/shortcuts.md, "scalars")."""
    if common and int(torch.randint(0, 2, (1,), generator=gen)):
        return float(common[int(torch.randint(0, len(common), (1,), generator=gen))])
    u = float(torch.rand((), generator=gen, dtype=torch.float64))
    return float(lo * (hi / lo) ** u)


def upcast(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The float64 copy of a call's arguments, for the reference that errors are measured against."""
    out: dict[str, Any] = {}
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            out[k] = v.detach().to(torch.float64)
        elif isinstance(v, torch.dtype) and v.is_floating_point:
            out[k] = torch.float64
        elif isinstance(v, torch.Tensor):
            out[k] = v.detach().clone()
        else:
            out[k] = v
    return out


def row_shapes(n: int) -> tuple[Shape, ...]:
    """The model shapes of a row-wise op over rows of width n: {"M": rows, "N": n} for each of MODEL_ROWS."""
    return tuple({"M": m, "N": n} for m in MODEL_ROWS)


def row_shape(x: torch.Tensor) -> Shape:
    """A row-wise op's shape from its (..., N) input: every leading dimension folded into the row count M."""
    return {"M": x.numel() // x.shape[-1], "N": x.shape[-1]}


def elem_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
