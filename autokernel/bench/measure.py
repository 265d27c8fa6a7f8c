"""Benchmark an op's candidates against its incumbent, judged in the parent.

Each file is timed in fresh sandboxed processes of its own, in A/B rounds (autokernel.bench.rounds; the harness is
autokernel.bench.job). Jobs only return raw times and outputs; everything that decides a verdict is computed in the
trusted process (autokernel.bench.results: the result types and `judge`, re-exported here).
"""
from __future__ import annotations

from pathlib import Path

from autokernel.bench.results import (  # re-exported: the bench's public names live here
    CPU_LABEL,
    MIN_MS,
    FileResult,
    IncumbentFailed,
    Measurement,
    ShapeResult,
    judge,
)
from autokernel.bench.rounds import measure_rounds
from autokernel.paths import INSTALLED_LAYOUT
from autokernel.policy import Policy

__all__ = ["CPU_LABEL", "MIN_MS", "FileResult", "IncumbentFailed", "Measurement", "ShapeResult", "judge", "measure"]


def measure(op: str, candidates: list[Path], cases: list[dict], policy: Policy, job_root: Path,
            incumbent: Path | None = None) -> Measurement:
    """Time the incumbent against the candidates: A/B rounds in which every file runs in a fresh sandboxed process
    of its own (autokernel.bench.rounds), judged here by `judge`. cases: [{"shape": {...}, "calls": n, "dtype":
    "float32"}]. `incumbent` is the target checkout's kernels/<op>.py (autokernel.paths; default: the installed
    project's). Raises IncumbentFailed when the incumbent's own job fails (exit 2: no verdict is possible).
    """
    incumbent = Path(incumbent) if incumbent is not None else INSTALLED_LAYOUT.kernels / f"{op}.py"
    return measure_rounds(op, [Path(c) for c in candidates], cases, policy, job_root, incumbent)
