"""The gate's trusted harness inside the sandbox: import a candidate, call it under watch, save what it returned.

Runs in the sandboxed child as the entry `numeric` (autokernel.sandbox contract). It never sees the seed or the
reference: the parent generated the inputs (the job's read-only input directory) and compares the returned outputs
itself. What it shares with the benchmark's job (loading the candidate, the process-state snapshot, the poison's
encoding, failures as data, the payload and result shapes) is autokernel/harness.py. This side checks what only the
process that ran the candidate can see:

- runtime: the candidate's own @triton.jit kernel launched on every call; torch ran no compute (an aten-level
  allowlist, below); torch flags, RNG states, patched functions, trusted modules and threads unchanged by the import
  and by the calls (harness.Snapshot).
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

import io
import random
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autokernel import device, harness, kernel_loader
from autokernel.harness import CallRecord, CallSpec, NumericPayload, NumericReport, Reject

device.ensure_interpreter()  # before triton is imported: kernels run through the interpreter without CUDA

from autokernel.gate import coverage_probe, hints, judge  # noqa: E402
from autokernel.gate.allowlist import ALLOC, COPY, LAUNCH_ONLY, POISONED, VIEW  # noqa: E402  (one table: static too)

ALLOWED_OPS = ALLOC | VIEW | COPY | LAUNCH_ONLY | {"fill_"}  # by name: what the parent re-checks each call's ops for
CANARY_BYTES = 4096  # guard bytes before and after every allocation made in a call and every input's storage
CANARY = 0xA5  # their value: a kernel writing outside its tensors changes some of them
KEEP_OUTPUTS = 8  # recent calls' outputs kept alive: a later call may not hand their storage out again
STRICT = (__name__, "autokernel.gate.allowlist")  # compared value for value by every snapshot

# Bound before any candidate code runs: what the harness itself calls afterwards.
_save, _equal, _empty, _perf = torch.save, torch.equal, torch.empty, time.perf_counter
_BytesIO = io.BytesIO  # the output snapshots' buffer (autokernel.sandbox: outputs go back through the result pipe)
_fill_poison = harness.fill_poison


class Forbidden(BaseException):
    """Raised inside the candidate's call at the first forbidden aten op; BaseException so nothing in between
    (the interpreter wraps Exception) can swallow it. The violation is recorded before raising, so it stands
    even if it were swallowed."""


class AtenWatch(TorchDispatchMode):
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
        self.fences: list[tuple[torch.Tensor, int]] = []  # this call's allocations: (guarded bytes, their size)

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
            out = fenced(out, self.fences)
            _fill_poison(out, self.poison)
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

    @contextmanager
    def launching(self):
        """Inside a launch of a kernel: set_ allowed, nothing poisoned (the interpreter's own tensors). For the trusted
        warm-up only; LaunchHook counts the candidate's launches inline."""
        self.in_launch += 1
        try:
            yield
        finally:
            self.in_launch -= 1

    def reject(self, where: str) -> Reject:
        return Reject("runtime.torch_compute", f"{self.violation} ({where})")


class LaunchHook:
    """Counts launches of @triton.jit kernels defined in the candidate's module (not of anyone else's kernels).
    Installed before the first snapshot: the patched `run` methods are what the snapshots then hold the candidate
    to (harness.CLASSES)."""

    def __init__(self, module_name: str, watch: AtenWatch):
        self.module_name, self.watch, self.count = module_name, watch, 0
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
            cls.run = self.wrap(cls.__dict__["run"])

    def wrap(self, orig):
        hook = self

        def run(kernel, *args, **kwargs):
            fn = getattr(kernel, "fn", None)
            mine = getattr(fn, "__module__", None) == hook.module_name and not kwargs.get("warmup", False)
            if not mine:
                return orig(kernel, *args, **kwargs)
            hook.count += 1
            hook.watch.in_launch += 1  # inline, not launching(): nothing a candidate could patch on the hot path
            try:
                return orig(kernel, *args, **kwargs)
            finally:
                hook.watch.in_launch -= 1
        return run


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

    def set(self, mode: str, seed: int) -> None:
        self.mode = mode
        self.rng.seed(seed)

    def install(self) -> None:
        try:
            from triton.runtime.interpreter import InterpreterBuilder
        except ImportError:
            return
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


# --- tensors ----------------------------------------------------------------------------------------------------------

def _tensors(kwargs: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}


def fenced(t: torch.Tensor, fences: list, storages: dict | None = None) -> torch.Tensor:
    """t on a new storage with CANARY_BYTES of CANARY before and after its own (same values, dtype, size, strides;
    its storage offset moves past the guard); the guarded bytes go into `fences`. `storages`: for tensors sharing a
    storage (views of one input), the new storage made for the first (keyed by the old storage's address)."""
    old = t.untyped_storage()
    key = old.data_ptr()
    if storages is not None and key in storages:
        big = storages[key]
    else:
        n = old.nbytes()
        big = _empty(2 * CANARY_BYTES + n, dtype=torch.uint8, device=t.device)
        big[:CANARY_BYTES].fill_(CANARY)
        big[CANARY_BYTES + n:].fill_(CANARY)
        big[CANARY_BYTES:CANARY_BYTES + n].copy_(_empty(0, dtype=torch.uint8, device=t.device).set_(old))
        fences.append((big, n))
        if storages is not None:
            storages[key] = big
    return _empty(0, dtype=t.dtype, device=t.device).set_(
        big.untyped_storage(), CANARY_BYTES // t.element_size() + t.storage_offset(), t.size(), t.stride())


def breached(fences: list) -> int | None:
    """The index of the first fence whose guard bytes changed, or None."""
    for i, (big, n) in enumerate(fences):
        if not (bool((big[:CANARY_BYTES] == CANARY).all()) and bool((big[CANARY_BYTES + n:] == CANARY).all())):
            return i
    return None


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

def _call(launcher, kwargs: dict, watch: AtenWatch, hook: LaunchHook, where: str, kept: list[torch.Tensor],
          input_fences: Sequence = (), target: dict | None = None) -> list:
    """Make one call under the AtenWatch; its outputs, or Reject at the first thing only this process can see.
    target (harness.TargetKernel): which return values are the outputs, and which inputs the launcher writes in
    place (outputs may share their storage; they are not held unchanged)."""
    written = set((target or {}).get("written") or ())
    inputs = {k: v for k, v in _tensors(kwargs).items() if k not in written}
    pristine = {k: _storage_bytes(v).clone() for k, v in inputs.items()}
    watch.violation, hook.count = None, 0
    watch.fences = []
    hints.state.first = None
    try:
        with watch:
            res = launcher(**kwargs)
    except BaseException as e:  # noqa: BLE001 -- the candidate's failure is a verdict, never the harness's
        if watch.violation:
            raise watch.reject(where) from None
        if hints.state.first:
            raise _false_hint(where) from None
        raise Reject("runtime.exception", f"{harness.describe(e)} ({where})") from None
    if watch.violation:
        raise watch.reject(where)
    if hints.state.first:
        raise _false_hint(where)
    if hook.count == 0:
        raise Reject("runtime.no_triton_launch", f"the call launched none of the candidate's @triton.jit kernels "
                                                 f"({where})")
    for what, fences in (("a tensor the call allocated", watch.fences), ("an input", list(input_fences))):
        if breached(fences) is not None:
            raise Reject("runtime.out_of_bounds", f"the call wrote outside the memory of {what} (the guard bytes "
                                                  f"around it changed) ({where})")
    watch.fences = []
    outs = _selected(res, target, where, kwargs)
    _check_outputs(outs, inputs, kept, where, {k: v for k, v in _tensors(kwargs).items() if k in written})
    for k, v in inputs.items():
        if not _equal(_storage_bytes(v), pristine[k]):
            raise Reject("numeric.input_mutated", f"input {k} (or memory sharing its storage) changed ({where})")
    return outs


def _false_hint(where: str) -> Reject:
    return Reject("runtime.false_hint", f"{hints.state.first}: a compiled kernel relies on it (vectorised, unmasked "
                                        f"or aligned accesses) where the interpreter ignores it ({where})")


def _selected(res, target: dict | None, where: str, kwargs: dict | None = None) -> list:
    """The call's outputs: what it returned, or for a target's launcher the declared return values (default every
    tensor it returned: Liger's launchers also return block sizes and views of their inputs); for one that returns
    no tensor in production (`inplace`: vLLM's silu_and_mul(out, x)), the arguments it writes, after the call."""
    outs = list(res) if isinstance(res, (tuple, list)) else [res]
    if target is None:
        return outs
    if target.get("inplace"):
        return [(kwargs or {})[k] for k in target["inplace"]]
    pick = target.get("outputs")
    if pick is None:
        return [o for o in outs if isinstance(o, torch.Tensor)]
    if max(pick) >= len(outs):
        raise Reject("numeric.bad_output", f"returned {len(outs)} value(s); the declaration compares return value "
                                           f"{max(pick)} ({where})")
    return [outs[i] for i in pick]


def _check_outputs(outs: list, inputs: dict[str, torch.Tensor], kept: list[torch.Tensor], where: str,
                   written: dict[str, torch.Tensor] | None = None) -> None:
    """Plain tensors on the inputs' device, sharing no storage with an input or a recent call's output (an output
    inside an input the launcher writes in place, `written`, is that input: it may share only its storage)."""
    for i, o in enumerate(outs):
        if type(o) is not torch.Tensor:
            raise Reject("numeric.bad_output", f"output {i} is a {type(o).__module__}.{type(o).__qualname__}, "
                                               f"not a plain torch.Tensor ({where})")
        ref_dev = next(iter(inputs.values())).device if inputs else o.device
        if o.device != ref_dev:
            raise Reject("numeric.bad_output", f"output {i} on {o.device}, inputs on {ref_dev} ({where})")
    for i, o in enumerate(outs):
        why = judge.bloated(o)  # before torch.save copies the whole storage into the result (bounded memory)
        if why:
            raise Reject("numeric.bad_output", f"output {i}: {why} ({where})")
        for k, v in inputs.items():
            if _overlaps(_span(o), _span(v)):
                raise Reject("numeric.aliasing", f"output {i} shares storage with input {k} ({where})")
        if any(o.untyped_storage().data_ptr() == w.untyped_storage().data_ptr() for w in (written or {}).values()):
            continue  # the written input itself, re-used by every call on it
        for old in kept:
            if _overlaps(_span(o), _span(old)):
                raise Reject("numeric.aliasing", f"output {i} reuses the storage of an earlier call's output "
                                                 f"({where})")


def _warm_up(watch: AtenWatch) -> None:
    """Build torch's and Triton's lazy state (thread pool, the dispatch-mode machinery, which sets
    TORCHINDUCTOR_CACHE_DIR on first use, the interpreter, torch.save/load) before the first snapshot."""
    torch.randn(1 << 16).sum()
    buf = io.BytesIO()
    _save([torch.zeros(2)], buf)
    torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    with watch:
        harness.warm_launch("cuda" if torch.cuda.is_available() else "cpu", watch.launching)
    watch.ops.clear()


# --- the entry --------------------------------------------------------------------------------------------------------

def numeric(payload: NumericPayload, inputs) -> NumericReport:
    """Sandbox entry. payload (harness.NumericPayload): op, candidate (file name in `inputs`, the job's read-only
    input directory), poison {dtype: bits}, cases {case id: {a, b?, t?: file names in `inputs`}}, calls in the order
    to make them (autokernel/gate/schedule.py). Returns raw observations only (harness.NumericReport): per call made,
    its id, launches of the candidate's kernels, aten ops seen, seconds, and the torch.save bytes of its outputs as
    the call returned them; the first failure seen here, if any, as data. The parent judges everything
    (autokernel.sandbox: results travel through the pipe, never through files)."""
    job, op, target = Path(inputs), payload["op"], payload.get("target")
    # kernels.<op>, as the engine loads it (autokernel.kernel_loader); a target's kernel: its module in the checkout
    module_name = target["module"] if target else kernel_loader.module_name(op)
    kernel_loader.neutral_process()
    if target:
        from autokernel import interp
        interp.install()  # third-party Triton under the CPU interpreter (before the checkout's modules bind names)
        harness.preload(target.get("preload") or ())
    watch = AtenWatch(payload["poison"])
    hook = LaunchHook(module_name, watch)
    hook.install()
    recorder = coverage_probe.Recorder()  # what the candidate's code did (autokernel/gate/coverage.py)
    path = (job / payload["candidate"]).resolve()
    coverage_probe.install_interpreter(str(path))
    if not device.is_cuda():
        hints.install()  # compiler hints checked where the interpreter would ignore them (autokernel/gate/hints.py)
    coverage_probe.install_autotune(recorder, module_name, int(payload.get("salt") or 0))
    _warm_up(watch)
    report: NumericReport = {"failure": None, "calls": [], "ops": {}, "coverage": recorder.seen}
    try:
        before = harness.Snapshot(module_name, STRICT)
        launcher, after_import = _load(op, path, watch, before, coverage_probe.compile_instrumented(recorder), target)
        t0 = _perf()
        report["stopped"] = _run_calls(launcher, payload, job, watch, hook, report["calls"], target)
        report["candidate_s"] = _perf() - t0
        changed = after_import.diff(after_import.again())
        if changed:
            raise Reject(changed.reason, changed.detail + " (during the calls)")
    except Reject as r:
        report["failure"] = r.record()
    report["ops"] = watch.ops
    return report


def _load(op: str, path: Path, watch: AtenWatch, before: harness.Snapshot, compile_source=None, target=None):
    """The candidate's launcher and the snapshot after its import; Reject for what its import did."""
    try:
        module = harness.import_candidate(op, path, watch, compile_source, target and target["module"])
    except Reject:
        if watch.violation:
            raise watch.reject("at import") from None
        raise
    if watch.violation:
        raise watch.reject("at import")
    after = before.again()
    changed = before.diff(after)
    if changed:
        raise Reject(changed.reason, changed.detail + " (at import)")
    return harness.launcher(module, target["launcher"] if target else op), after


def _run_calls(launcher, payload: NumericPayload, job: Path, watch: AtenWatch, hook: LaunchHook,
               records: list[CallRecord], target=None) -> bool:
    """Make the parent's calls in its order, a record per call; a Reject names the case of the call that raised it.
    True if the payload's soft deadline stopped them before the last: past soft_s seconds of calls, once at least
    one case has had all its calls (so every job makes progress)."""
    state: dict[str, _CaseState] = {}
    kept: list[torch.Tensor] = []  # recent outputs stay alive: a later call may not hand their storage out again
    soft_s, t0 = float(payload.get("soft_s") or 0.0), _perf()
    left: dict[str, int] = {}
    for call in payload["calls"]:
        left[call["case"]] = left.get(call["case"], 0) + 1
    whole = 0
    for call in payload["calls"]:
        if soft_s and whole and _perf() - t0 > soft_s:
            return True
        cid = call["case"]
        st = state.get(cid) or state.setdefault(cid, _CaseState(job, payload["cases"][cid],
                                                                 (target or {}).get("written") or ()))
        try:
            outs, record = _one_call(launcher, st.args(call["mode"], call["values"]), call, watch, hook, kept,
                                     st.fences, target)
        except Reject as r:
            r.case = cid
            raise
        kept = (kept + outs)[-KEEP_OUTPUTS:]
        records.append(record)
        left[cid] -= 1
        whole += left[cid] == 0
    return False


def _one_call(launcher, args: dict, call: CallSpec, watch: AtenWatch, hook: LaunchHook,
              kept: list[torch.Tensor], input_fences: Sequence = (), target=None) -> tuple[list, CallRecord]:
    where = f"call {call['id']} ({call['mode']} {call['values']}, programs {call['order']}), case {call['case']}"
    hook.order.set(call["order"], call["perm_key"])
    coverage_probe.ForcedConfig.index = call.get("config", -1)
    ops_before = dict(watch.ops)
    t_call = _perf()
    try:
        outs = _call(launcher, args, watch, hook, where, kept, input_fences, target)
    finally:
        coverage_probe.ForcedConfig.index = -1
    seconds = _perf() - t_call
    hook.order.set("asc", 0)
    snap = _BytesIO()  # the values as the call returned them, not as a later thread leaves them
    _save(outs, snap)
    ops = {k: n - ops_before.get(k, 0) for k, n in watch.ops.items() if n != ops_before.get(k, 0)}
    return outs, {"id": call["id"], "launches": hook.count, "seconds": round(seconds, 5), "ops": ops,
                  "outputs": snap.getvalue()}


class _CaseState:
    """One case's tensors in the child: A (the objects of the first call, refilled in place later). Value sets
    (a, b, t) are loaded from the input directory; a copy is a second load of a (new tensors at new addresses, the
    same values and layout, views included)."""

    def __init__(self, job: Path, files: dict[str, str], written=()):
        self.job, self.files, self.written = job, files, tuple(written)
        self.fences: list = []  # every loaded input storage's guard bytes (checked after each of the case's calls)
        self.a = self.current = self.load("a")
        self.values = "a"  # the value set A holds (what a written input is restored to before a repeat)

    def load(self, values: str) -> dict:
        """The value set's tensors, each storage moved between guard bytes (views keep sharing theirs)."""
        raw = torch.load(self.job / self.files[values], weights_only=True)
        storages: dict = {}
        return {k: fenced(v, self.fences, storages) if isinstance(v, torch.Tensor) else v for k, v in raw.items()}

    def args(self, mode: str, values: str) -> dict:
        if mode in ("copy", "config"):  # a's values at new addresses (and new tensor objects), while A is alive
            return self.load("a")
        if mode == "refill":  # new values written into A's own storages: same objects, addresses, ids
            self.current = _refill(self.a, self.load(values))
            self.values = values
        elif mode == "repeat" and self.written:  # an input the launcher writes in place holds its values again
            fresh = self.load(self.values)
            for k in self.written:
                if isinstance(self.current.get(k), torch.Tensor):
                    self.current[k].copy_(fresh[k])
        return self.current  # fresh: A as loaded; repeat: A as it stands
