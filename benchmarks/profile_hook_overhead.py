"""What `autokernel profile --repo` costs the engine it profiles: the Liger example's workload (Hugging Face Llama on
Liger-Kernel's RMSNorm, RoPE and SwiGLU) timed plain, with the generic launch hook alone (what `autokernel init`
runs), and with the hook plus the declared launchers' recorder (what the profile runs: layouts bound to parameter
names, in-place writes detected by comparing the first calls' tensors), rounds interleaved in one process.

    python benchmarks/profile_hook_overhead.py [DIR] [--rounds 5]

DIR: a checkout from examples/liger/make_checkout.sh (default: one built into a temporary directory). Prints the
device and versions, per round the three wall times, then medians and minima (the minimum is the figure least
disturbed by other load on a shared machine), generated tokens/s and the overhead in %. On a
machine without CUDA every kernel runs through the Triton interpreter (with autokernel.target.interp's layer):
interpreter figures, labelled so, never GPU ones. Runs the checkout's code in this process: use a checkout you
built yourself.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata as md
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autokernel import device

device.ensure_interpreter()  # before triton is imported
HERE = Path(__file__).resolve().parents[1]
OPS = {"llama_liger.ops.rms_norm": ["rms_norm_forward"], "llama_liger.ops.rope": ["rope_forward"],
       "llama_liger.ops.swiglu": ["swiglu_forward"]}  # as examples/liger/autokernel.toml declares them
MODES = ("plain", "launch hook", "hook + launcher records")


def timed(fn, acc: list[float]):
    """`fn`, adding its wall time to acc[0]."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[0] += time.perf_counter() - t0
    return call


def checkout(arg: str | None) -> Path:
    if arg is not None:
        return Path(arg).resolve()
    ck = Path(tempfile.mkdtemp(prefix="ak-liger-")) / "llama_liger"
    subprocess.run(["bash", str(HERE / "examples/liger/make_checkout.sh"), str(ck)], check=True,
                   env={**os.environ, "PYTHON": sys.executable}, stdout=subprocess.DEVNULL)
    return ck


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkout", nargs="?")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    root = checkout(args.checkout)
    from autokernel.target import interp, launches
    interpreted = interp.install()
    hook = launches.LaunchHook(str(root))
    hook.install()
    if not interpreted and device.is_cuda():
        import torch
        hook.sync = torch.cuda.synchronize  # as the profile's job does where kernels compile
    sys.path.insert(0, str(root))
    recorder = launches.LauncherRecorder()
    inner, outer = [0.0], [0.0]  # launcher time without / with the recorder's wrapper: the difference is its cost
    for module, names in OPS.items():
        mod = importlib.import_module(module)
        for n in names:
            setattr(mod, n, timed(getattr(mod, n), inner))
        recorder.install(module, names, module.replace(".", "/") + ".py")
        for n in names:
            setattr(mod, n, timed(getattr(mod, n), outer))
    from llama_liger import engine as liger_engine
    eng = liger_engine.build()
    eng.workload()  # warm-up: the interpreter (or the compiler) sees each kernel once
    tokens = len(liger_engine.PROMPTS) * liger_engine.NEW_TOKENS
    fp = device.fingerprint()
    label = "CPU / Triton interpreter (interpreter figures, not GPU ones)" if interpreted else \
        f"CUDA {fp.get('gpu')} (compiled; the hook synchronises around each launch)"
    print(f"device: {label} · {fp.get('cpu')} x{fp.get('cpu_count')} · python {fp['python']} · torch {fp['torch']} "
          f"· triton {fp['triton']} · liger-kernel {md.version('liger-kernel')} · transformers "
          f"{md.version('transformers')}")
    print(f"workload: {len(liger_engine.PROMPTS)} prompts, {liger_engine.NEW_TOKENS} new tokens each "
          f"({tokens} generated tokens) · {args.rounds} rounds, modes interleaved")
    times: dict[str, list[float]] = {m: [] for m in MODES}
    records_s: list[float] = []
    for r in range(args.rounds):
        order = MODES[r % 3:] + MODES[:r % 3]
        for mode in order:
            hook.active, recorder.active = mode != "plain", mode == MODES[2]
            inner_0, outer_0 = inner[0], outer[0]
            t0 = time.perf_counter()
            eng.workload()
            times[mode].append(time.perf_counter() - t0)
            if recorder.active:
                records_s.append((outer[0] - outer_0) - (inner[0] - inner_0))
        hook.active = recorder.active = False
        print(f"round {r}: " + ", ".join(f"{m} {times[m][-1]:.3f} s" for m in MODES))
    launches_n = sum(g["calls"] for g in hook.groups.values())
    base, base_min = statistics.median(times["plain"]), min(times["plain"])
    for m in MODES:
        med, low = statistics.median(times[m]), min(times[m])
        print(f"{m:>24}: median {med:.3f} s ({100 * (med / base - 1):+.1f}%), min {low:.3f} s "
              f"({100 * (low / base_min - 1):+.1f}%), {tokens / med:.2f} generated tokens/s at the median")
    print(f"hook's own time (stack walk, argument description): {1e3 * hook.overhead_s / max(1, launches_n):.3f} ms "
          f"per launch over {launches_n} launches")
    calls = sum(g["calls"] for g in recorder.groups.values()) / max(1, len(records_s))
    print(f"launcher records' own time (binding, layouts, in-place checks): median "
          f"{1e3 * statistics.median(records_s):.1f} ms per workload of {calls:.0f} launcher calls")
    print("the own times are the stable figures; wall-clock differences below the rounds' spread are noise")


if __name__ == "__main__":
    main()
