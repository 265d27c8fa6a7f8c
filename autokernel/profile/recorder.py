"""The op-table observer a profile installs: for every op call, its shape, exact tensor layouts and its time.

Timing. On CUDA each call runs inside a `record_function` range; after the run the device kernels inside each range
give its time (see `device_times`); CUDA events around the call are the fallback. On CPU the kernels run through the
Triton interpreter and a call's time is its wall time (perf_counter around the call; CPU ops are synchronous).

Sampling (CPU only by default). The interpreter spends the same time on every call of one shape (it executes the
same Python per program; the SmolLM2 q4_1 projections repeat within a few percent over 30 layers), and it is slow:
one decode step of SmolLM2-135M takes about two minutes. So after `timed_per_shape` timed calls of an (op, shape),
later calls run the op's torch reference and are charged the mean of the timed ones. Shapes are still captured for
every call, and the trace counts timed and extrapolated calls, so nothing reads as measured that was not.

Warm-up. Before the first timed call of a new (op, shape, layout) on CUDA, the call runs once untimed: Triton
compiles per specialisation. On the interpreter a kernel's first call has a fixed extra cost, paid once per op on a
small shape (see `warm_up`). Every op is a pure function (returns new tensors), so the extra call changes nothing.
"""
from __future__ import annotations

import inspect
import re
import time
from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable

import torch

from autokernel import ops as opspecs

LABEL = "ak {op} {site} #{index}"  # the record_function range of one call; what Perfetto shows
LABEL_RE = re.compile(r"^ak (\S+) (\S+) #(\d+)")

_Range: Callable[[str], AbstractContextManager[object]]
try:  # a range for ~2 us instead of ~25 us per call (torch's own low-overhead range, used by torch.compile)
    from torch._C._profiler import _RecordFunctionFast
    _Range = _RecordFunctionFast
except ImportError:  # pragma: no cover - older torch
    _Range = torch.profiler.record_function


@dataclass
class Call:
    index: int
    op: str
    site: str
    phase: str  # "prefill" | "decode"
    shape: tuple  # (name, size) pairs of the op's shape dict, in shape_of's order
    layout: tuple  # per argument: (name, dtype, sizes, strides) for tensors, (name, value) otherwise
    dtype: str  # the dtype bytes are counted in: a dtype argument if the op has one, else its first float tensor's
    timed: bool  # False: ran the reference and is charged its shape's mean (sampling)
    ms: float | None = None  # measured time; filled after the run on CUDA


def _value(v: Any) -> Any:
    if isinstance(v, torch.dtype):
        return str(v).removeprefix("torch.")
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return repr(v)


def describe(args: dict[str, Any]) -> tuple[tuple, str]:
    """(layout, compute dtype) of bound launcher arguments."""
    layout: list[tuple] = []
    dtype_arg, first_float = None, None
    for name, v in args.items():
        if isinstance(v, torch.Tensor):
            layout.append((name, str(v.dtype).removeprefix("torch."), tuple(v.shape), tuple(v.stride())))
            if first_float is None and v.is_floating_point():
                first_float = v.dtype
        else:
            if isinstance(v, torch.dtype) and dtype_arg is None:
                dtype_arg = v
            layout.append((name, _value(v)))
    dt = dtype_arg or first_float or torch.float32
    return tuple(layout), str(dt).removeprefix("torch.")


class Recorder:
    """Set as `OpTable.observer`; `phase` is switched by the driver between prefill and decode."""

    def __init__(self, cuda: bool, timed_per_shape: int | None = None):
        self.cuda = cuda
        self.timed_per_shape = timed_per_shape
        self.calls: list[Call] = []
        self.phase = "prefill"
        self.observer_s = 0.0  # wall time spent inside op calls, warm-ups and references included
        self.warmup_s = 0.0  # of which untimed warm-up calls
        self._seen: Counter = Counter()
        self._warm: set = set()
        self._events: list[tuple[int, Any, Any]] = []  # CUDA: (call index, start event, end event)
        self._sigs: dict[str, inspect.Signature] = {}

    def bind(self, op: str, args: tuple) -> dict[str, Any]:
        """The launcher's arguments by name (the engine passes them positionally, all of them)."""
        sig = self._sigs.get(op)
        if sig is None:
            sig = self._sigs[op] = inspect.signature(opspecs.get(op).reference)
        if len(args) == len(sig.parameters):
            return dict(zip(sig.parameters, args))
        bound = sig.bind(*args)
        bound.apply_defaults()
        return dict(bound.arguments)

    def __call__(self, op: str, site: str, fn: Callable, args: tuple) -> Any:
        t_enter = time.perf_counter()
        spec = opspecs.get(op)
        kw = self.bind(op, args)
        shape = tuple(spec.shape_of(**kw).items())
        layout, dtype = describe(kw)
        n = self._seen[(op, shape)]
        self._seen[(op, shape)] += 1
        timed = self.timed_per_shape is None or n < self.timed_per_shape
        call = Call(len(self.calls), op, site, self.phase, shape, layout, dtype, timed)
        self.calls.append(call)
        label = LABEL.format(op=op, site=site, index=call.index)
        if not timed:
            with _Range(label + " (reference; charged its shape's mean)"):
                out = spec.reference(*args)
        else:
            warm_key = (op, shape, layout) if self.cuda else op
            if warm_key not in self._warm:
                self._warm.add(warm_key)
                t0 = time.perf_counter()
                self.warm_up(op, fn, args, dtype)
                self.warmup_s += time.perf_counter() - t0
            with _Range(label):
                if self.cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    out = fn(*args)
                    end.record()
                    self._events.append((call.index, start, end))
                else:
                    t0 = time.perf_counter()
                    out = fn(*args)
                    call.ms = (time.perf_counter() - t0) * 1e3
        self.observer_s += time.perf_counter() - t_enter
        return out

    def warm_up(self, op: str, fn: Callable, args: tuple, dtype: str) -> None:
        """CUDA: the call itself, so Triton compiles this specialisation. Interpreter: its first call of a kernel
        costs ~0.2-0.6 s extra whatever the shape (measured on silu_mul and matmul_q4_1), so the op's smallest odd
        shape pays it instead of a second full call (11 s for lm_head over SmolLM2's 49152-token vocabulary)."""
        if not self.cuda:
            spec = opspecs.get(op)
            try:
                small = min(spec.odd_shapes, key=spec.flops)
                fn(**spec.make_inputs(small, getattr(torch, dtype), "cpu", torch.Generator().manual_seed(0)))
                return
            except Exception:  # noqa: BLE001 -- a shape this launcher refuses: fall back to the real arguments
                pass
        fn(*args)
        if self.cuda:
            torch.cuda.synchronize()

    def finish(self, prof: torch.profiler.profile | None) -> dict[str, int]:
        """Fill call times after the run; returns how many calls each time source served."""
        if not self.cuda:
            return {"cpu_wall": sum(c.timed for c in self.calls)}
        torch.cuda.synchronize()
        kernel, annotation = device_times(prof) if prof is not None else ({}, {})
        sources = {"profiler_kernels": 0, "profiler_annotations": 0, "cuda_events": 0}
        for index, start, end in self._events:
            if index in kernel:
                self.calls[index].ms, src = kernel[index], "profiler_kernels"
            elif index in annotation:
                self.calls[index].ms, src = annotation[index], "profiler_annotations"
            else:  # the profiler saw no device work in the range: the events' span, launch gaps included
                self.calls[index].ms, src = start.elapsed_time(end), "cuda_events"
            sources[src] += 1
        return {k: v for k, v in sources.items() if v}


def device_times(prof: torch.profiler.profile) -> tuple[dict[int, float], dict[int, float]]:
    """Per call index, ms of device time inside its range: (sum of its kernels, span of its GPU annotation).

    The CPU-side range owns the kernels launched inside it (the profiler links launches to kernels by correlation
    id), so its device total is the op's kernel time without launch gaps. Where a Triton launch is not linked, the
    GPU-side copy of the range (kineto's gpu_user_annotation) still spans the op's kernels.
    """
    from torch.autograd import DeviceType
    kernel, annotation = {}, {}
    for evt in prof.events():
        m = LABEL_RE.match(evt.name)
        if not m:
            continue
        index = int(m.group(3))
        if evt.device_type == DeviceType.CPU:
            us = getattr(evt, "device_time_total", None)
            if us is None:
                us = getattr(evt, "cuda_time_total", 0)
            if us:
                kernel[index] = us / 1e3
        else:
            annotation[index] = evt.time_range.elapsed_us() / 1e3
    return kernel, annotation
