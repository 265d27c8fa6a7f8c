"""The gate: static, runtime, numeric (and, appended by its owner, end-to-end) checks of a candidate -> Verdict.

Light on purpose: the sandboxed child imports autokernel.gate.child through this package, and must not pull in the
op references or anything else a candidate could reach.
"""
from __future__ import annotations

from autokernel.gate.verdict import REASONS, StageResult, Verdict


def verify(op, candidate_path, **kwargs) -> Verdict:
    """See autokernel.gate.pipeline.verify (run_dir and kernels_dir are the caller's to name)."""
    from autokernel.gate.pipeline import verify as _verify
    return _verify(op, candidate_path, **kwargs)


__all__ = ["REASONS", "StageResult", "Verdict", "verify"]
