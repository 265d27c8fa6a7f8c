"""Time of a thorough verdict, stage by stage: `python benchmarks/verdict_time.py OP FILE [OP FILE ...]`.

Runs `autokernel.gate.verify` exactly as `autokernel verify OP FILE` does (every dtype and distribution of the
spec, the production-range sweep, the end-to-end stage) and prints each stage's seconds, the numeric stage's case
and call counts, and the end-to-end stage's plan (how much of the model the candidate ran in, and its predicted
seconds). Without CUDA every figure is a Triton-interpreter (CPU) time, and says so. The e2e baseline is computed
once and cached (sandbox/cache); a first run pays for it outside the verdict, so run twice to see a warm figure.
Figures, not a test: nothing here asserts. The issue's target: a thorough rmsnorm verdict under 60 s on 2 cores.
"""
from __future__ import annotations

import sys
import time

from autokernel import device


def main(argv: list[str]) -> None:
    if len(argv) < 2 or len(argv) % 2:
        sys.exit("usage: python benchmarks/verdict_time.py OP FILE [OP FILE ...]")
    from autokernel import paths
    from autokernel.gate import verify
    from autokernel.gate.e2e import baseline
    from autokernel.policy import Policy
    layout = paths.target()  # as `autokernel verify` resolves it: the checkout here, else the installed project
    clock = "CUDA" if device.is_cuda() else "CPU / Triton interpreter"
    t = time.perf_counter()
    baseline(Policy(), layout.kernels)
    print(f"e2e baseline (cached after the first run): {time.perf_counter() - t:.1f} s")
    for op, path in zip(argv[::2], argv[1::2]):
        v = verify(op, path, run_dir=layout.run_dir("verify", op), kernels_dir=layout.kernels)
        print(f"{op} {path}: {v.verdict}{'' if v.accepted else ' (' + v.reason + ')'} in {v.elapsed_s:.1f} s "
              f"({clock})")
        for s in v.stages:
            m = s.metrics or {}
            extra = {k: m[k] for k in ("cases", "calls", "jobs", "sandbox_s", "plan", "positions", "decode_positions")
                     if k in m}
            print(f"  {s.name:<8} {s.elapsed_s:8.1f} s  {'ok' if s.passed else s.reason}  {extra}")


if __name__ == "__main__":
    main(sys.argv[1:])
