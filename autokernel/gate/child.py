"""The trusted harness inside the sandbox: import a candidate, call it under watch, save what it returned.

Runs in the sandboxed child as `autokernel.gate.child:numeric` (autokernel.sandbox contract). It never sees the seed
or the reference: the parent generated the inputs (the job's read-only input directory) and compares the returned
outputs itself. This side checks what only the process that ran the candidate can see:

- runtime: the candidate's own @triton.jit kernel launched on every call; torch ran no compute (an aten-level
  allowlist, below); torch flags, RNG states, patched functions, trusted modules and thread count unchanged by the
  import and by the calls.
- numeric, the parts that need the live tensors: outputs are plain tensors, share no storage with the inputs or with
  an earlier call's outputs, and the inputs' whole storages are unchanged.

Every fresh allocation made while the candidate runs (torch.empty & co., at import and in calls) is filled with the
parent's poison, a NaN with a random payload, so an output element the kernel never wrote shows in the parent.

Calls: the parent's list, in its (secret, shuffled) order, each naming its case, its mode (fresh: the case's tensors
A as loaded; copy: A's first values at new addresses; refill: new values written into A's own storages, same
objects, addresses and ids; repeat: A as it stands) and the order the interpreter runs the grid's programs in
(ProgramOrder). This side does not know which call is checked how: all of them are, in the parent.

Allowed aten ops during a call (anything else is runtime.torch_compute):
  allocation  empty*, new_empty*, zeros*/ones*/full* and new_*, fill_ with a Python scalar, zero_
  views       view, _unsafe_view, reshape/_reshape_alias, as_strided, expand, permute, transpose, t, slice, select,
              narrow, squeeze, unsqueeze, split*, unbind, unfold, alias, detach
  copies      clone, contiguous, copy_ and _to_copy only without a dtype or device change (a cast is compute: the
              kernel loads and converts)
  in a launch set_ as well (the Triton interpreter re-wraps storages)
Reading a value on the host (item, _local_scalar_dense), arange/rand*, every math op and every reduction are out.
"""
from __future__ import annotations

import builtins
import hashlib
import io
import os
import random
import sys
import threading
import time
import types
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autokernel import kernel_loader

if not torch.cuda.is_available():  # before triton is imported: kernels run through the interpreter (kernels/__init__)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from autokernel.gate.allowlist import ALLOC, COPY, LAUNCH_ONLY, POISONED, VIEW  # noqa: E402  (one table: static too)

ALLOWED_OPS = ALLOC | VIEW | COPY | LAUNCH_ONLY | {"fill_"}  # by name: what the parent re-checks each call's ops for
TRUSTED_MODULES = ("autokernel.ops", "autokernel.engine", "autokernel.bench", "kernels")
INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# Bound before any candidate code runs: what the harness itself calls afterwards.
_save, _equal, _empty, _perf = torch.save, torch.equal, torch.empty, time.perf_counter
_BytesIO = io.BytesIO  # the output snapshots' buffer (autokernel.sandbox: outputs go back through the result pipe)


class Forbidden(BaseException):
    """Raised inside the candidate's call at the first forbidden aten op; BaseException so nothing in between
    (the interpreter wraps Exception) can swallow it. The violation is recorded before raising, so it stands
    even if it were swallowed."""


class Guard(TorchDispatchMode):
    """Sees every aten op while active: allowlist, poison, launch depth."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # torch would wrap __torch_dispatch__ in dynamo.disable, importing dynamo: ~3 s per sandbox job

    def __init__(self, poison: dict[str, int]):
        super().__init__()
        self.poison = poison
        self.violation: str | None = None
        self.in_launch = 0
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.ops[name] = self.ops.get(name, 0) + 1
        why = self.forbidden(func, name, args, kwargs)
        if why:
            if self.violation is None:
                self.violation = why
            raise Forbidden(why)
        out = func(*args, **kwargs)
        if name in POISONED and not self.in_launch and isinstance(out, torch.Tensor):
            self.fill_poison(out)
        return out

    def forbidden(self, func, name, args, kwargs) -> str | None:
        if name in ALLOC or name in VIEW or (self.in_launch and name in LAUNCH_ONLY):
            return None
        if name == "fill_":
            return None if func.__name__ == "fill_.Scalar" else f"aten.{func.__name__}: fills with a tensor's " \
                                                                 "value (reads the data on the host)"
        if name in COPY:
            src = args[1] if name == "copy_" else args[0]
            dst_dtype = args[0].dtype if name == "copy_" else kwargs.get("dtype") or src.dtype
            dst_device = args[0].device if name == "copy_" else kwargs.get("device") or src.device
            if dst_dtype != src.dtype or torch.device(dst_device) != src.device:
                return (f"aten.{func.__name__} {src.dtype}->{dst_dtype} on {src.device}->{dst_device}: a cast or "
                        "transfer outside the kernel")
            return None
        return f"aten.{func.__name__}: torch compute outside the Triton kernel"

    def fill_poison(self, t: torch.Tensor) -> None:
        if not t.numel() or t.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            return
        bits = self.poison.get(str(t.dtype).removeprefix("torch."))
        if bits is None:
            return
        idt = INT_OF_SIZE[t.element_size()]
        width = 8 * t.element_size()
        signed = bits - (1 << width) if bits >= 1 << (width - 1) else bits
        t.view(idt).fill_(signed)


class LaunchHook:
    """Counts launches of @triton.jit kernels defined in the candidate's module (not of anyone else's kernels)."""

    def __init__(self, module_name: str, guard: Guard):
        self.module_name, self.guard, self.count = module_name, guard, 0
        self.patched: list[tuple[type, object]] = []
        self.order = ProgramOrder()

    def install(self) -> None:
        self.order.install()
        from triton.runtime.jit import JITFunction
        classes = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except ImportError:
            pass
        for cls in classes:
            orig = cls.__dict__["run"]
            self.patched.append((cls, orig))
            cls.run = self.wrap(orig)

    def wrap(self, orig):
        hook = self

        def run(kernel, *args, **kwargs):
            fn = getattr(kernel, "fn", None)
            mine = getattr(fn, "__module__", None) == hook.module_name and not kwargs.get("warmup", False)
            if not mine:
                return orig(kernel, *args, **kwargs)
            hook.count += 1
            hook.guard.in_launch += 1
            try:
                return orig(kernel, *args, **kwargs)
            finally:
                hook.guard.in_launch -= 1
        return run

    def identity(self) -> dict[str, int]:
        ids = {f"{cls.__qualname__}.run": id(cls.__dict__["run"]) for cls, _ in self.patched}
        return {**ids, **self.order.identity()}


class ProgramOrder:
    """Runs the Triton interpreter's grid programs in the order each call asks for: "asc" (the interpreter's own),
    "desc" or a seeded "shuffle" (autokernel/gate/schedule.py). The interpreter loops x, y, z in order and announces
    each program with set_grid_idx; this remaps the announced index through a permutation of the whole grid, so a
    program's result can depend on another's only if the kernel races (a GPU gives no order either). Compiled
    kernels (CUDA) are left alone: the hardware already orders programs as it likes."""

    def __init__(self):
        self.mode, self.rng = "asc", random.Random(0)
        self.dims: tuple[int, int, int] = (1, 1, 1)
        self.perm: list[int] | None = None
        self.cls = None

    def set(self, mode: str, seed: int) -> None:
        self.mode = mode
        self.rng.seed(seed)

    def install(self) -> None:
        try:
            from triton.runtime.interpreter import InterpreterBuilder
        except ImportError:
            return
        self.cls = InterpreterBuilder
        order, set_dim, set_idx = self, InterpreterBuilder.set_grid_dim, InterpreterBuilder.set_grid_idx

        def set_grid_dim(builder, nx, ny, nz):
            order.dims, n = (nx, ny, nz), nx * ny * nz
            order.perm = None
            if order.mode == "desc":
                order.perm = list(range(n - 1, -1, -1))
            elif order.mode == "shuffle":
                order.perm = list(range(n))
                order.rng.shuffle(order.perm)
            return set_dim(builder, nx, ny, nz)

        def set_grid_idx(builder, x, y, z):
            if order.perm is not None:
                _, ny, nz = order.dims
                k = order.perm[(x * ny + y) * nz + z]
                x, y, z = k // (ny * nz), (k // nz) % ny, k % nz
            return set_idx(builder, x, y, z)

        InterpreterBuilder.set_grid_dim, InterpreterBuilder.set_grid_idx = set_grid_dim, set_grid_idx

    def identity(self) -> dict[str, int]:
        if self.cls is None:
            return {}
        return {f"InterpreterBuilder.{m}": id(self.cls.__dict__[m]) for m in ("set_grid_dim", "set_grid_idx")}


class Failure(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


# --- global state -----------------------------------------------------------------------------------------------------

def _digest(obj) -> str:
    return hashlib.sha256(repr(obj).encode()).hexdigest()[:16]


def _flags() -> dict[str, object]:
    getters = {
        "torch.backends.cuda.matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
            lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction":
            lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "torch.backends.cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
        "torch.backends.cudnn.enabled": lambda: torch.backends.cudnn.enabled,
        "torch.backends.cudnn.benchmark": lambda: torch.backends.cudnn.benchmark,
        "torch.backends.cudnn.deterministic": lambda: torch.backends.cudnn.deterministic,
        "torch.backends.mkldnn.enabled": lambda: torch.backends.mkldnn.enabled,
        "torch.float32_matmul_precision": torch.get_float32_matmul_precision,
        "torch.deterministic_algorithms": torch.are_deterministic_algorithms_enabled,
        "torch.default_dtype": torch.get_default_dtype,
        "torch.grad_enabled": torch.is_grad_enabled,
        "torch.num_threads": torch.get_num_threads,
        "torch.rng_state": lambda: _digest(torch.get_rng_state().tolist()),
        "torch.initial_seed": torch.initial_seed,
        "random.state": lambda: _digest(random.getstate()),
        "numpy.random.state": lambda: _digest(sys.modules["numpy"].random.get_state()[1].tolist())
        if "numpy" in sys.modules else None,
        "torch.function_mode_stack": torch._C._len_torch_function_stack,
        "torch.dispatch_mode_stack": torch._C._len_torch_dispatch_stack,
        "sys.trace": lambda: id(sys.gettrace()),
        "sys.profile": lambda: id(sys.getprofile()),
        "sys.stdout": lambda: id(sys.stdout),
    }
    if torch.cuda.is_available():
        getters["torch.cuda.rng_state"] = lambda: _digest(torch.cuda.get_rng_state().tolist())
        getters["torch.cuda.current_stream"] = lambda: torch.cuda.current_stream().cuda_stream
    out = {}
    for k, get in getters.items():
        try:
            out[k] = get()
        except Exception as e:  # a flag this torch build lacks: record the failure, compare that
            out[k] = f"unreadable: {type(e).__name__}"
    return out


def _identities(hook: LaunchHook | None) -> tuple[dict[str, int], set[str]]:
    """id() of every function a candidate could patch to fool the harness, the timer or the reference, and the
    attribute names of the classes whose instances the harness uses (an attribute added there shadows a method)."""
    import triton
    import triton.language as tl
    modules = {"torch": torch, "torch.nn.functional": torch.nn.functional, "torch.cuda": torch.cuda,
               "torch.serialization": torch.serialization, "time": time, "builtins": builtins, "random": random,
               "triton": triton, "triton.language": tl, "harness": sys.modules[__name__]}
    classes = {"torch.Tensor": torch.Tensor, "torch._C.TensorBase": torch._C.TensorBase,
               "torch.cuda.Event": torch.cuda.Event, "torch.cuda.Stream": torch.cuda.Stream,
               "torch.UntypedStorage": torch.UntypedStorage}
    ids, names = {}, set()
    for label, space in {**modules, **classes}.items():
        for k, v in list(vars(space).items()):
            if not isinstance(v, (types.ModuleType, int, float, str, bool, type(None))):
                ids[f"{label}.{k}"] = id(v)
            if label in classes and k != "__slotnames__":  # copyreg's cache, filled by the harness's torch.save
                names.add(f"{label}.{k}")
    if hook:
        ids.update(hook.identity())
    return ids, names


def _trusted_modules(own: str) -> set[str]:
    """Trusted modules loaded; the candidate's own module (kernels.<op>) is not one."""
    return {m for m in sys.modules if m.startswith(TRUSTED_MODULES) and m != own}


class Snapshot:
    def __init__(self, hook: LaunchHook | None):
        self.flags, (self.ids, self.names) = _flags(), _identities(hook)
        self.modules = _trusted_modules(hook.module_name if hook else "")
        self.threads = threading.active_count()
        self.environ = dict(os.environ)

    def diff(self, later: "Snapshot") -> tuple[str, str] | None:
        changed = [k for k in self.flags if self.flags[k] != later.flags.get(k)]
        if changed:
            return "runtime.global_state", "changed " + ", ".join(changed[:4])
        env = sorted(k for k in set(self.environ) | set(later.environ) if self.environ.get(k) != later.environ.get(k))
        if env:
            return "runtime.global_state", "changed the environment: " + ", ".join(env[:4])
        patched = [k for k in self.ids if k in later.ids and self.ids[k] != later.ids[k]]
        patched += sorted(later.names - self.names)
        if patched:
            return "runtime.global_state", "replaced " + ", ".join(sorted(patched)[:4])
        new = sorted(later.modules - self.modules)
        if new:
            return "runtime.global_state", "imported trusted module " + ", ".join(new[:4])
        if later.threads > self.threads:
            return "runtime.thread", f"{later.threads - self.threads} thread(s) started and still running"
        return None


# --- tensors ----------------------------------------------------------------------------------------------------------

def _tensors(kwargs: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's whole storage as uint8: what a mutation check must cover (a view's neighbours too)."""
    return _empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _span(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[0] != a[1] and b[0] != b[1]


def _refill(a: dict, b: dict) -> dict:
    """B's values written into A's tensors in place (same objects, addresses, ids); B's other arguments."""
    done = set()
    for k, v in _tensors(a).items():
        w = b[k]
        if v.untyped_storage().data_ptr() in done:
            continue
        done.add(v.untyped_storage().data_ptr())
        if v.untyped_storage().nbytes() == w.untyped_storage().nbytes():
            _storage_bytes(v).copy_(_storage_bytes(w))
        else:
            v.copy_(w)
    return {k: a[k] if isinstance(a[k], torch.Tensor) else b[k] for k in a}


# --- one call ---------------------------------------------------------------------------------------------------------

def _call(launcher, kwargs: dict, guard: Guard, hook: LaunchHook, where: str, kept: list[torch.Tensor]):
    inputs = _tensors(kwargs)
    pristine = {k: _storage_bytes(v).clone() for k, v in inputs.items()}
    guard.violation, hook.count = None, 0
    try:
        with guard:
            res = launcher(**kwargs)
    except BaseException as e:  # the candidate's failure is a verdict, never the harness's
        if guard.violation:
            raise Failure("runtime.torch_compute", f"{guard.violation} ({where})") from None
        msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        raise Failure("runtime.exception", f"{type(e).__name__}: {msg} ({where})") from None
    if guard.violation:
        raise Failure("runtime.torch_compute", f"{guard.violation} ({where})")
    if hook.count == 0:
        raise Failure("runtime.no_triton_launch", f"the call launched none of the candidate's @triton.jit kernels "
                                                  f"({where})")
    outs = list(res) if isinstance(res, (tuple, list)) else [res]
    for i, o in enumerate(outs):
        if type(o) is not torch.Tensor:
            raise Failure("numeric.bad_output", f"output {i} is a {type(o).__module__}.{type(o).__qualname__}, "
                                                f"not a plain torch.Tensor ({where})")
        ref_dev = next(iter(inputs.values())).device if inputs else o.device
        if o.device != ref_dev:
            raise Failure("numeric.bad_output", f"output {i} on {o.device}, inputs on {ref_dev} ({where})")
    for i, o in enumerate(outs):
        for k, v in inputs.items():
            if _overlaps(_span(o), _span(v)):
                raise Failure("numeric.aliasing", f"output {i} shares storage with input {k} ({where})")
        for old in kept:
            if _overlaps(_span(o), _span(old)):
                raise Failure("numeric.aliasing", f"output {i} reuses the storage of an earlier call's output "
                                                  f"({where})")
    for k, v in inputs.items():
        if not _equal(_storage_bytes(v), pristine[k]):
            raise Failure("numeric.input_mutated", f"input {k} (or memory sharing its storage) changed ({where})")
    return outs


def _warm_up(guard: Guard) -> None:
    """Build torch's and Triton's lazy state (thread pool, the dispatch-mode machinery, which sets
    TORCHINDUCTOR_CACHE_DIR on first use, the interpreter) before the first snapshot, with a trusted kernel."""
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(src_ptr, dst_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs))

    torch.randn(1 << 16).sum()
    buf = io.BytesIO()
    _save([torch.zeros(2)], buf)
    torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    with guard:
        src = torch.zeros(16)
        dst = torch.empty(16)
        guard.in_launch += 1
        try:
            _copy[(1,)](src, dst, BLOCK=16)
        finally:
            guard.in_launch -= 1
    guard.ops.clear()


def numeric(payload: dict, inputs) -> dict:
    """Sandbox entry. payload: op, candidate (file name in `inputs`, the job's read-only input directory), poison
    {dtype: bits}, cases {case id: {a, b?, t?: file names in `inputs`}}, calls [{id, case, mode, values, order,
    perm_key}] in the order to make them (autokernel/gate/schedule.py). Returns raw observations only: per call
    made, its id, launches of the candidate's kernels, aten ops seen, seconds, and the torch.save bytes of its outputs
    as the call returned them; the first failure seen here, if any. The parent judges everything (autokernel.sandbox:
    results travel through the pipe, never through files)."""
    job = Path(inputs)
    op = payload["op"]
    module_name = kernel_loader.module_name(op)  # kernels.<op>, as the engine loads it (autokernel.kernel_loader)
    kernel_loader.neutral_process()
    guard = Guard(payload["poison"])
    hook = LaunchHook(module_name, guard)
    hook.install()
    _warm_up(guard)
    before = Snapshot(hook)
    report: dict = {"failure": None, "calls": [], "ops": {}}

    def fail(reason: str, detail: str, case: str | None = None) -> dict:
        report["failure"] = {"reason": reason, "detail": detail, "case": case}
        report["ops"] = guard.ops
        return report

    try:
        with guard:
            mod = kernel_loader.load_kernel(op, job / payload["candidate"])
    except BaseException as e:
        if guard.violation:
            return fail("runtime.torch_compute", f"{guard.violation} (at import)")
        return fail("runtime.exception", f"{type(e).__name__} at import: {str(e).strip()[:160]}")
    if guard.violation:
        return fail("runtime.torch_compute", f"{guard.violation} (at import)")
    after_import = Snapshot(hook)
    d = before.diff(after_import)
    if d:
        return fail(d[0], d[1] + " (at import)")
    try:
        launcher = kernel_loader.launcher_of(mod, op)
    except kernel_loader.KernelLoadError as e:
        return fail("runtime.bad_launcher", str(e))

    state: dict[str, _CaseState] = {}
    kept: list[torch.Tensor] = []  # recent outputs stay alive: a later call may not hand their storage out again
    t0 = _perf()
    for call in payload["calls"]:
        cid = call["case"]
        where = f"call {call['id']} ({call['mode']} {call['values']}, programs {call['order']}), case {cid}"
        try:
            st = state.get(cid) or state.setdefault(cid, _CaseState(job, payload["cases"][cid]))
            args = st.args(call["mode"], call["values"])
            hook.order.set(call["order"], call["perm_key"])
            ops_before = dict(guard.ops)
            t_call = _perf()
            outs = _call(launcher, args, guard, hook, where, kept)
            seconds = _perf() - t_call
            hook.order.set("asc", 0)
            kept = (kept + outs)[-8:]
            snap = _BytesIO()  # the values as the call returned them, not as a later thread leaves them
            _save(outs, snap)
            report["calls"].append({"id": call["id"], "launches": hook.count, "seconds": round(seconds, 5),
                                    "ops": {k: n - ops_before.get(k, 0) for k, n in guard.ops.items()
                                            if n != ops_before.get(k, 0)},
                                    "outputs": snap.getvalue()})
        except Failure as f:
            return fail(f.reason, f.detail, cid)
    report["candidate_s"] = _perf() - t0
    d = after_import.diff(Snapshot(hook))
    if d:
        return fail(d[0], d[1] + " (during the calls)")
    report["ops"] = guard.ops
    return report


class _CaseState:
    """One case's tensors in the child: A (the objects of the first call, refilled in place later). Value sets
    (a, b, t) are loaded from the input directory; a copy is a second load of a (new tensors at new addresses, the
    same values and layout, views included)."""

    def __init__(self, job: Path, files: dict[str, str]):
        self.job, self.files = job, files
        self.a = self.current = self.load("a")

    def load(self, values: str) -> dict:
        return torch.load(self.job / self.files[values], weights_only=True)

    def args(self, mode: str, values: str) -> dict:
        if mode == "copy":  # a's values at new addresses (and new tensor objects), while A is alive
            return self.load("a")
        if mode == "refill":  # new values written into A's own storages: same objects, addresses, ids
            self.current = _refill(self.a, self.load(values))
        return self.current  # fresh: A as loaded; repeat: A as it stands
