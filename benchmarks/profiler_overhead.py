"""What does profiling cost? Engine decode tokens/s plain, with the profile's op recorder, and with the recorder
under torch.profiler (what `autokernel profile` runs, every call timed), on the same prompts.

    python benchmarks/profiler_overhead.py [--model PATH] [--kernels reference|triton] [--weights quant|dequant]
                                           [--batch B] [--decode-steps N] [--repeats R]

On the CPU the defaults are the torch references on dequantized weights: through the Triton interpreter one
SmolLM2-135M decode step takes minutes and its own time would hide the profiler's, and the q4_1 reference
dequantizes its weight on every call. That is also the worst case for relative overhead: the ops are fastest.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch

import kernels  # noqa: F401  sets TRITON_INTERPRET on CPU before triton is imported
from autokernel import device
from autokernel.engine import open_engine
from autokernel.engine.generate import left_pad
from autokernel.profile.recorder import Recorder

PROMPTS = ["Hi!", "What is the capital of France?", "Explain why the sky is blue.", "Write a haiku about rain."]


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def decode_tokens_per_s(eng, rows, steps: int) -> float:
    """Greedy prefill + `steps` decode forwards; tokens/s of the decode part."""
    model = eng.model
    ids, kv_start = left_pad(rows, eng.tokenizer.pad_id, model.device)
    cache = model.new_cache(ids.shape[0], ids.shape[1] + steps + 1)
    logits = model.forward(ids, cache, kv_start)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        logits = model.forward(logits.argmax(-1)[:, None], cache, kv_start)
    sync()
    return ids.shape[0] * steps / (time.perf_counter() - t0)


def main() -> None:
    cuda = device.is_cuda()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--kernels", default="triton" if cuda else "reference", choices=["reference", "triton"])
    ap.add_argument("--weights", default="quant" if cuda else "dequant", choices=["quant", "dequant"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--decode-steps", type=int, default=16 if cuda else 4)
    ap.add_argument("--repeats", type=int, default=3, help="rounds; a multiple of 3 rotates the modes evenly")
    a = ap.parse_args()

    eng = open_engine(a.model, kernels=a.kernels, weights=a.weights)
    rows = [eng.encode_prompt(p) for p in (PROMPTS * a.batch)[:a.batch]]
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])

    def plain():
        return decode_tokens_per_s(eng, rows, a.decode_steps)

    def recorder():
        eng.model.ops.observer = Recorder(cuda, None)
        try:
            return decode_tokens_per_s(eng, rows, a.decode_steps)
        finally:
            eng.model.ops.observer = None

    def profiled():
        rec = Recorder(cuda, None)
        eng.model.ops.observer = rec
        try:
            with torch.profiler.profile(activities=activities) as prof:
                tps = decode_tokens_per_s(eng, rows, a.decode_steps)
            rec.finish(prof)  # the CUDA mapping of device events is part of the cost
            return tps
        finally:
            eng.model.ops.observer = None

    plain()  # warm-up: Triton compiles (CUDA), allocator, first-touch
    modes = {"plain": plain, "recorder": recorder, "recorder + torch.profiler": profiled}
    results = {name: [] for name in modes}
    names = list(modes)
    for r in range(a.repeats):  # interleaved and rotated, so drift and run order hit every mode alike
        for name in names[r % len(names):] + names[:r % len(names)]:
            results[name].append(modes[name]())

    fp = device.fingerprint()
    where = fp.get("gpu") or f"{fp['cpu']} x{fp['cpu_count']}"
    print(f"device: {fp['kind']} ({where}); torch {fp['torch']}, triton {fp['triton']}, python {fp['python']}"
          + (f", CUDA {fp.get('cuda')}" if cuda else ""))
    print(f"engine: {eng.gguf.path.name}, {a.kernels} kernels, {a.weights} weights, batch {a.batch}, "
          f"{a.decode_steps} decode steps, median of {a.repeats}")
    base = statistics.median(results["plain"])
    for name, vals in results.items():
        tps = statistics.median(vals)
        print(f"  {name:<26} {tps:9.2f} tok/s   overhead {100 * (base / tps - 1):+6.1f}%")


if __name__ == "__main__":
    main()
