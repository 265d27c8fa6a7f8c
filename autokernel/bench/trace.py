"""The one thing the benchmark reads from a trace: which shapes an op ran at, and how often.

Kept small and apart because the trace format belongs to the profiler; this reads `ops[OP]["shapes"]` of
traces/<run>/summary.json as a list of {"shape": {...}, "calls": n} (and an optional "dtype") and nothing else.
"""
from __future__ import annotations

import json
from pathlib import Path

from autokernel.errors import UserError


def shapes_from_trace(path: Path, op: str) -> list[dict]:
    """[{"shape": {...}, "calls": n, "dtype": str | None}, ...] for `op`; a bad file raises UserError naming it."""
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise UserError(f"{path}: cannot read the trace ({e.strerror})") from None
    except ValueError as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if isinstance(data, dict) and data.get("schema", 1) != 1:
        raise UserError(f"{path}: trace schema {data.get('schema')!r}; this reader knows schema 1")
    entries = ((data.get("ops") or {}).get(op) or {}).get("shapes") if isinstance(data, dict) else None
    if not entries:
        raise UserError(f"{path}: no shapes recorded for op '{op}' (expected ops.{op}.shapes)")
    out = []
    for k, e in enumerate(entries):
        shape = e.get("shape") if isinstance(e, dict) else None
        if not isinstance(shape, dict) or not all(isinstance(v, int) for v in shape.values()):
            raise UserError(f"{path}: ops.{op}.shapes[{k}].shape must be a mapping of dimension names to integers")
        calls = e.get("calls", 1)
        if not isinstance(calls, int) or calls < 1:
            raise UserError(f"{path}: ops.{op}.shapes[{k}].calls must be a positive integer")
        dtype = e.get("dtype")
        out.append({"shape": shape, "calls": calls,
                    "dtype": dtype.removeprefix("torch.") if isinstance(dtype, str) else None})
    return out
