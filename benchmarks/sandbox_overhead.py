"""Start-up overhead of one sandboxed job, per isolation mode: `python benchmarks/sandbox_overhead.py [N]`.

Times `autokernel.sandbox.run` of a no-op entry (autokernel.sandbox.child:ping) end to end, parent side: process
creation, bwrap's namespaces and mounts, the cgroup, interpreter start-up, the harness, the result channel. A second
row per mode adds `import torch, triton` inside the job, which every real gate or bench job pays. A bare
`python -c pass` is the floor. Figures, not a test: nothing here asserts.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autokernel import sandbox
from autokernel.policy import Sandbox
from autokernel.sandbox import bwrap
from autokernel.sandbox.child import ping


def _row(name: str, times_s: list[float]) -> str:
    ms = sorted(1e3 * t for t in times_s)
    return (f"{name:<36} median {statistics.median(ms):8.1f} ms   mean {statistics.mean(ms):8.1f} ms   "
            f"p90 {ms[int(0.9 * (len(ms) - 1))]:8.1f} ms   (n={len(ms)})")


def _jobs(limits: Sandbox, payload: dict, n: int, root: Path) -> tuple[list[float], str]:
    out, iso = [], ""
    for k in range(n):
        t0 = time.perf_counter()
        r = sandbox.run(ping, payload, root / f"job{len(out)}-{k}", limits)
        out.append(time.perf_counter() - t0)
        assert r.ok, r
        iso = r.isolation
    return out, iso


def main(n: int = 20) -> None:
    print(f"sandbox start-up overhead per job, {n} jobs each (CPU: {sys.platform}, bwrap: "
          f"{bwrap.usable() or 'usable'})")
    bare = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t0)
    print(_row("python -c pass (floor)", bare))
    with tempfile.TemporaryDirectory(prefix="autokernel-overhead-") as d:
        modes = [("none", "subprocess")] + ([("required", "bwrap")] if bwrap.usable() is None else [])
        for isolation, label in modes:
            limits = Sandbox(isolation=isolation, timeout_s=120)
            times, iso = _jobs(limits, {}, n, Path(d))
            print(_row(f"{label} ({iso}), no-op", times))
            times, iso = _jobs(limits, {"import": ["torch", "triton"]}, max(3, n // 4), Path(d))
            print(_row(f"{label} ({iso}), import torch+triton", times))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
