"""What `autokernel init`'s launch hook (autokernel/target/launches.py) costs a foreign engine: the Liger example's
workload (examples/liger/make_checkout.sh DIR) timed with and without the hook, interleaved, in one process.

    python benchmarks/launch_hook_overhead.py DIR [--rounds 5]

Prints per round the workload's wall time both ways, the hook's own time per launch and generated tokens/s. On CPU
the kernels run through the Triton interpreter (with autokernel.target.interp's compatibility layer): interpreter
figures, not GPU ones. Runs the checkout's code in this process: use it on a checkout you built yourself."""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from autokernel import device

device.ensure_interpreter()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkout")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from autokernel.target import interp, launches
    interp.install()
    hook = launches.LaunchHook(args.checkout)
    hook.install()
    sys.path.insert(0, args.checkout)
    from llama_liger import engine as liger_engine
    eng = liger_engine.build()
    eng.workload()  # warm-up: the interpreter rewrites each kernel once
    tokens = len(liger_engine.PROMPTS) * liger_engine.NEW_TOKENS
    on, off = [], []
    for r in range(args.rounds):
        for active in ((True, False) if r % 2 == 0 else (False, True)):
            hook.active, before = active, hook.overhead_s
            t0 = time.perf_counter()
            eng.workload()
            dt = time.perf_counter() - t0
            (on if active else off).append(dt)
            if active:
                hook_s = hook.overhead_s - before
        hook.active = False
        print(f"round {r}: with hook {on[-1]:.3f} s, without {off[-1]:.3f} s, hook's own time {hook_s * 1e3:.1f} ms")
    launches_per_run = sum(g["calls"] for g in hook.groups.values()) / ((args.rounds + 1) // 2 + args.rounds // 2)
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"{device.kind()}: median workload {m_on:.3f} s with the hook, {m_off:.3f} s without "
          f"({100 * (m_on / m_off - 1):+.1f}%); {tokens / m_on:.2f} vs {tokens / m_off:.2f} generated tokens/s; "
          f"hook {1e3 * hook.overhead_s / max(1, sum(g['calls'] for g in hook.groups.values())):.2f} ms per launch, "
          f"{launches_per_run:.0f} launches per workload")


if __name__ == "__main__":
    main()
