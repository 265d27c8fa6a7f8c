"""Sandbox side of discovery: build the checkout's engine, run its workload, record every Triton launch. Trusted
harness code; the engine it calls is the checkout's (untrusted), so what comes back is data the parent re-checks
(autokernel/target/discover.py).

The hook wraps the one method every launch goes through, `JITFunction.run` (compiled) or
`InterpretedFunction.run` (TRITON_INTERPRET=1), below `kernel[grid](...)`, `@triton.autotune` and
`@triton.heuristics`. Per launch it records the kernel (name, file, line), its grid, its arguments (tensors:
dtype, shape, strides; scalars: type and value) and the launch site: the nearest frame of the stack that is in a
file of the checkout (the launcher: the Python function that called `kernel[grid]`, with its parameter names).
Time is the launch's wall time: under the interpreter the kernel itself; where kernels compile, between a device
synchronisation before and after the launch (`sync`, set by `discover`): the kernel's device time plus its launch
overhead, so shares mean the same on both.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

NOT_PLAIN = ("a launcher is a module-level `def` of the op's file, called with the engine's tensors and plain "
             "values; a method (RMSNorm.forward) or a function a decorator replaced (torch.library.custom_op) is not "
             "one: declare the plain function it calls, or move the kernel launch into one")
MAX_SIGNATURES = 32  # distinct argument signatures kept per (kernel, site); more are counted, not listed
MAX_GRIDS = 16
MAX_GROUPS = 512  # distinct (kernel, site) pairs kept
_SCALARS = (bool, int, float)
INSTALLED_DIRS = frozenset({"site-packages", "dist-packages"})  # installed packages, not the checkout's own code


def installed(path: str) -> bool:
    """`path` is in an installed package's directory: a virtual environment inside the checkout (`.venv/lib/
    python3.11/site-packages/...`) holds triton and torch, whose frames are not launchers and whose files are not
    the checkout's kernels."""
    return not INSTALLED_DIRS.isdisjoint(path.split(os.sep))


def _describe(value):
    """One argument as plain data: ("tensor", dtype, shape, strides) | (type name, value) | ("dtype", name) |
    ("other", type name): a string longer than the parent keeps is "other" too, never a truncated value to replay."""
    if hasattr(value, "data_ptr") and hasattr(value, "shape"):
        return ("tensor", str(value.dtype).removeprefix("torch."), tuple(int(s) for s in value.shape),
                tuple(int(s) for s in value.stride()))
    if type(value) in _SCALARS or value is None:
        return (type(value).__name__, value)
    if type(value) is str and len(value) <= 64:
        return ("str", value)
    if type(value).__name__ == "dtype" and type(value).__module__ == "torch":  # out_dtype=torch.float32
        return ("dtype", str(value).removeprefix("torch."))
    return ("other", type(value).__name__)



def _unwrapped(obj):
    """obj with its __wrapped__ chain followed (inspect.unwrap), or obj where the chain is a cycle."""
    try:
        return inspect.unwrap(obj)
    except ValueError:
        return obj

class LaunchHook:
    """Records launches while `active`; `groups` is the result, keyed by (kernel file, kernel, site file, site)."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root).rstrip(os.sep) + os.sep
        self.active = False
        self.groups: dict[tuple, dict] = {}
        self.dropped = 0  # launches past MAX_GROUPS
        self.overhead_s = 0.0  # the hook's own time (stack walk, argument description), launches excluded
        # where kernels compile: torch.cuda.synchronize, so a launch's time includes the kernel's
        self.sync: Callable[[], object] | None = None
        self.recorder: LauncherRecorder | None = None  # the declared launchers: which one a launch ran inside
        self._inside: dict[str, str | None] = {}

    def rel(self, filename: str) -> str | None:
        """The path of `filename` relative to the checkout, None when it is not a file of it (or is an installed
        package's file in it: `installed`)."""
        r = self._inside.get(filename)
        if r is None and filename not in self._inside:
            a = os.path.abspath(filename)
            inside = a.startswith(self.root) and not installed(a[len(self.root):])
            r = self._inside[filename] = a[len(self.root):] if inside else None
        return r

    def site(self, frame) -> dict | None:
        """The nearest frame in the checkout: the launcher."""
        while frame is not None:
            rel = self.rel(frame.f_code.co_filename)
            if rel is not None:
                code = frame.f_code
                nparams = code.co_argcount + code.co_kwonlyargcount
                qualname = getattr(code, "co_qualname", code.co_name)
                # a launcher the gate can call: the module's own name for this function (not a method, a nested
                # function, or one a decorator such as torch.library.custom_op replaced in the module); a wrapping
                # decorator that keeps the function as __wrapped__ (@torch.inference_mode(), functools.wraps) is
                # the function still, called through its wrapper
                plain = qualname == code.co_name and getattr(_unwrapped(frame.f_globals.get(code.co_name)),
                                                             "__code__", None) is code
                return {"file": rel, "function": qualname, "def_line": code.co_firstlineno, "line": frame.f_lineno,
                        "params": list(code.co_varnames[:nparams]), "plain": plain}
            frame = frame.f_back
        return None

    def wrap(self, run):
        hook = self

        def run_recorded(kernel, *args, grid, warmup, **kwargs):
            if not hook.active or warmup:
                return run(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            if hook.sync is not None:
                hook.sync()
            t0 = time.perf_counter()
            out = run(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            if hook.sync is not None:
                hook.sync()
            t1 = time.perf_counter()
            hook.record(kernel, args, kwargs, grid, t1 - t0, sys._getframe(1))
            hook.overhead_s += time.perf_counter() - t1
            return out

        run_recorded.__dict__["_ak_hook"] = True  # a function attribute, which mypy does not model
        return run_recorded

    def install(self) -> None:
        import triton.runtime.jit as jit
        classes = [jit.JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except ImportError:  # pragma: no cover - a triton without the interpreter
            pass
        for cls in classes:
            if not getattr(cls.run, "_ak_hook", False):
                cls.run = self.wrap(cls.run)

    def record(self, kernel, args, kwargs, grid, seconds: float, frame) -> None:
        fn = getattr(kernel, "fn", None)
        code = getattr(fn, "__code__", None)
        name = getattr(fn, "__name__", type(kernel).__name__)
        kfile = code.co_filename if code is not None else "?"
        site = self.site(frame)
        via = self.recorder.stack[-1] if self.recorder is not None and self.recorder.stack else None
        key = (kfile, name, site and site["file"], site and site["function"], via)
        g = self.groups.get(key)
        if g is None:
            if len(self.groups) >= MAX_GROUPS:
                self.dropped += 1
                return
            g = self.groups[key] = {"kernel": name, "kernel_file": self.rel(kfile) or kfile, "kernel_in_checkout":
                                    self.rel(kfile) is not None, "kernel_line": code.co_firstlineno if code else 0,
                                    "site": site, "via": via, "calls": 0, "seconds": 0.0, "grids": [],
                                    "signatures": [],
                                    "signature_calls": [], "other_signatures": 0, "lines": []}
        g["calls"] += 1
        g["seconds"] += seconds
        if site is not None and site["line"] not in g["lines"] and len(g["lines"]) < 8:
            g["lines"].append(site["line"])
        try:
            grid_v = grid(self._named(kernel, args, kwargs)) if callable(grid) else grid
            grid_v = tuple(int(x) for x in grid_v)
        except Exception:  # noqa: BLE001 -- a grid lambda that wants launch meta-parameters: not recorded
            grid_v = None
        if grid_v is not None and grid_v not in g["grids"] and len(g["grids"]) < MAX_GRIDS:
            g["grids"].append(grid_v)
        sig = tuple(self._named(kernel, args, kwargs, describe=True).items())
        if sig in g["signatures"]:
            g["signature_calls"][g["signatures"].index(sig)] += 1
        elif len(g["signatures"]) < MAX_SIGNATURES:
            g["signatures"].append(sig)
            g["signature_calls"].append(1)
        else:
            g["other_signatures"] += 1

    @staticmethod
    def _named(kernel, args, kwargs, describe: bool = False) -> dict:
        names = list(getattr(kernel, "arg_names", []) or [])
        out = {}
        for i, v in enumerate(args):
            out[names[i] if i < len(names) else f"arg{i}"] = _describe(v) if describe else v
        for k, v in kwargs.items():
            if k in names:
                out[k] = _describe(v) if describe else v
        return out

    def result(self) -> list[dict]:
        out = []
        for g in self.groups.values():
            g = dict(g)
            g["signatures"] = [[list(kv) for kv in sig] for sig in g["signatures"]]
            out.append(g)
        return out


class LauncherRecorder:
    """The declared launchers' calls, recorded at the launcher's own boundary (what the gate replays): per launcher,
    each distinct argument layout (bound to its parameter names, defaults applied: tensors as dtype, shape, strides;
    scalars and strings as values) with its call count, which tensor arguments a call wrote in place (their bytes
    changed, and a returned tensor shares their storage, as Liger's rope returns q and k, or the call returned no
    tensor at all, as vLLM's `silu_and_mul(out, x)` and `fused_add_rms_norm(x, residual, weight, eps)`: then the
    written inputs are the outputs; an input written beside returned outputs is not one, so the gate holds it
    unchanged and the values left in it are never unchecked), and what the first call returned. The launcher is
    wrapped in its own module, and wherever another module already bound it (`rebind`), before the engine is built,
    so every call by name goes through the wrapper."""

    def __init__(self):
        self.active = False
        self.groups: dict[tuple[str, str], dict] = {}
        self.stack: list[str] = []  # "file:launcher" of the declared launchers running now, innermost last

    def install(self, module_name: str, names: list[str], rel_file: str) -> list[str]:
        """Wrap each of `names` in the module, and wherever else a module already bound it (`rebind`: a package
        `__init__` that imports the model, whose `from .ops import f` ran before this); the names that are not
        plain functions of it (reported, not wrapped)."""
        import types
        module = importlib.import_module(module_name)
        missing, swap = [], {}
        for name in names:
            fn = vars(module).get(name)
            if name not in vars(module):  # vLLM/SGLang: the kernel in ops/triton/x.py, its launcher in ops/x.py
                missing.append(f"{name} (no such name in {rel_file}: a launcher is a function of the kernel's own "
                               "file; move or wrap it there)")
                continue
            if not isinstance(fn, types.FunctionType):
                missing.append(name)
                continue
            swap[id(fn)] = (fn, self.wrap(fn, rel_file, name))
        rebind(swap)
        return missing

    def wrap(self, fn, rel_file: str, name: str):
        import functools
        import inspect
        sig = inspect.signature(fn)
        rec = self

        @functools.wraps(fn)
        def launcher(*args, **kwargs):
            if not rec.active:
                return fn(*args, **kwargs)
            try:
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                named = dict(bound.arguments)
            except TypeError:  # the call itself is wrong: let the launcher raise it
                return fn(*args, **kwargs)
            g = rec.groups.setdefault((rel_file, name), {"file": rel_file, "launcher": name, "calls": 0,
                                                         "signatures": [], "signature_calls": [], "written": [],
                                                         "returns": None})
            layout = tuple((k, _describe(v)) for k, v in named.items())
            check = layout not in g["signatures"] or g["signature_calls"][g["signatures"].index(layout)] < 2
            before = {k: _bytes(v).clone() for k, v in named.items() if _is_tensor(v)} if check else {}
            rec.stack.append(f"{rel_file}:{name}")
            try:
                out = fn(*args, **kwargs)
            finally:
                rec.stack.pop()
            g["calls"] += 1
            if layout in g["signatures"]:
                g["signature_calls"][g["signatures"].index(layout)] += 1
            elif len(g["signatures"]) < MAX_SIGNATURES:
                g["signatures"].append(layout)
                g["signature_calls"].append(1)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            returned = {v.untyped_storage().data_ptr() for v in outs if _is_tensor(v)}
            for k, b in before.items():  # an in-place output: written AND returned, or written by a call that
                # returns no tensor (vLLM's silu_and_mul(out, x) -> None): its written inputs are its outputs
                if k not in g["written"] and (not returned or named[k].untyped_storage().data_ptr() in returned) \
                        and not bool((_bytes(named[k]) == b).all()):
                    g["written"].append(k)
            if g["returns"] is None:
                g["returns"] = [_describe(v) for v in (out if isinstance(out, (tuple, list)) else (out,))][:16]
            return out

        return launcher

    def result(self) -> list[dict]:
        out = []
        for g in self.groups.values():
            g = dict(g)
            g["signatures"] = [[list(kv) for kv in sig] for sig in g["signatures"]]
            out.append(g)
        return out


def rebind(swap: Mapping[int, tuple[object, object]]) -> int:
    """Point every module-level name bound to an old object at its new one (swap: id(old) -> (old, new)), in every
    module of sys.modules, and the attributes of the classes a module outside installed packages defines: an
    engine whose package `__init__` imported the model before a launcher was wrapped (or a candidate loaded) holds
    the old function in its own globals (`from .layers.rotary import rotary_embedding`), which no setattr on the
    launcher's module reaches. Returns how many bindings changed."""
    n = 0
    for mod in list(sys.modules.values()):
        try:
            d = vars(mod)
        except TypeError:
            continue
        own = not installed(str(d.get("__file__") or ""))
        for k, v in list(d.items()):
            new = swap.get(id(v))
            if new is not None and new[0] is v:
                d[k] = new[1]
                n += 1
            elif own and isinstance(v, type) and v.__module__ == d.get("__name__"):
                for ck, cv in list(vars(v).items()):
                    new = swap.get(id(cv))
                    if new is not None and new[0] is cv:
                        setattr(v, ck, new[1])
                        n += 1
    return n


def _is_tensor(v) -> bool:
    return hasattr(v, "data_ptr") and hasattr(v, "shape") and hasattr(v, "stride")


def _bytes(t):
    """A tensor's elements as raw bytes, in logical order (a written element changes them, NaN or not)."""
    import torch
    flat = t.detach().reshape(-1)
    return flat.contiguous().view(torch.uint8) if flat.dtype != torch.bool else flat.clone()


def same_bytes(a, b) -> bool:
    """Whether a call left a tensor as it was (_bytes equal): what the recorder, the e2e capture and the reference's
    job each call written."""
    import torch
    return torch.equal(_bytes(a), _bytes(b))


def _where(root: str) -> str:
    """The innermost frame of the current exception that is in the checkout: "file:line" (or "")."""
    tb = sys.exc_info()[2]
    hook, found = LaunchHook(root), ""
    while tb is not None:
        rel = hook.rel(tb.tb_frame.f_code.co_filename)
        if rel is not None:
            found = f"{rel}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def _failed(stage: str, root: str, e: BaseException) -> dict:
    traceback.print_exc()  # the job's log (sandbox.log, written by the parent)
    last = (traceback.format_exception_only(type(e), e) or [type(e).__name__])[-1].strip()
    return {"failed": stage, "detail": last[:500] + _hint(e), "where": _where(root)}


def _hint(e: BaseException) -> str:
    """What the sandbox changes that the error may come from (the engine ran fine outside it)."""
    import errno
    import socket
    if isinstance(e, socket.gaierror) or isinstance(e, OSError) and e.errno in (errno.ENETUNREACH, errno.ECONNREFUSED):
        return " [the sandbox has no network: load weights and configs from files]"
    if isinstance(e, OSError) and e.errno == errno.EROFS:
        return " [the checkout is read-only in the sandbox: write to tempfile.gettempdir()]"
    return ""


def run_in(root: str) -> None:
    """The job's working directory: the checkout's root, as when the user runs the engine from it (a config or
    weights file opened by a relative path was a bare FileNotFoundError from the sandbox's scratch directory)."""
    os.chdir(root)


def discover(payload: dict, inputs: Path) -> dict:
    """Sandbox entry: payload {"root": checkout, "build": "module:function", "probe_ids": [[int]], "launchers":
    {module: [[launcher names], file relative to the checkout]} (the declared ops, optional)}. Returns the launch
    groups, the declared launchers' calls and the timings, or {"failed": stage, "detail", "where"} when the engine
    broke its contract."""
    from autokernel import device
    device.ensure_interpreter()
    from autokernel import interp
    interpreted = interp.install()
    root, build = payload["root"], payload["build"]
    run_in(root)
    hook = LaunchHook(root)
    hook.install()
    if not interpreted:
        import torch
        hook.sync = torch.cuda.synchronize if torch.cuda.is_available() else None
    recorder = LauncherRecorder()
    hook.recorder = recorder
    module, _, fn = build.partition(":")
    t0 = time.perf_counter()
    try:
        missing = [f"{m}:{name}" for m, (names, rel) in (payload.get("launchers") or {}).items()
                   for name in recorder.install(m, names, rel)]
        if missing:
            return {"failed": "launchers", "detail": f"{', '.join(missing[:8])}: not a plain function of its module "
                    f"({NOT_PLAIN})", "where": ""}
        engine = getattr(importlib.import_module(module), fn)()
    except BaseException as e:  # noqa: BLE001 -- the engine's own error is the user's to fix: reported as data
        return _failed("build", root, e)
    build_s = time.perf_counter() - t0
    for method in ("workload", "logits"):
        if not callable(getattr(engine, method, None)):
            return {"failed": "contract", "detail": f"returned a {type(engine).__name__} without a {method}() "
                                                   "method (docs/targets.md: the engine contract)", "where": ""}
    hook.active = recorder.active = True
    t0 = time.perf_counter()
    try:
        engine.workload()
    except BaseException as e:  # noqa: BLE001
        return _failed("workload", root, e)
    finally:
        hook.active = recorder.active = False
    workload_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        logits = engine.logits(payload["probe_ids"])
    except BaseException as e:  # noqa: BLE001
        return _failed("logits", root, e)
    shape = tuple(int(s) for s in getattr(logits, "shape", ()))
    return {"launches": hook.result(), "launcher_calls": recorder.result(), "dropped": hook.dropped,
            "build_s": build_s, "workload_s": workload_s,
            "hook_s": hook.overhead_s, "logits_s": time.perf_counter() - t0, "logits_shape": shape,
            "logits_dtype": str(getattr(logits, "dtype", type(logits).__name__)), "interpreted": interpreted,
            "pinned": interp.pinned()}
