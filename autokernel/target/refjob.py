"""Sandbox side of a target's reference: run the checkout's torch reference on the value sets the gate made.

Trusted harness code calling untrusted code (the checkout's reference function), in its own job: never in the
candidate's, never in the autokernel process (docs/design.md, trust rule 6). Per value set it returns the reference's
outputs in float64 (every float tensor upcast, as autokernel's own references are run: autokernel.ops.spec.upcast)
and in the inputs' own dtypes (eager, whose error against float64 sizes the tolerance), as torch.save bytes; the
parent checks what it loads.
"""
from __future__ import annotations

import importlib
import io
from pathlib import Path


def _outs(r) -> list:
    return list(r) if isinstance(r, (tuple, list)) else [r]


def references(payload: dict, inputs) -> dict:
    """payload {"root": checkout, "reference": "module:function", "sets": [file names in `inputs`]} ->
    {"sets": {name: bytes}} or {"failed": "reference", "detail", "where"}."""
    import torch

    from autokernel.ops.spec import upcast
    module, _, fn = payload["reference"].partition(":")
    out = {}
    try:
        ref = getattr(importlib.import_module(module), fn)
        for name in payload["sets"]:
            kw = torch.load(Path(inputs) / name, weights_only=True)
            ref64 = _outs(ref(**upcast(kw)))
            eager = _outs(ref(**{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}))
            buf = io.BytesIO()
            torch.save({"ref64": [t.detach().contiguous() for t in ref64 if isinstance(t, torch.Tensor)]
                        if all(isinstance(t, torch.Tensor) for t in ref64) else [],
                        "eager": [t.detach().contiguous() for t in eager if isinstance(t, torch.Tensor)]
                        if all(isinstance(t, torch.Tensor) for t in eager) else []}, buf)
            out[name] = buf.getvalue()
    except BaseException as e:  # noqa: BLE001 -- the reference's error is the user's to fix: reported as data
        from autokernel.target.launches import _failed
        return _failed("reference", payload["root"], e)
    return {"sets": out}
