"""What a hostile-but-grammar-clean file can make the parent spend before any sandbox job, and what a verdict's
numeric stage costs with and without the coverage requirement: `python benchmarks/verdict_bounds.py [OP ...]`.

Prints, for a ~1 MB rmsnorm file of dead constant arithmetic (thousands of "thresholds"): the static stage's,
threshold extraction's and coverage-site enumeration's parent seconds and the case plan's size next to the
incumbent's (the plan is capped: autokernel/gate/thresholds.py MAX_ROWS_FROM_THRESHOLDS); then for each OP
(default rmsnorm attention_decode) a thorough numeric verdict of the incumbent with `gate.require_coverage` off and
on: wall seconds, cases, calls, steered cases, the call at production's maximum, and the parent's peak RSS.
Without CUDA every time is a Triton-interpreter (CPU) time. Figures, not a test: nothing here asserts.
"""
from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

from autokernel import device

ROOT = Path(__file__).resolve().parents[1]


def _bloated_source(lines: int) -> str:
    src = (ROOT / "kernels" / "rmsnorm.py").read_text()
    dead = "".join(f"    c{i} = M * {i + 7} + {i * 3 + 1}\n" for i in range(lines))
    anchor = "    BLOCK_N = triton.next_power_of_2(N)\n"
    return src.replace(anchor, anchor + dead)


def parent_work() -> None:
    from autokernel.gate import coverage, numeric, static, thresholds
    from autokernel.ops import get
    spec = get("rmsnorm")
    plain = (ROOT / "kernels" / "rmsnorm.py").read_text()
    big = _bloated_source(30000)
    for name, src in (("incumbent", plain), ("1 MB of dead constants", big)):
        t0 = time.perf_counter()
        static.check_source(src, "rmsnorm", ROOT / "kernels" / "rmsnorm.py")
        t1 = time.perf_counter()
        th = thresholds.extract(src)
        t2 = time.perf_counter()
        sites = coverage.sites(src)
        t3 = time.perf_counter()
        plan = numeric.plan(spec, None, None, None, 1, 1024, th)
        rows = sum(p[0]["M"] for p in plan)
        print(f"{name} ({len(src) / 1e6:.2f} MB): static {t1 - t0:.2f} s, thresholds {t2 - t1:.2f} s "
              f"({len(th)} found), coverage sites {t3 - t2:.2f} s ({len(sites)}); plan {len(plan)} cases, "
              f"{rows} rows")


def verdicts(ops: list[str]) -> None:
    from autokernel import paths
    from autokernel.gate import verify
    from autokernel.policy import Policy
    layout = paths.target()  # where `autokernel verify` would put its run directories
    for op in ops:
        for cov in (False, True):
            t = time.perf_counter()
            v = verify(op, ROOT / "kernels" / f"{op}.py", stages=[], policy=Policy(gate={"require_coverage": cov}),
                       run_dir=layout.run_dir("verify", op), kernels_dir=ROOT / "kernels")
            n = v.stages[-1].metrics
            rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"{op} coverage {'on ' if cov else 'off'}: {v.verdict} in {time.perf_counter() - t:.1f} s; "
                  f"{n.get('cases')} cases, {n.get('calls')} calls, steered {n.get('coverage_steered_cases', '-')}, "
                  f"production maximum {n.get('reach', '-')}; parent peak RSS so far {rss_mb:.0f} MB")


def main(argv: list[str]) -> None:
    import torch
    import triton
    print(f"device: {'CUDA' if device.is_cuda() else 'CPU / Triton interpreter'}; torch {torch.__version__}, "
          f"triton {triton.__version__}")
    parent_work()
    verdicts(argv or ["rmsnorm", "attention_decode"])


if __name__ == "__main__":
    main(sys.argv[1:])
