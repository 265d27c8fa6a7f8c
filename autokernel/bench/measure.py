"""Benchmark an op's candidates against its incumbent, judged in the parent.

Each file is timed in fresh sandboxed processes of its own, in A/B rounds (autokernel.bench.rounds; the harness is
autokernel.bench.job). Jobs only return raw times and outputs; everything that decides a verdict is computed in the
trusted process (autokernel.bench.results: the result types and `decide`, re-exported here).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from autokernel.bench.results import (  # re-exported: the bench's public names live here
    CPU_LABEL,
    MIN_MS,
    FileResult,
    IncumbentFailed,
    Measurement,
    ShapeResult,
    decide,
)
from autokernel.bench.rounds import measure_rounds
from autokernel.errors import UserError
from autokernel.ops import OPS, get
from autokernel.paths import read_python
from autokernel.policy import Policy

if TYPE_CHECKING:
    from autokernel.gate.verdict import StageResult

__all__ = ["CPU_LABEL", "MIN_MS", "FileResult", "IncumbentFailed", "Measurement", "ShapeResult", "check_inputs",
           "decide", "measure", "refusals"]


def measure(op: str, candidates: list[Path], cases: list[dict], policy: Policy, job_root: Path,
            incumbent: Path) -> Measurement:
    """Time the incumbent against the candidates: A/B rounds in which every file runs in a fresh sandboxed process
    of its own (autokernel.bench.rounds), decided here by `decide`. cases: [{"shape": {...}, "calls": n, "dtype":
    "float32"}]. `incumbent` is the target checkout's kernels/<op>.py (autokernel.paths: the caller names it).
    Raises IncumbentFailed when the incumbent's own job fails (exit 2: no verdict is possible).
    """
    return measure_rounds(op, [Path(c) for c in candidates], cases, policy, job_root, Path(incumbent))


def check_inputs(op: str, candidates: list[Path], incumbent: Path, root: Path) -> None:
    """Bad input is exit 2 before anything runs; the incumbent must be a regular file inside `root` (the checkout's
    own, or, given with --incumbent, wherever the user keeps it) that parses (autokernel.paths.read_python)."""
    if op not in OPS:
        raise UserError(f"unknown op '{op}'; known ops: {', '.join(OPS)}")
    try:
        get(op)
    except ImportError as e:
        raise UserError(f"op '{op}' has no trusted spec yet (autokernel/ops/{op}.py): {e}") from None
    if not os.path.lexists(incumbent):
        raise UserError(f"{incumbent}: no incumbent kernel for op '{op}'")
    read_python(incumbent, root)
    for c in candidates:
        if not Path(c).is_file():
            raise UserError(f"{c}: no such candidate file")
        if Path(c).suffix != ".py":
            raise UserError(f"{c}: a candidate is a Python file replacing kernels/{op}.py")


def refusals(op: str, candidates: list[Path], incumbent: Path, policy: Policy) -> list[tuple[Path, StageResult]]:
    """The gate's static stage on every candidate, before anything runs: what the gate refuses is never timed
    (a file it refuses would be rejected by `autokernel verify` anyway, and timing runs the file's code)."""
    from autokernel.gate import static
    out = []
    for c in candidates:
        try:
            source = c.read_bytes()
        except OSError as e:
            raise UserError(f"{c}: cannot read the candidate ({e.strerror})") from None
        res = static.check_source(source, op, incumbent, policy=policy)
        if not res.passed:
            out.append((c, res))
    return out
