"""Shared check for the per-op kernel tests: launcher vs float64 reference, tolerance from eager error."""
import importlib

import torch

from autokernel.ops import get
from autokernel.ops.spec import upcast
from autokernel.ops.tolerance import compare


def _outputs(res):
    return list(res) if isinstance(res, (tuple, list)) else [res]


def check(op: str, shape: dict, dtype: torch.dtype, dist: str = "normal", seed: int = 0):
    spec = get(op)
    launcher = getattr(importlib.import_module(f"kernels.{op}"), op)
    gen = torch.Generator().manual_seed(seed)
    kwargs = spec.make_inputs(shape, dtype, "cpu", gen, dist)
    pristine = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    out = _outputs(launcher(**kwargs))
    eager = _outputs(spec.reference(**{k: v.clone() if isinstance(v, torch.Tensor) else v
                                       for k, v in pristine.items()}))
    ref64 = _outputs(spec.reference(**upcast(pristine)))
    assert len(out) == len(ref64)
    for k, v in kwargs.items():  # inputs untouched
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, pristine[k]), f"{op} modified its input {k}"
    for o, e, r in zip(out, eager, ref64):
        assert type(o) is torch.Tensor and o.shape == r.shape, (type(o), o.shape, r.shape)
        assert o.dtype == e.dtype, (o.dtype, e.dtype)
        c = compare(o, r, e, o.dtype)
        assert c.ok, f"{op} {shape} {dtype} {dist}: {c.detail()}"
    return out
