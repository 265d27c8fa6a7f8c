"""One file, one fresh process: the timing harness of a benchmark job (sandbox entry `autokernel.bench.job:time_file`).

A job loads exactly ONE kernel file, the incumbent or a candidate, as `kernels.<op>` from a file named `<op>.py`
(autokernel.kernel_loader: the same name whichever it is), times it on the shapes it was given, and returns raw
figures: per-call times on every clock it reads and the outputs of a random sample of its timed calls. It decides
nothing, not even which clock counts: the parent (autokernel.bench.rounds) picks the clock by the device it knows,
regenerates every input from the seed it chose, computes the reference itself, and judges.

Clocks, per call: `cpu_ms`, the process's CPU time (getrusage(RUSAGE_SELF): user + system time of ALL threads of
the process, live or ended, from the scheduler's accounting, 1 us resolution; see _cpu_ns); `wall_ms`, the host's
monotonic clock; on CUDA also `event_ms`, CUDA events around the call (all streams synchronised). On CPU the
verdict uses `cpu_ms`: the Triton interpreter is CPU work, and a process's CPU time does not grow while the
process waits for a core, so the other work on a shared machine (other jobs, other users' tests) mostly drops out
of it, where wall time on a loaded 2-core machine ran 1-3.5x the CPU time from one minute to the next.

Can a file make its CPU time look small while the work still gets done? Each way out, and why it is closed:
- more threads (Python, torch/OpenMP pools, anything the runtime starts): getrusage(RUSAGE_SELF) sums every thread
  of the process, including threads that ended, so work moved to another thread is counted (a thread still running
  on another core when the call returns is counted up to the last scheduler tick, ~4 ms); work a
  thread does after the timer stopped is caught as a thread left running (Python threads: `bench.tampered`) or as
  an output still being written when it is copied (kept outputs are copied the moment the call returns, chosen
  after it returned: `bench.mismatch`);
- sleeping or waiting: costs no CPU time, so it cannot make the file look faster; it only helps if something
  outside the process does the work meanwhile, which is the next item;
- another process: process creation is denied by the sandbox's seccomp filter on CPU jobs, and the parent's
  watcher (autokernel.bench.watch) rejects a job in which any other process was seen (`bench.tampered`); a job
  cannot reach a process outside its sandbox (namespaces, no network);
- the kernel doing work on the process's behalf: system time is in the figure; what kernel threads
  could do asynchronously (I/O) computes nothing a kernel needs, and the static gate admits no module to drive it;
- a GPU: there is none on a CPU job;
- the clock itself: bound here before the file is imported and checked with the rest of this module's globals.
And as a backstop for the whole class "the call waited while work happened elsewhere", the parent compares each
file's wall/CPU ratio with the incumbent's (autokernel.bench.measure, `bench.max_wait_ratio`): waiting for outside
work shows up there however it was arranged.

Why one file per process: a file that shares a process with another can wrap, patch or slow the other's kernel, or
damage the other's outputs, and a benchmark that blames the other then blames the wrong file. Here no file ever
runs in a process where another file's figures are taken.

Inside the job, against the file's cheating on its own figures (docs/shortcuts.md #4, #5, #15, #17, #19, #20):
- the clocks are bound when this module is imported, before the file exists in the process; the process state the
  gate's job guards too (autokernel/harness.py, Snapshot: the libraries' attributes, torch flags and RNG states,
  the environment, this harness and the op's trusted modules) is compared with a snapshot after the import, after
  every warm-up call and every few timed calls (`bench.tampered`);
- a Python thread left running by a call is `bench.tampered` (work finished after the timer stopped);
- inputs are refilled in place before every call (stable pointers, fresh values): the pool sets come from the
  parent's seed, each repetition rescales them;
- the outputs kept for the parent are copied the moment the timer stops, chosen by reservoir sampling from
  os.urandom AFTER each call returned: at call time the file cannot know whether this output will be checked.
Residual risk: code that introspects this harness (frames, gc, ctypes: the static gate's ban list) could rewrite its
own times or kept outputs. That can only flatter the file itself, never slow another, and the parent's roofline,
10x and CPU-time checks bound how far such figures can go.
"""
from __future__ import annotations

import hashlib
import random
import resource
import secrets
import sys
import time
from pathlib import Path

import torch

from autokernel import harness, kernel_loader
from autokernel.harness import BenchPayload, BenchReport, Kept, Reject

# Bound before any kernel file is imported: patching time.perf_counter_ns or torch.cuda.Event later changes nothing.
_perf_ns = time.perf_counter_ns
_rusage = resource.getrusage
_SELF = resource.RUSAGE_SELF  # every thread of this process, live or ended, user + system


def _cpu_ns() -> int:
    """This process's CPU time, ns (1 us resolution). getrusage, not clock_gettime(CLOCK_PROCESS_CPUTIME_ID): under
    the sandbox's RLIMIT_CPU the kernel keeps a process-wide CPU timer armed, and that clock is then read from the
    timer's tick-updated total (4 ms steps here: calls of 3 ms read 0 or 4 ms); getrusage sums the threads' own
    run times and brings the calling thread's up to date first."""
    r = _rusage(_SELF)
    return int((r.ru_utime + r.ru_stime) * 1e9)
_monotonic = time.monotonic
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed = torch.cuda.Event.elapsed_time
_sync = torch.cuda.synchronize
_randbelow = secrets.randbelow  # os.urandom underneath: no state in this process to read or predict

POOL = 4  # input sets per shape; every repetition also rescales one (values never repeat)
POOL_FILE = "pool-{}.pt"  # a target's POOL input sets of case i, made by the parent (its generator runs there only)
KEEP = 8  # timed outputs per shape returned for the parent to check (all of them when there are no more calls)
TAMPER_CHECK_EVERY = 8  # timed calls between snapshot comparisons (harness.Snapshot: ~5k objects, ~7 ms each)
THREAD_JOIN_S = 10.0
WARMUP_S = {"cuda": 0.05, "cpu": 0.0}


# --- inputs: one definition, used by the job and by the parent that re-creates them to judge the outputs ----------

def derive(seed: int, *parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest(), "little") >> 2


def pool(spec, case: dict, seed: int, ci: int) -> list[dict]:
    """The POOL input sets of case `ci`, on the CPU (moved to the device by the job; the parent uses them as they
    are)."""
    from autokernel.ops.spec import like
    dtype = getattr(torch, case["dtype"])
    sets = [spec.make_inputs(case["shape"], dtype, "cpu", torch.Generator().manual_seed(derive(seed, ci, "pool", k)))
            for k in range(POOL)]
    return [sets[0]] + [like(sets[0], s) for s in sets[1:]]  # one layout per case: the sets refill the same tensors


def values(sets: list[dict], seed: int, ci: int, rep: int) -> dict:
    """Repetition `rep`'s arguments for case `ci`: a pool set times a scale in [0.5, 2), both fixed by the seed."""
    scale = random.Random(derive(seed, ci, "scale", rep)).uniform(0.5, 2.0)
    return {k: v * scale if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in sets[rep % POOL].items()}


# --- the harness's own integrity ---------------------------------------------------------------------------------

class _TamperCheck:
    """The state the file must leave alone (harness.Snapshot: the libraries and clocks, this module, the op's trusted
    spec and loader, flags, environment, threads), taken before its import; any change is `bench.tampered`. A
    target's file (`target`): its module in the checkout, this module and the interpreter layer held strictly."""

    def __init__(self, op: str, spec, target: harness.TargetKernel | None = None):
        if target is not None:
            self.base = harness.Snapshot(target["module"], (__name__, "autokernel.interp"))
            return
        strict = (__name__, "autokernel.ops.spec", f"autokernel.ops.{op}")
        self.base = harness.Snapshot(kernel_loader.module_name(op), strict, {f"{op} spec": spec})

    def new_threads(self) -> list:
        return self.base.new_threads()

    def __call__(self, where: str) -> None:
        threads = self.base.new_threads()
        if threads:
            for t in threads:  # its work ends before the job returns, not while the outputs are sent
                t.join(THREAD_JOIN_S)
            raise Reject("bench.tampered", f"left a Python thread running ({where})")
        changed = self.base.diff(self.base.again())
        if changed:
            raise Reject("bench.tampered", f"{changed.detail} ({where})")


# --- timing --------------------------------------------------------------------------------------------------------

def _time_cpu(fn, kw):
    """(out, {clock: ms}): process CPU time inside the wall-clock window."""
    w0 = _perf_ns()
    c0 = _cpu_ns()
    out = fn(**kw)
    c1 = _cpu_ns()
    w1 = _perf_ns()
    return out, {"cpu_ms": (c1 - c0) / 1e6, "wall_ms": (w1 - w0) / 1e6}


def _time_cuda(fn, kw, flush: torch.Tensor, start, end):
    flush.zero_()  # evict L2 so that the file does not inherit a warm cache
    w0 = _perf_ns()
    c0 = _cpu_ns()
    _record(start)
    out = fn(**kw)
    _sync()  # all streams: work hidden on a side stream is inside the window
    _record(end)
    _sync()
    c1 = _cpu_ns()
    w1 = _perf_ns()
    return out, {"event_ms": _elapsed(start, end), "cpu_ms": (c1 - c0) / 1e6, "wall_ms": (w1 - w0) / 1e6}


def _timer(device: str):
    if device != "cuda":
        return _time_cpu
    import triton
    try:
        flush = triton.runtime.driver.active.get_empty_cache_for_benchmark()
    except Exception:  # noqa: BLE001 -- older Triton: flush with our own 256 MB buffer
        flush = torch.empty(256 << 20, dtype=torch.int8, device=device)
    start, end = _Event(enable_timing=True), _Event(enable_timing=True)
    return lambda fn, kw: _time_cuda(fn, kw, flush, start, end)


class _Case:
    """One shape: fixed argument buffers (stable pointers) refilled before every call, and the kept outputs."""

    def __init__(self, spec, case: dict, seed: int, ci: int, device: str, sets: list[dict] | None = None,
                 target: harness.TargetKernel | None = None):
        self.ci, self.seed, self.target = ci, seed, target
        self.fn = None  # the launcher this shape is called through, bound once the file is imported
        self.sets = pool(spec, case, seed, ci) if sets is None else sets  # a target's: the parent's files
        self.buf = {k: v.to(device, copy=True) if isinstance(v, torch.Tensor) else v for k, v in self.sets[0].items()}
        self.clocks: dict[str, list[float]] = {}  # clock name -> one reading per timed call
        self.kept: list[Kept] = []
        self.seen = 0

    def args(self, rep: int) -> dict:
        for k, v in values(self.sets, self.seed, self.ci, rep).items():
            if isinstance(v, torch.Tensor):
                self.buf[k].copy_(v)
            else:  # scalars drawn per value set (eps, theta, temperature, scale): the checked reference uses this one
                self.buf[k] = v
        return dict(self.buf)

    def keep(self, rep: int, out) -> None:
        """Reservoir sampling, decided after the call returned: every timed output is equally likely to be checked."""
        self.seen += 1
        slot = len(self.kept) if len(self.kept) < KEEP else _randbelow(self.seen)
        if slot >= KEEP:
            return
        outs = selected_outputs(out, self.target, self.buf)
        copies = [o.detach().to("cpu", copy=True) if type(o) is torch.Tensor else type(o).__name__ for o in outs]
        item: Kept = {"case": self.ci, "rep": rep, "outputs": copies}
        if slot == len(self.kept):
            self.kept.append(item)
        else:
            self.kept[slot] = item


def selected_outputs(out, target: harness.TargetKernel | dict | None, kwargs: dict | None = None) -> list:
    """The call's outputs: what it returned, or for a target's launcher the declared return values, by default every
    tensor it returned (as the gate's job selects them, autokernel/gate/child.py); for one whose outputs are the
    arguments it writes (`inplace`), those arguments (`kwargs`) after the call. One the call did not return is
    left out: the parent's count check then rejects the file."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if target is None:
        return outs
    if target.get("inplace"):
        return [kwargs[k] for k in target["inplace"] if kwargs and k in kwargs]
    pick = target.get("outputs")
    if pick is None:
        return [o for o in outs if isinstance(o, torch.Tensor)]
    return [outs[i] for i in pick if i < len(outs)]


def _call(timer, case: _Case, rep: int, where: str):
    kw = case.args(rep)
    try:
        return timer(case.fn, kw)
    except BaseException as e:  # noqa: BLE001 -- SystemExit from a kernel file rejects it, nothing more
        raise Reject("bench.error", f"{harness.describe(e)} ({where})") from None


def time_file(payload: BenchPayload, inputs: Path) -> BenchReport:
    """Sandbox entry. payload (harness.BenchPayload): op, cases [{shape, dtype}], seed, reps; the file is
    inputs/<op>.py. Returns raw figures and, if the file failed, its failure as data (harness.BenchReport).
    payload["target"]: a target checkout's file instead (_target)."""
    kernel_loader.neutral_process()  # also imports `kernels`: the interpreter switch on a machine without CUDA
    from autokernel.ops import get
    device = "cuda" if torch.cuda.is_available() else "cpu"
    op, seed, reps = payload["op"], int(payload["seed"]), int(payload["reps"])
    target = payload.get("target")
    if target is not None:
        spec, cases, file, module, name = _target(payload, target, Path(inputs), device)
    else:
        from autokernel.gate.coverage_probe import untimed_autotune
        untimed_autotune(op)  # under the CPU interpreter: one autotune config per key, by hash (it cannot time several)
        spec = get(op)
        cases = [_Case(spec, c, seed, ci, device) for ci, c in enumerate(payload["cases"])]
        file, module, name = Path(inputs) / f"{op}.py", None, op
    timer = _timer(device)
    harness.warm_launch(device)  # the interpreter's/driver's lazy set-up predates the snapshot
    out: BenchReport = {"device": device, "failure": None, "cases": []}
    tamper_check = _TamperCheck(op, spec, target)
    try:
        try:  # the one loader (harness, autokernel.kernel_loader): as the gate and the engine load the file
            module_ = harness.import_candidate(op, file, module=module)
            for c in cases:  # a target op with several launchers: each shape through its own (_target)
                c.fn = harness.launcher(module_, c.target["launcher"] if c.target else name)
        except Reject as r:
            raise Reject("bench.error", f"import failed: {r.detail}") from None
        tamper_check("at import")
        _warm(timer, cases, tamper_check, device)
        _timed(timer, cases, reps, tamper_check)
        tamper_check("at the end")
    except Reject as r:
        out["failure"] = r.record()
    out["cases"] = [{**c.clocks, "kept": c.kept} for c in cases]
    return out


def _target(payload: BenchPayload, target: harness.TargetKernel, inputs: Path, device: str):
    """(spec, cases, file, module, launcher) for a target checkout's file, made ready as the gate's job makes it
    (autokernel/gate/child.py): the interpreter layer installed, the incumbent's imports imported, the file executed
    under the checkout's module name (the checkout is on the job's path). The input sets come from the parent's
    files (the op's generator is built from the workload's records, in the parent). A case that names its launcher
    (and that launcher's outputs, or the arguments it writes: a target op with several launchers,
    autokernel/bench/rounds.py) is called
    through it; else through target["launcher"]."""
    from autokernel import interp
    interp.install()  # third-party Triton under the CPU interpreter, before the checkout's modules bind names
    harness.preload(target.get("preload") or ())
    seed = int(payload["seed"])
    cases = [_Case(None, c, seed, ci, device, torch.load(inputs / POOL_FILE.format(ci), weights_only=True),
                   {**target, "launcher": c["launcher"], "outputs": c.get("outputs"),
                    "inplace": c.get("inplace") or []} if "launcher" in c else target)
             for ci, c in enumerate(payload["cases"])]
    leaf = target["module"].rpartition(".")[2]
    return None, cases, inputs / f"{leaf}.py", target["module"], target["launcher"]


def _warm(timer, cases: list[_Case], tamper_check: _TamperCheck, device: str) -> None:
    """Compile, fill caches, autotune: each shape at least once, every call guarded, nothing kept."""
    until = _monotonic() + WARMUP_S[device]
    rep = -1
    while True:
        for c in cases:
            _call(timer, c, rep, f"shape {c.ci}, warm-up")
            tamper_check(f"shape {c.ci}, warm-up")
        if _monotonic() >= until:
            return
        rep -= 1


def _timed(timer, cases: list[_Case], reps: int, tamper_check: _TamperCheck) -> None:
    """reps x every shape; the shapes' order rotates each repetition so none always follows another."""
    n = 0
    for rep in range(reps):
        k = rep % len(cases)
        for c in cases[k:] + cases[:k]:
            where = f"shape {c.ci}, repetition {rep}"
            res, ms = _call(timer, c, rep, where)
            c.keep(rep, res)  # copied now, before anything else can run
            for clock, v in ms.items():
                c.clocks.setdefault(clock, []).append(float(v))
            n += 1
            if n % TAMPER_CHECK_EVERY == 0 or tamper_check.new_threads():
                tamper_check(where)


if __name__ == "__main__":  # not a script
    sys.exit("autokernel.bench.job is a sandbox entry, run by autokernel.bench.rounds")
