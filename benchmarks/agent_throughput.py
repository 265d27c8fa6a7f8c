"""Candidates judged per minute with 1 vs N agent workers: `python benchmarks/agent_throughput.py [--workers N]
[--candidates K]`.

The same K distinct candidate files for silu_mul (a library call the static stage rejects, wrong kernels the numeric
stage rejects, and with K > 4 block-size variants that pass the gate and are benchmarked) go through the real path:
scripted models (one per worker, the K files dealt round-robin) -> agent.command.start -> agent/workers.py -> the
SandboxEvaluator's real gate (bubblewrap sandbox) on sandbox slots, and the real A/B benchmark one at a time. Each
configuration gets a fresh evaluator and no ledger, so both judge all K files.

The gate is narrowed to keep the run in minutes: float32 only, two input distributions, no production-range sweep
(gate.max_rows 0) and no end-to-end KL stage; the benchmark runs its 6 rounds at bench.job_time_s 0.05. Under the CPU
Triton interpreter these are interpreter figures: what parallel gating buys on this machine's cores, never a GPU
throughput. Figures, not a test: nothing here asserts.

Measured once (2-core AMD EPYC shared with other jobs, load average ~9-12; CPU Triton-interpreter figures, K=4):
1 worker 4 judged in 37.7 s = 6.4 candidates/min; 2 workers 24.2 s = 9.9 candidates/min (1.56x). A gate-accepted
candidate's benchmark took ~2 min there and runs one at a time, so it does not parallelise.
"""
from __future__ import annotations

import argparse
import platform
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from autokernel import device, paths
from autokernel.agent import command
from autokernel.agent.evaluate import SandboxEvaluator
from autokernel.policy import Policy

OP = "silu_mul"


def candidates(k: int) -> list[str]:
    """The first k of: a library call (static stage), three wrong kernels (numeric stage), then BLOCK / num_warps
    variants of the incumbent (they pass the gate and are benchmarked, one at a time). Most of what a model submits
    fails the gate: the default k=4 measures gating alone, a larger k adds benchmarks (~2 min each here)."""
    inc = paths.target().kernel_file(OP).read_text()
    body = "y = g / (1.0 + tl.exp(-g)) * u"
    wrong = [inc.replace(body, w) for w in ("y = g * u", "y = g / (1.0 + tl.exp(g)) * u",
                                            "y = g / (2.0 + tl.exp(-g)) * u")]
    cheat = inc.replace("import torch\n", "import torch\nimport torch.nn.functional as F\n", 1).replace(
        "    out = torch.empty(", "    return F.silu(gate) * up\n    out = torch.empty(", 1)
    assert inc not in wrong and cheat != inc
    out = [cheat, *wrong]
    for block in (256, 512, 2048, 4096, 128, 8192):
        for warps in (4, 8, 2):
            out.append(re.sub(r"BLOCK=\d+, num_warps=\d+", f"BLOCK={block}, num_warps={warps}", inc))
    return list(dict.fromkeys(out))[:k]


class Scripted:
    """Submits its files one per turn, then finishes."""

    def __init__(self, i: int, files: list[str]):
        self.name, self.prices, self.files = f"scripted-{i}", None, list(files)

    def query(self, messages, tools, time_left_s=None) -> dict:
        call = (("submit_candidate", {"source": self.files.pop(0)}) if self.files else ("finish", {}))
        return {"role": "assistant", "content": "", "truncated": False,
                "tool_calls": [{"id": "t0", "name": call[0], "arguments": call[1]}],
                "usage": {"input_tokens": 0, "output_tokens": 0, "usd": 0.0, "estimated": False}}


def policy(workers: int, k: int) -> Policy:
    return Policy.model_validate({
        "gate": {"max_rows": 0},
        "bench": {"rounds": 6, "job_time_s": 0.05, "max_time_s": 10},
        "agent": {"workers": workers, "early_success": False, "max_iterations": k, "max_wall_s": 3600}})


def one(workers: int, files: list[str], root: Path) -> tuple[float, Counter]:
    import torch
    pol = policy(workers, len(files))
    run_dir = root / f"workers-{workers}"
    ev = SandboxEvaluator(run_dir, pol, seed=1, verify_kwargs={"dtypes": [torch.float32],
                                                               "dists": ["normal", "wide"], "stages": []})
    models = [Scripted(i, files[i::workers]) for i in range(workers)]
    t0 = time.perf_counter()
    result, _ = command.start(OP, pol.agent, models, ev, run_dir, bench=pol.bench, echo=lambda s: None)
    wall = time.perf_counter() - t0
    verdicts = Counter("accepted" if f.accepted else f.reasons[0]["code"] if f.reasons else f.verdict
                       for f in ev.seen.values())
    assert result.submitted == len(files), (result.submitted, result.detail)
    return wall, verdicts


def main() -> None:
    from autokernel.sandbox.slots import default_slots
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=None, help="N (default: the number of sandbox slots)")
    ap.add_argument("--candidates", type=int, default=4)
    a = ap.parse_args()
    n = a.workers or len(default_slots(Policy().sandbox))
    files = candidates(a.candidates)
    fp = device.fingerprint()
    import torch
    import triton
    label = ("GPU" if device.is_cuda() else
             "CPU, Triton interpreter: interpreter figures, not GPU throughput")
    print(f"agent throughput on {OP}: {len(files)} candidates; device {fp.get('gpu') or fp.get('cpu')} ({label}); "
          f"{len(default_slots(Policy().sandbox))} sandbox slots")
    print(f"python {platform.python_version()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"autokernel {fp.get('autokernel')}; gate narrowed (float32, 2 dists, no range sweep, no e2e stage)")
    with tempfile.TemporaryDirectory(prefix="autokernel-throughput-") as tmp:
        rows = []
        for w in dict.fromkeys((1, n)):
            wall, verdicts = one(w, files, Path(tmp))
            rows.append((w, wall))
            print(f"workers {w}: {len(files)} judged in {wall:6.1f} s = {60 * len(files) / wall:5.2f} candidates/min"
                  f"  ({', '.join(f'{k} {v}' for k, v in sorted(verdicts.items()))})", flush=True)
    if len(rows) == 2:
        print(f"speed-up of {rows[1][0]} workers over 1: {rows[0][1] / rows[1][1]:.2f}x" + (
            " (CPU interpreter figures)" if not device.is_cuda() else ""))


if __name__ == "__main__":
    sys.exit(main())
