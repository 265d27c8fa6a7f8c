"""What every trusted sandbox entry that runs a candidate does the same way: the gate's numeric job
(autokernel/gate/child.py) and the benchmark's timing job (autokernel/bench/job.py) share this one half, so the two
cannot drift apart in how they load a candidate, what state they guard or how they report a failure.

- `import_candidate` / `launcher`: the candidate becomes `kernels.<op>` through autokernel.kernel_loader, the loader
  the engine uses too, so no job looks different to it from production (same module name, argv, environment keys).
- `Snapshot`: the process state a candidate could change to fool a harness, its clocks or the reference: torch flags
  and RNG states, the environment, the attributes of the libraries and of the harness modules, trusted modules
  imported, Python threads. Taken before the import, compared after it and after calls. It keeps the objects
  themselves, never their id(), so a replacement cannot hide behind a recycled id.
- the poison's encoding: a quiet NaN per float dtype with a secret payload (the parent picks it,
  autokernel/gate/numeric.py), written into fresh allocations as raw bits (gate/child.py's AtenWatch) and looked for in
  the outputs (autokernel/ops/tolerance.py, compare_outputs()).
- failures as data: `Reject` unwinds inside a job; the job returns a `FailureRecord` (a reason code of
  autokernel/gate/verdict.py or bench.*, one line of detail, the case) that the parent type-checks, never an
  exception's name to parse out of a string.
- the payloads and results that cross the sandbox channel, as TypedDicts (the parent still checks every value: a
  candidate that took over its process can send anything).

Kept light: both jobs import it before any candidate code runs; torch and autokernel.kernel_loader only.
"""
from __future__ import annotations

import hashlib
import os
import random
import sys
import threading
import types
from contextlib import nullcontext
from pathlib import Path
from typing import TypedDict

import torch

from autokernel import kernel_loader

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # Python 3.10 (requires-python): typing_extensions comes with torch
    from typing_extensions import NotRequired

# Bound before any candidate code runs: what a Snapshot reads through (a candidate replacing threading.enumerate or
# os.environ later changes nothing here).
_enumerate_threads, _environ, _vars, _modules = threading.enumerate, os.environ, vars, sys.modules

# Namespaces whose attributes (other than plain scalars) no candidate may replace, delete or shadow; resolved from
# sys.modules when the snapshot is taken (what is not imported yet is not imported by it).
SURFACE = ("builtins", "time", "random", "secrets", "numpy", "torch", "torch.nn.functional", "torch.cuda",
           "torch.serialization", "triton", "triton.language", "triton.runtime.jit", "triton.runtime.interpreter")
# Classes whose instances the harnesses use: their attributes' values AND names (an added attribute shadows a method).
CLASSES = ("torch.Tensor", "torch._C.TensorBase", "torch.UntypedStorage", "torch.cuda.Event", "torch.cuda.Stream",
           "triton.runtime.jit.JITFunction", "triton.runtime.interpreter.InterpretedFunction",
           "triton.runtime.interpreter.InterpreterBuilder")
# Compared value for value, scalars included: this module, the loader, and each job's own modules (Snapshot(strict)).
STRICT = (__name__, "autokernel.kernel_loader")
TRUSTED_MODULES = ("autokernel.ops", "autokernel.engine", "autokernel.bench", "kernels")  # none may be imported late
_SCALARS = (int, float, str, bool, bytes, type(None))
_MISSING = object()
INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# --- what crosses the sandbox channel -------------------------------------------------------------------------------

class FailureRecord(TypedDict):
    reason: str  # a code of autokernel/gate/verdict.py REASONS (gate) or bench.error | bench.tampered (bench)
    detail: str  # one line for people and for the agent
    case: str | None  # the gate's case id the failure happened in, if any


class CallSpec(TypedDict):
    """One call the gate asks its job to make (autokernel/gate/schedule.py, Call.payload)."""
    id: str
    case: str
    mode: str  # fresh | copy | refill | repeat | config
    values: str  # a | b | t
    order: str  # asc | desc | shuffle: the order the interpreter runs the grid's programs in
    perm_key: int
    config: int  # -1, or for a "config" call the distinct autotune config to run (coverage_probe.ForcedConfig)


class TargetKernel(TypedDict):
    """A target checkout's kernel file (autokernel/target/contract.py) instead of kernels/<op>.py."""
    module: str  # the module the engine imports it as (llama_liger.ops.rope); the checkout is on the job's path
    launcher: str  # the launcher the gate calls
    outputs: list[int] | None  # which of its return values are compared (None: every tensor it returns)
    written: list[str]  # tensor parameters the launcher writes in place in production (Liger's rope: q, k)
    inplace: list[str]  # a launcher returning no tensor (vLLM's silu_and_mul(out, x)): the written outputs
    preload: list[str]  # the modules the incumbent file imports: imported before the first snapshot


class NumericPayload(TypedDict, total=False):
    op: str
    candidate: str  # the candidate's file name in the job's read-only input directory (<op>.py)
    poison: dict[str, int]  # dtype name -> the bits of the poison NaN
    cases: dict[str, dict[str, str]]  # case id -> {values: input file name}
    calls: list[CallSpec]
    soft_s: float  # 0: make every call; else start no call once this many seconds of calls have run (the parent
    # judges the cases whose calls all came back and runs the rest in later jobs)
    salt: int  # which autotune config runs for which key (autokernel/gate/coverage.py install_autotune)
    target: TargetKernel  # absent for autokernel's own kernels


class CallRecord(TypedDict):
    id: str
    launches: int  # launches of the candidate's own @triton.jit kernels
    seconds: float
    ops: dict[str, int]  # aten ops seen during the call, by name
    outputs: bytes  # torch.save of the outputs as the call returned them


class NumericReport(TypedDict, total=False):
    failure: FailureRecord | None
    calls: list[CallRecord]
    ops: dict[str, int]
    candidate_s: float
    stopped: bool  # the soft deadline stopped the calls (the parent counts what came back, not this)
    coverage: dict[str, int]  # site key -> bits the probes saw (autokernel/gate/coverage.py)


class BenchPayload(TypedDict):
    op: str
    cases: list[dict]  # [{shape: {dim: size}, dtype: name}]
    seed: int
    reps: int
    # a target checkout's kernel file (autokernel/target/bench.py): its input sets are files the parent made
    # (autokernel/bench/job.py POOL_FILE); absent for autokernel's own kernels
    target: NotRequired[TargetKernel]


class Kept(TypedDict):
    case: int
    rep: int
    outputs: list  # CPU copies of the call's outputs (a type name where an output was no tensor)


class BenchReport(TypedDict):
    device: str
    failure: FailureRecord | None
    cases: list[dict]  # per shape: {cpu_ms | wall_ms | event_ms: [ms per timed call], kept: [Kept]}


class Reject(Exception):
    """A candidate's failure inside a job (or a parent's judgement of one): a reason code and one line of detail."""

    def __init__(self, reason: str, detail: str, case: str | None = None):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.case = reason, detail, case

    def record(self) -> FailureRecord:
        return {"reason": self.reason, "detail": self.detail, "case": self.case}


def describe(e: BaseException) -> str:
    """'<type>: <first line of the message>' (160 characters at most); the type alone when the message is empty or
    cannot be read (the candidate's exception is data, never code the harness lets run unguarded)."""
    try:
        msg = str(e).strip()
    except BaseException:  # noqa: BLE001 -- a message that raises is no message
        msg = ""
    first = msg.splitlines()[0][:160] if msg else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


# --- the candidate ---------------------------------------------------------------------------------------------------

def import_candidate(op: str, path: Path, watch=None, compile_source=None,
                     module: str | None = None) -> types.ModuleType:
    """Execute the candidate file as `kernels.<op>` (autokernel.kernel_loader), inside `watch` (a context manager:
    the gate's AtenWatch); compile_source: the gate's coverage probes (kernel_loader.load_kernel). Whatever it
    raises is runtime.exception."""
    try:
        with watch if watch is not None else nullcontext():
            return kernel_loader.load_kernel(op, path, compile_source, module)
    except BaseException as e:  # noqa: BLE001 -- SystemExit from a candidate is its failure, not the harness's
        raise Reject("runtime.exception", f"{describe(e)} (at import)") from None


def launcher(module: types.ModuleType, op: str) -> types.FunctionType:
    """The candidate's launcher `op`, a plain function defined in its own file, else runtime.bad_launcher."""
    try:
        return kernel_loader.launcher_of(module, op)
    except kernel_loader.KernelLoadError as e:
        raise Reject("runtime.bad_launcher", str(e)) from None


def preload(modules) -> None:
    """Import a target's incumbent's imports (autokernel/target/contract.py, imported) before the first snapshot: what
    the checkout's libraries change when imported is theirs, not the candidate's. One that fails to import is left for
    the candidate's own import to fail on."""
    import importlib
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 -- reported by the candidate's import
            continue


def warm_launch(device: str, launching=nullcontext) -> None:
    """Launch one trusted Triton kernel, so that the interpreter's or driver's lazy set-up (and torch's, for what it
    allocates) predates the first snapshot. `launching()`: a context manager around the launch itself (the gate's
    AtenWatch counts it as a launch, where allocations go unpoisoned)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(src_ptr, dst_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs))

    src = torch.zeros(16, device=device)
    dst = torch.empty(16, device=device)
    with launching():
        _copy[(1,)](src, dst, BLOCK=16)
    if device == "cuda":
        torch.cuda.synchronize()


# --- the poison ------------------------------------------------------------------------------------------------------

def _signed(bits: int, width: int) -> int:
    return bits - (1 << width) if bits >= 1 << (width - 1) else bits


def fill_poison(t: torch.Tensor, poison: dict[str, int]) -> None:
    """Write the poison's bits into every element of a fresh float tensor (other dtypes are left as they are)."""
    bits = poison.get(str(t.dtype).removeprefix("torch."))
    if bits is None or not t.numel() or not t.is_floating_point():
        return
    t.view(INT_OF_SIZE[t.element_size()]).fill_(_signed(bits, 8 * t.element_size()))


def poisoned(t: torch.Tensor, poison: dict[str, int] | None) -> torch.Tensor | None:
    """A bool mask of t's elements that still hold the poison's exact bits, None when t's dtype has no poison."""
    bits = (poison or {}).get(str(t.dtype).removeprefix("torch."))
    if bits is None or not t.numel():
        return None
    c = t.detach().cpu().contiguous()
    return c.view(INT_OF_SIZE[c.element_size()]) == _signed(bits, 8 * c.element_size())


# --- process state ---------------------------------------------------------------------------------------------------

def _digest(obj) -> str:
    return hashlib.sha256(repr(obj).encode()).hexdigest()[:16]


def _flags() -> dict[str, object]:
    m = torch.backends.cuda.matmul
    getters = {
        "torch.backends.cuda.matmul.allow_tf32": lambda: m.allow_tf32,
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
            lambda: m.allow_fp16_reduced_precision_reduction,
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction":
            lambda: m.allow_bf16_reduced_precision_reduction,
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
        "numpy.random.state": lambda: _digest(_modules["numpy"].random.get_state()[1].tolist())
        if "numpy" in _modules else None,
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
        except Exception as e:  # noqa: BLE001 -- a flag this torch build lacks: record the failure, compare that
            out[k] = f"unreadable: {type(e).__name__}"
    return out


def _resolve(name: str):
    """The object a dotted name denotes, through modules already imported only (None when it is not there)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        obj = _modules.get(".".join(parts[:k]))
        if obj is not None:
            break
    else:
        return None
    for p in parts[k:]:
        obj = getattr(obj, p, None)
    return obj


def _surface(strict: tuple[str, ...], objects: dict[str, object]) -> tuple[dict[str, object], set[str]]:
    """(label.attribute -> the object itself, for everything a candidate may not replace; the attribute names of
    CLASSES). Plain scalars of library namespaces are left out (a library's own counters), kept in strict ones."""
    loose = {n: o for n in SURFACE + CLASSES if (o := _resolve(n)) is not None}
    tight = {n: o for n in STRICT + strict if (o := _resolve(n)) is not None}
    tight.update(objects)
    values: dict[str, object] = {}
    for label, space in {**loose, **tight}.items():
        for k, v in list(_vars(space).items()):
            if label in tight or not isinstance(v, _SCALARS):
                values[f"{label}.{k}"] = v
    names = {f"{n}.{k}" for n in CLASSES if n in loose for k in _vars(loose[n]) if k != "__slotnames__"}
    return values, names  # __slotnames__: copyreg's cache, filled by torch.save of a tensor


class Snapshot:
    """The state a candidate must leave alone. `own`: its module (kernels.<op>, not a trusted module); `strict`: the
    job's own modules, compared value for value; `objects`: more namespaces by label (the op's spec object)."""

    def __init__(self, own: str = "", strict: tuple[str, ...] = (), objects: dict[str, object] | None = None):
        self.own, self.strict, self.objects = own, strict, dict(objects or {})
        self.flags = _flags()
        self.values, self.names = _surface(strict, self.objects)
        self.modules = {m for m in _modules if m.startswith(TRUSTED_MODULES) and m != own}
        self.threads = set(_enumerate_threads())
        self.environ = dict(_environ)

    def again(self) -> Snapshot:
        return Snapshot(self.own, self.strict, self.objects)

    def new_threads(self) -> list[threading.Thread]:
        return [t for t in _enumerate_threads() if t not in self.threads]

    def diff(self, later: Snapshot) -> Reject | None:
        """What changed from this snapshot to `later`: runtime.global_state or runtime.thread, or None."""
        changed = [k for k in self.flags if self.flags[k] != later.flags.get(k)]
        if changed:
            return Reject("runtime.global_state", "changed " + ", ".join(changed[:4]))
        env = sorted(k for k in set(self.environ) | set(later.environ) if self.environ.get(k) != later.environ.get(k))
        if env:
            return Reject("runtime.global_state", "changed the environment: " + ", ".join(env[:4]))
        patched = [k for k, v in self.values.items() if later.values.get(k, _MISSING) is not v]
        patched += later.names - self.names
        if patched:
            return Reject("runtime.global_state", "replaced " + ", ".join(sorted(patched)[:4]))
        new = sorted(later.modules - self.modules)
        if new:
            return Reject("runtime.global_state", "imported trusted module " + ", ".join(new[:4]))
        threads = later.threads - self.threads
        if threads:
            return Reject("runtime.thread", f"{len(threads)} thread(s) started and still running")
        return None
