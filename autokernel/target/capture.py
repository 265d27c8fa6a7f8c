"""Sandbox side of a target's end-to-end stage: the candidate's launcher calls in the live engine, kept for the parent
to judge against the checkout's reference (autokernel/target/e2e.py), as autokernel/gate/e2e_child.py's Capture does
for autokernel's own engine.

Each declared launcher of the candidate's module is wrapped before the engine is built (so `from pkg.ops import f`
in the engine, and the file's own calls through its globals, get the wrapper). Every call's arguments are copied
before it runs, on their own device (moved to the CPU only for the calls kept); after it returns, the first call
of each launcher is kept, and each later one with probability P, drawn from the operating system's randomness only
then, until CAPTURE_BYTES: the candidate cannot tell, while it runs, whether this call will be judged. A launcher that
returns no tensor (vLLM's `silu_and_mul(out, x)`) has as outputs the arguments the call wrote, in parameter order
(the reference's job takes the same of the reference: autokernel/target/refjob.py). Calls whose
arguments are not tensors or plain values (which the reference's job could not load) are counted, not kept.
`calls` counts every call: none means the candidate's code never ran in the engine, and its KL would say nothing
about it. The baseline's job counts its calls only.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import random
import sys
from pathlib import Path

CAPTURE_BYTES = 64 << 20  # the most argument and output bytes kept for judging
P = 0.1  # the chance that a call after a launcher's first is kept
PLAIN = (bool, int, float, str, type(None))


def _copy(x, device: str | None = None):
    """A detached copy of an argument taken around the call: on the tensor's own device (no host synchronisation per
    call where kernels compile), or on `device`; plain values as they are."""
    import torch
    if isinstance(x, torch.Tensor):
        return x.detach().clone() if device is None else x.detach().to(device, copy=True)
    if isinstance(x, (tuple, list)):
        return [_copy(v, device) for v in x]
    return x


def _plain(v) -> bool:
    import torch
    return isinstance(v, (torch.Tensor, torch.dtype)) or type(v) in PLAIN


class Capture:
    def __init__(self, outputs: dict[str, list[int] | list[str] | None], keep: bool = True):
        # launcher -> compared return values (None: every tensor returned), or the written arguments compared
        self.outputs = outputs
        self.keep = keep  # False: count the calls only (the baseline's job)
        self.kept: list[list] = []  # [launcher, kwargs before the call, selected outputs after it]
        self.calls: dict[str, int] = {}
        self.unloadable = 0
        self.bytes = 0
        self._rng = random.SystemRandom()

    def wrap(self, name: str, fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def launcher(*args, **kwargs):
            before = live = None  # counted only; or a call that will raise as it would unwrapped
            if self.keep:
                try:
                    bound = sig.bind(*args, **kwargs)
                    bound.apply_defaults()
                    live = dict(bound.arguments)
                    before = {k: _copy(v) for k, v in live.items()}
                except TypeError:
                    pass
            out = fn(*args, **kwargs)
            first = name not in self.calls
            self.calls[name] = self.calls.get(name, 0) + 1
            if before is not None and (first or (self.bytes < CAPTURE_BYTES and self._rng.random() < P)):
                self._keep(name, before, out, live or {})
            return out
        return launcher

    def _keep(self, name: str, before: dict, out, live: dict) -> None:
        if not all(_plain(v) for v in before.values()):
            self.unloadable += 1
            return
        import torch

        from autokernel.bench.job import selected_outputs
        from autokernel.gate.e2e_child import _nbytes
        from autokernel.target.launches import same_bytes  # what the recorder calls written
        outs = out if isinstance(out, (tuple, list)) else (out,)
        written = [k for k, v in live.items() if isinstance(v, torch.Tensor) and not same_bytes(v, before[k])]
        declared = self.outputs.get(name)
        if declared and isinstance(declared[0], str):  # the written arguments that are its result; the rest scratch
            inplace, declared = [k for k in live if k in declared], None
        else:  # a launcher returning no tensor (silu_and_mul(out, x)): what it wrote is what it computed
            inplace = written if declared is None and not any(isinstance(o, torch.Tensor) for o in outs) else []
        chosen = selected_outputs(out, {"outputs": declared, "inplace": inplace}, live)
        before = {k: _copy(v, "cpu") for k, v in before.items()}
        after = [_copy(o, "cpu") for o in chosen]
        self.bytes += _nbytes(list(before.values())) + _nbytes(after)
        self.kept.append([name, before, after])


def install(module, launchers: list[str], outputs: dict[str, list[int] | list[str] | None],
            keep: bool = True) -> Capture:
    """Wrap each launcher (a function of `module`, or `Class.method`) in one Capture; a static method stays one. A
    function of the module is also replaced wherever another module already bound it (launches.rebind: a package
    `__init__` that imported the model before this ran)."""
    from autokernel.target.launches import rebind
    cap = Capture(outputs, keep)
    swap: dict[int, tuple[object, object]] = {}
    for name in launchers:
        *owner_path, attr = name.split(".")
        owner = module
        for part in owner_path:
            owner = getattr(owner, part)
        raw = inspect.getattr_static(owner, attr)
        if isinstance(raw, staticmethod):
            setattr(owner, attr, staticmethod(cap.wrap(name, raw.__func__)))
        elif isinstance(raw, classmethod):
            setattr(owner, attr, classmethod(cap.wrap(name, raw.__func__)))
        elif owner is module:
            swap[id(raw)] = (raw, cap.wrap(name, raw))
        else:
            setattr(owner, attr, cap.wrap(name, raw))
    rebind(swap)
    return cap


class _OneFile:
    """A finder that gives one module name one file (a meta path entry, ahead of the checkout's own)."""

    def __init__(self, name: str, path: Path):
        self.name, self.path = name, path

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_file_location(fullname, self.path) if fullname == self.name else None


def load_candidate(name: str, path: Path):
    """The candidate file as the checkout's module `name`, the one every part of the engine calls: imported through
    a finder that serves it for that name, so a package `__init__` that imports the model, which imports the op's
    module (vLLM's `vllm/__init__.py`), gets the candidate and never the incumbent. A module already imported (by
    whatever ran before) is replaced and every binding of the incumbent's objects rebound (launches.rebind)."""
    from autokernel import kernel_loader
    from autokernel.target.launches import rebind
    old = sys.modules.get(name)
    if old is None:
        finder = _OneFile(name, path)
        sys.meta_path.insert(0, finder)
        try:
            return importlib.import_module(name)
        finally:
            sys.meta_path.remove(finder)
    mod = kernel_loader.load_kernel("", path, None, name)
    new = vars(mod)
    swap = {id(v): (v, new[k]) for k, v in vars(old).items()
            if k in new and getattr(v, "__module__", None) == name}
    swap[id(old)] = (old, mod)
    rebind(swap)
    return mod
