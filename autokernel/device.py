"""Which machine a number came from: every trace, verdict and measurement carries this fingerprint."""
from __future__ import annotations

import functools
import os
import platform

import torch


def is_cuda() -> bool:
    return torch.cuda.is_available()


def ensure_interpreter() -> None:
    """On a machine without CUDA, run Triton kernels through the interpreter: TRITON_INTERPRET=1 unless already set.

    The one place this switch is made. It must happen before triton is first imported and before any @triton.jit
    function is defined (the decorator picks the interpreter then), so the kernels package calls it first thing
    (kernels/__init__.py: every kernel module, loaded by autokernel.kernel_loader or imported, goes through it), and
    so do the processes that import triton before any kernel (the gate's harness, the profiler, the test suite)."""
    if not is_cuda():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def kind() -> str:
    """'cuda' where kernels compile, 'cpu-interpreter' where they run through the Triton interpreter."""
    return "cuda" if is_cuda() else "cpu-interpreter"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def fingerprint() -> dict:
    import triton

    from autokernel import __version__
    fp = {
        "kind": kind(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "autokernel": __version__,
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    if is_cuda():
        fp["gpu"] = torch.cuda.get_device_name(0)
        fp["cuda"] = torch.version.cuda
        fp["driver"] = _nvidia_driver()
    else:
        fp["timing_note"] = "CPU / Triton interpreter timings: correctness only, never GPU speed"
    return fp


def _nvidia_driver() -> str | None:
    try:
        with open("/proc/driver/nvidia/version") as f:
            return f.readline().strip()
    except OSError:
        return None


def default_dtype() -> torch.dtype:
    """Dequantized weight/activation dtype: fp32 on CPU, bf16 on GPUs that have it, else fp16."""
    if not is_cuda():
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
