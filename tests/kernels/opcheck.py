"""Shared check for the per-op kernel tests: launcher vs float64 reference, compared by the gate's own comparison
(autokernel.ops.tolerance.compare_outputs), so a kernel test passes exactly what the gate's numeric stage would pass."""
import importlib

import torch

from autokernel import device
from autokernel.ops import get
from autokernel.ops.tolerance import compare_outputs, references

# Where `check` puts its inputs: the GPU on a CUDA machine (compiled kernels: benchmarks/gpu_check.py runs these
# tests there), else the CPU (the Triton interpreter).
DEV = "cuda" if device.is_cuda() else "cpu"


def _outputs(res):
    return list(res) if isinstance(res, (tuple, list)) else [res]


def verdict(outs: list, refs) -> str | None:
    """None if the outputs pass, else the comparison's reason and detail (what `check` asserts on)."""
    j = compare_outputs(outs, refs.ref64, refs.eager, None, refs.floors, elementwise=refs.elementwise)
    return None if j.ok else f"{j.reason}: {j.detail}"


def check(op: str, shape: dict, dtype: torch.dtype, dist: str = "normal", seed: int = 0):
    spec = get(op)
    launcher = getattr(importlib.import_module(f"kernels.{op}"), op)
    gen = torch.Generator().manual_seed(seed)
    kwargs = spec.make_inputs(shape, dtype, DEV, gen, dist)
    pristine = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    out = _outputs(launcher(**kwargs))
    refs = references(spec, pristine)
    for k, v in kwargs.items():  # inputs untouched
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, pristine[k]), f"{op} modified its input {k}"
    why = verdict(out, refs)
    assert why is None, f"{op} {shape} {dtype} {dist}: {why}"
    return out
