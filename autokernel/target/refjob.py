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

import torch


def _outs(r, kw: dict, before: dict, inplace: list[str] | None) -> list:
    """What the reference returned; for a launcher whose outputs are the arguments it writes (`inplace`) and a
    reference that returns no tensor (vLLM's forward_native writing `out`), those arguments after it ran (inplace
    None: the end-to-end stage's calls, judged without the workload's records: the arguments it changed, in
    parameter order, as autokernel/target/capture.py takes the candidate's)."""
    outs = list(r) if isinstance(r, (tuple, list)) else [r]
    if any(isinstance(o, torch.Tensor) for o in outs):
        return outs
    if inplace is None:
        from autokernel.target.launches import same_bytes
        inplace = [k for k, v in kw.items() if isinstance(v, torch.Tensor) and not same_bytes(v, before[k])]
    return [kw[k] for k in inplace if isinstance(kw.get(k), torch.Tensor)] or outs


def references(payload: dict, inputs) -> dict:
    """payload {"root": checkout, "reference": "module:function", "sets": [file names in `inputs`], "inplace":
    [parameters that are the outputs of a launcher returning no tensor] or None (infer: `_outs`)} ->
    {"sets": {name: bytes}} or {"failed": "reference", "detail", "where"}."""
    from autokernel.ops.spec import upcast
    module, _, fn = payload["reference"].partition(":")
    out = {}
    try:
        ref = getattr(importlib.import_module(module), fn)
        for name in payload["sets"]:
            kw = torch.load(Path(inputs) / name, weights_only=True)
            inplace = payload.get("inplace")
            kw64 = upcast(kw)
            before = {k: v.clone() for k, v in kw64.items() if isinstance(v, torch.Tensor)}
            ref64 = _outs(ref(**kw64), kw64, before, inplace)
            kw_eager = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
            before = {k: v.clone() for k, v in kw_eager.items() if isinstance(v, torch.Tensor)}
            eager = _outs(ref(**kw_eager), kw_eager, before, inplace)
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
