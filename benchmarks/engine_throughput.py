"""Engine baseline: prefill and decode tokens/s per kernels backend and weight mode, with device and versions.

    python benchmarks/engine_throughput.py [--batch 4] [--prompt-tokens 32] [--decode 8] [--model PATH]

Prints figures; asserts nothing about speed (a benchmark, not a test). On CPU every figure is a Triton-interpreter
(or eager-torch) figure and says so.
"""
from __future__ import annotations

import argparse
import json

from autokernel import device
from autokernel.engine import open_engine
from autokernel.engine.generate import generate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--backends", default="reference,triton")
    ap.add_argument("--weights", default="quant,dequant")
    args = ap.parse_args()
    print(json.dumps(device.fingerprint()))
    print(f"{'kernels':10} {'weights':8} {'batch':>5} {'prefill tok/s':>14} {'decode tok/s':>13}  note")
    for weights in args.weights.split(","):
        for backend in args.backends.split(","):
            eng = open_engine(args.model, kernels=backend, weights=weights)
            text = "The quick brown fox jumps over the lazy dog. " * 64
            ids = eng.tokenizer.encode(text)[: args.prompt_tokens]
            rows = [ids] * args.batch
            generate(eng.model, eng.tokenizer, [ids[:4]], 2)  # warm-up: first launches compile/trace
            g = generate(eng.model, eng.tokenizer, rows, args.decode + 1)
            prefill = args.batch * len(ids) / g.prefill_s
            decode = args.batch * g.decode_steps / g.decode_s if g.decode_steps else float("nan")
            note = ("Triton interpreter" if backend == "triton" else "torch eager") if not device.is_cuda() else "CUDA"
            print(f"{backend:10} {weights:8} {args.batch:5d} {prefill:14.1f} {decode:13.2f}  {note}", flush=True)


if __name__ == "__main__":
    main()
