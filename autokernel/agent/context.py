"""What the model is told beyond the op's spec: the facts of the device that decide speed, where the engine calls the
op, and the sibling kernels that solve a neighbouring problem in the same checkout.

All of it comes from the trusted side: torch's device properties, autokernel/engine/ (the engine's own source, one
`ops("<op>", site, ...)` call per slot), and the target checkout's kernels/ (the incumbent files, never a candidate),
read as regular files inside the checkout (autokernel.paths.read_text).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from autokernel import device, paths
from autokernel import ops as opspecs
from autokernel.paths import PACKAGE

ENGINE = PACKAGE / "engine"
SIBLING_CHARS = 4000  # per sibling file shown: enough for a kernel and its launcher, not a whole module


def device_facts() -> str:
    """What decides a kernel's speed here, in a few lines."""
    if not device.is_cuda():
        return ("Triton interpreter on CPU: `num_warps` and `num_stages` do nothing here. The cost follows (programs "
                "launched) x (tl operations per program): every tl op of every program is a round of numpy calls "
                "on the whole block, so fewer, wider programs and fewer ops per element are faster. These timings "
                "say nothing about GPU speed.")
    import torch
    p = torch.cuda.get_device_properties(0)
    smem = getattr(p, "shared_memory_per_block_optin", None) or getattr(p, "shared_memory_per_block", None)
    l2 = getattr(p, "L2_cache_size", None)
    parts = [f"{p.name}: compute capability {p.major}.{p.minor}", f"{p.multi_processor_count} SMs"]
    if smem:
        parts.append(f"{smem // 1024} KiB shared memory per block (opt-in)")
    if l2:
        parts.append(f"{l2 // (1024 * 1024)} MiB L2")
    parts.append(f"{p.total_memory / 2 ** 30:.0f} GiB memory")
    return "; ".join(parts) + ". A grid with fewer programs than SMs leaves the device partly idle."


def call_sites(op: str, engine: Path = ENGINE) -> list[str]:
    """`file:line: code` for every ops("<op>", ...) call in the engine's source."""
    pattern = re.compile(r"\bops\(\s*['\"]" + re.escape(op) + r"['\"]")
    out = []
    for f in sorted(engine.glob("*.py")):
        for n, text in enumerate(f.read_text().splitlines(), start=1):
            if pattern.search(text):
                out.append(f"autokernel/engine/{f.name}:{n}: {text.strip()}")
    return out


def siblings(op: str) -> list[str]:
    """Other ops whose name contains this one's or is contained in it (rmsnorm <-> add_rmsnorm, attention <->
    attention_decode, matmul <-> matmul_q4_1)."""
    return [o for o in opspecs.OPS if o != op and (op in o or o in op)]


def sibling_sources(op: str, kernels_dir: Path) -> list[dict]:
    """[{op, source}] of the siblings' files in the target's kernels/, each cut at SIBLING_CHARS."""
    out = []
    for o in siblings(op):
        f = kernels_dir / f"{o}.py"
        if os.path.lexists(f):
            text = paths.read_text(f, paths.checkout_of(f))  # the checkout's file: regular, inside it (exit 2)
            out.append({"op": o, "source": text if len(text) <= SIBLING_CHARS else
                        text[:SIBLING_CHARS] + "\n# ... (cut)"})
    return out
