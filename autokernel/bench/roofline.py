"""Device peaks and the roofline floor: the least time an op can take, given the bytes it must move and the FLOPs it
must do. The one roofline: the benchmark (fraction of peak, `bench.implausible`), the ranker (headroom, from the
trace's `roofline` section, which `describe` writes) and the agent's prompt (each shape's floor) all use `floor_ms`.

GPU figures are the vendors' spec sheets: dense (no 2:4 sparsity), HBM/GDDR bandwidth, fp32 on the CUDA cores
(tf32 would be the lower-precision shortcut, docs/shortcuts.md #13). Nothing real beats them, which is what the
implausibility check needs. CPU figures are measured once per process (numpy copy and matmul), approximate, and
only ever describe Triton-interpreter runs.
"""
from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class Peak:
    name: str
    gbps: float  # DRAM bandwidth, GB/s (1e9 bytes/s)
    tflops: dict[str, float] = field(default_factory=dict)  # dense peak by dtype name: float32, float16, bfloat16
    source: str = "spec sheet"

    def tflops_for(self, dtype: torch.dtype | str) -> float:
        """The dense peak for `dtype` (a torch dtype or its name), else the float32 one."""
        name = str(dtype).removeprefix("torch.")
        return self.tflops.get(name) or self.tflops.get("float32", 0.0)


def _gpu(name: str, gbps: float, fp32: float, half: float) -> Peak:
    return Peak(name, gbps, {"float32": fp32, "float16": half, "bfloat16": half})


# (pattern matched against torch.cuda.get_device_name(), peak); first match wins, so specific names come first.
GPU_PEAKS: tuple[tuple[str, Peak], ...] = (
    (r"H200", _gpu("H200", 4800, 67, 989)),
    (r"H100.*PCIe", _gpu("H100 PCIe", 2000, 51, 756)),
    (r"H100.*NVL", _gpu("H100 NVL", 3900, 60, 835)),
    (r"H100", _gpu("H100 SXM", 3350, 67, 989)),
    (r"A100.*SXM4-80GB", _gpu("A100 SXM4 80GB", 2039, 19.5, 312)),
    (r"A100.*80GB.*PCIe", _gpu("A100 PCIe 80GB", 1935, 19.5, 312)),
    (r"A100", _gpu("A100 40GB", 1555, 19.5, 312)),
    (r"\bL4\b", _gpu("L4", 300, 30.3, 121)),
)


def gpu_peak(device_name: str) -> Peak | None:
    for pattern, peak in GPU_PEAKS:
        if re.search(pattern, device_name):
            return peak
    return None


@functools.lru_cache(maxsize=1)
def cpu_peak() -> Peak:
    """Measured: best of a few 64 MiB copies (read + write) and 512^3 float32 matmuls; ~0.2 s, once per process."""
    a = np.ones(16 << 20, dtype=np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    gbps = 2 * a.nbytes / best / 1e9
    m = np.ones((512, 512), dtype=np.float32)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        m @ m
        best = min(best, time.perf_counter() - t0)
    tflops = 2 * 512 ** 3 / best / 1e12
    return Peak("cpu", gbps, {"float32": tflops, "float16": tflops, "bfloat16": tflops}, "measured (numpy)")


def peak_for(fingerprint: dict) -> Peak | None:
    """The peak of the device a fingerprint (autokernel.device.fingerprint()) describes; None for an unknown GPU."""
    if fingerprint.get("kind") == "cuda":
        return gpu_peak(fingerprint.get("gpu", ""))
    return cpu_peak()


def describe(fp: dict) -> dict:
    """The peaks of the device `fp` describes as a trace stores them (summary.json `roofline`: GB/s, GFLOP/s by
    dtype, where they come from, and what they mean there); `from_description` reads them back."""
    peak = peak_for(fp)
    if peak is None:
        return {"gbps": None, "gflops": {}, "source": "unknown GPU",
                "note": f"no peak for {fp.get('gpu')!r} in autokernel/bench/roofline.py: ranked by time share only"}
    note = ("datasheet peak, dense; fp32 on CUDA cores" if fp.get("kind") == "cuda" else
            "CPU ceiling: op times are Triton-interpreter times, so headroom is interpreter overhead")
    return {"gbps": peak.gbps, "gflops": {k: v * 1e3 for k, v in peak.tflops.items()},
            "source": f"{peak.name}: {peak.source}", "note": note}


def from_description(roof: dict) -> Peak | None:
    """The Peak a `describe` section (a trace's `roofline`) stands for; None without a bandwidth."""
    if not roof.get("gbps"):
        return None
    return Peak(str(roof.get("source", "trace")), float(roof["gbps"]),
                {k: v / 1e3 for k, v in (roof.get("gflops") or {}).items() if v}, str(roof.get("source", "trace")))


def bounds_ms(flops: int, bytes_moved: int, dtype: torch.dtype | str, peak: Peak) -> tuple[float, float]:
    """(ms to move the bytes, ms to do the FLOPs) at the peak: one call's two roofline bounds."""
    tf = peak.tflops_for(dtype)
    return 1e3 * bytes_moved / (peak.gbps * 1e9), (1e3 * flops / (tf * 1e12) if tf else 0.0)


def floor_ms(flops: int, bytes_moved: int, dtype: torch.dtype | str, peak: Peak) -> float:
    """The roofline's lower bound on one call's time, ms: the slower of moving the bytes and doing the FLOPs."""
    return max(bounds_ms(flops, bytes_moved, dtype, peak))
