"""The Trace: traces/<run-id>/summary.json, what `profile` writes and `rank`, the agent, the gate and the benchmark
read, through the one reader here (`load_trace`; `cases` for an op's shape corpus).

summary.json, schema 1 (a change of meaning bumps SCHEMA; readers refuse other schemas):

    schema, run_id, created, device (fingerprint), kernels, weights, model, workload {name, path, sha256, spec},
    timing {source, sources {source: calls}, label, note, timed_calls_per_shape, timed_calls, extrapolated_calls},
    totals {total_op_ms, e2e_ms, wall_ms, observer_ms, prefill_tokens, decode_tokens, ...},
    roofline {gbps, gflops {dtype: GFLOP/s}, source, note},
    ops {op: {calls, timed_calls, total_ms, mean_ms, p50_ms, p95_ms, share, e2e_share, flops_per_call,
              bytes_per_call, gbps, gflops, phases {prefill|decode: {calls, total_ms}},
              sites {site: {calls, total_ms, mean_ms, share}},
              shapes [{shape, calls, timed_calls, total_ms, mean_ms, min_ms, max_ms (of the timed calls), flops,
                       bytes, dtype, dtypes [{arg: dtype}], strides [{arg: [..]}], sizes [{arg: [..]}],
                       scalars [{arg: v}], sites [site with the layer index as *]}]}},
    total_op_ms (= totals.total_op_ms), files {chrome_trace, py_spy}, py_spy {...}

`ops[op].shapes` is the shape corpus: every distinct shape the op was called with, and how often.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import TypedDict, cast

import numpy as np
import torch

from autokernel import device
from autokernel import ops as opspecs
from autokernel.errors import UserError
from autokernel.profile.recorder import Call
from autokernel.untrusted import plain

SCHEMA = 1
TRACES = Path("traces")


class Trace(TypedDict, total=False):
    """A summary.json as `load_trace` returns it (every field: the module docstring), plus `_path`, the file read."""
    schema: int
    run_id: str
    created: str
    device: dict
    kernels: str
    weights: str
    model: dict
    workload: dict
    timing: dict
    totals: dict
    roofline: dict
    ops: dict[str, dict]
    total_op_ms: float
    files: dict  # {chrome_trace, py_spy}; a target's: {chrome_trace: None, sandbox_log}
    py_spy: dict | None
    target: dict  # only in a target checkout's trace (autokernel/target/profile_target.py)
    _path: str


def _layer_free(site: str) -> str:
    return re.sub(r"^blk\.\d+\.", "blk.*.", site)


def _distinct(items: list[dict]) -> list[dict]:
    out: list[dict] = []
    for it in items:
        if it not in out:
            out.append(it)
    return out


def charged_ms(calls: list[Call]) -> list[float]:
    """Each call's time: measured, or (sampling) the mean of its (op, shape)'s timed calls."""
    timed: dict[tuple, list[float]] = defaultdict(list)
    for c in calls:
        if c.timed and c.ms is not None:
            timed[(c.op, c.shape)].append(c.ms)
    means = {k: float(np.mean(v)) for k, v in timed.items()}
    return [c.ms if c.timed and c.ms is not None else means.get((c.op, c.shape), 0.0) for c in calls]


def summarize(calls: list[Call], non_op_ms: float) -> tuple[dict, float]:
    """(ops section, total op ms). `non_op_ms` is the run's time outside op calls (glue, cache writes, sampling)."""
    ms = charged_ms(calls)
    total = float(sum(ms))
    by_op: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(calls):
        by_op[c.op].append(i)
    ops = {op: _op_entry(op, [calls[i] for i in idx], [ms[i] for i in idx], total, total + non_op_ms)
           for op, idx in by_op.items()}
    return dict(sorted(ops.items(), key=lambda kv: -kv[1]["total_ms"])), total


def _op_entry(op: str, calls: list[Call], ms: list[float], total: float, e2e: float) -> dict:
    """One op's entry of the ops section, from its calls and their charged times."""
    spec = opspecs.get(op)
    t = np.array(ms)
    flops = bytes_ = 0
    sites: dict[str, dict] = {}
    phases: dict[str, dict] = {}
    shapes: dict[tuple, dict] = {}
    for c, c_ms in zip(calls, ms):
        shape = dict(c.shape)
        f, b = spec.flops(shape), spec.bytes_moved(shape, getattr(torch, c.dtype))
        flops, bytes_ = flops + f, bytes_ + b
        for group, key in ((sites, c.site), (phases, c.phase)):
            g = group.setdefault(key, {"calls": 0, "total_ms": 0.0})
            g["calls"] += 1
            g["total_ms"] += c_ms
        e = shapes.setdefault(c.shape, {"shape": shape, "calls": 0, "timed_calls": 0, "total_ms": 0.0,
                                        "flops": f, "bytes": b, "dtype": c.dtype, "_layouts": [], "_sites": set()})
        e["calls"] += 1
        e["timed_calls"] += c.timed
        if c.timed and c.ms is not None:
            e["min_ms"] = min(e.get("min_ms", c.ms), c.ms)
            e["max_ms"] = max(e.get("max_ms", c.ms), c.ms)
        e["total_ms"] += c_ms
        e["_layouts"].append(c.layout)
        e["_sites"].add(_layer_free(c.site))
    for s in sites.values():
        s["mean_ms"] = s["total_ms"] / s["calls"]
        s["share"] = s["total_ms"] / total if total else 0.0
    op_ms = float(t.sum())
    return {
        "calls": len(calls),
        "timed_calls": sum(c.timed for c in calls),
        "total_ms": op_ms,
        "mean_ms": float(t.mean()),
        "p50_ms": float(np.percentile(t, 50)),
        "p95_ms": float(np.percentile(t, 95)),
        "share": op_ms / total if total else 0.0,
        "e2e_share": op_ms / e2e if e2e else 0.0,
        "flops_per_call": flops / len(calls),
        "bytes_per_call": bytes_ / len(calls),
        "gbps": bytes_ / op_ms / 1e6 if op_ms else 0.0,
        "gflops": flops / op_ms / 1e6 if op_ms else 0.0,
        "phases": phases,
        "sites": sites,
        "shapes": [_shape_entry(e) for e in sorted(shapes.values(), key=lambda e: -e["total_ms"])],
    }


def _shape_entry(e: dict) -> dict:
    """A shape's accumulated entry made final: its sites (layer-free), mean, and the distinct argument layouts."""
    layouts = e.pop("_layouts")
    e["sites"] = sorted(e.pop("_sites"))
    e["mean_ms"] = e["total_ms"] / e["calls"]
    tensors = [[a for a in lay if len(a) == 4] for lay in layouts]
    e["dtypes"] = _distinct([{a[0]: a[1] for a in ts} for ts in tensors])
    e["sizes"] = _distinct([{a[0]: list(a[2]) for a in ts} for ts in tensors])
    e["strides"] = _distinct([{a[0]: list(a[3]) for a in ts} for ts in tensors])
    e["scalars"] = _distinct([{a[0]: a[1] for a in lay if len(a) == 2} for lay in layouts])
    return e


def write(summary: dict, run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=1) + "\n")
    return path


def latest(root: Path = TRACES) -> Path:
    """The newest run directory under `root` that holds a summary.json, links refused: `root` may be a checkout's
    committed traces/, and a summary.json (or run directory) linking out of it had `rank` read and print the file
    it named."""
    if root.is_symlink():
        raise UserError(f"{root}: refused: traces/ is a symlink (autokernel reads the checkout's own traces only; "
                        "pass a trace path to read another)")
    runs = sorted((p for p in root.glob("*/summary.json") if not p.is_symlink() and not p.parent.is_symlink()
                   and p.is_file()), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
    if not runs:
        raise UserError(f"no trace under {root}/: run `autokernel profile` first, or pass a trace path")
    return runs[-1].parent


MAX_DEPTH = 32  # a summary nests ~6 levels; a committed trace is the checkout's data (a nesting bomb is bad input)


def _clean(value, depth: int = 0):
    """The JSON with every string (keys too) cut to printable text (autokernel/untrusted.py `plain`): a trace may
    be a checkout's committed file, and every reader shows its names and notes (a terminal escape in a run id
    retitled the terminal and cleared the screen under `rank`)."""
    if depth > MAX_DEPTH:
        raise RecursionError
    if isinstance(value, str):
        return plain(value)
    if isinstance(value, list):
        return [_clean(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {plain(k): _clean(v, depth + 1) for k, v in value.items()}
    return value


MAX_TRACE_BYTES = 64 << 20  # a summary.json read whole (a checkout's committed one included): bounded memory


def load_trace(path: str | Path, check_device: bool = True) -> Trace:
    """A trace's summary from its run directory or its summary.json. Refuses other schemas (a file without one is
    schema 1, as hand-written shape lists are) and, unless told otherwise, traces taken on another kind of device
    (their times mean nothing here; their shapes do: `cases` readers pass check_device=False)."""
    path = Path(path)
    file = path / "summary.json" if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"{path}: no such trace (expected a traces/<run-id>/ directory or its summary.json)")
    try:
        if file.stat().st_size > MAX_TRACE_BYTES:
            raise UserError(f"{file}: not a valid trace: {file.stat().st_size} bytes, over the {MAX_TRACE_BYTES} "
                            "a summary.json may have (a profile writes well under 1 MB)")
        with file.open("rb") as f:
            data = f.read(MAX_TRACE_BYTES + 1)
        if len(data) > MAX_TRACE_BYTES:
            raise UserError(f"{file}: not a valid trace: over the {MAX_TRACE_BYTES} bytes a summary.json may have")
        trace = _clean(json.loads(data.decode("utf-8")))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{file}: not a valid trace: not JSON ({e})") from None
    except RecursionError:
        raise UserError(f"{file}: not a valid trace: nested deeper than {MAX_DEPTH} levels") from None
    except OSError as e:
        raise UserError(f"{file}: cannot read the trace ({e.strerror})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("ops"), dict):
        raise UserError(f"{file}: not an autokernel trace summary (no 'ops' mapping)")
    if trace.setdefault("schema", SCHEMA) != SCHEMA:
        raise UserError(f"{file}: trace schema {trace['schema']!r}, this autokernel reads schema {SCHEMA}: "
                        f"re-run `autokernel profile`")
    if check_device:
        here, there = device.fingerprint(), trace.get("device") or {}
        if there.get("kind") != here["kind"] or there.get("gpu") != here.get("gpu"):
            raise UserError(f"{file}: trace taken on {_device_name(there)}, this machine is {_device_name(here)}: "
                            f"re-run `autokernel profile` here")
    trace["_path"] = str(file)
    return cast(Trace, trace)  # JSON: checked above only as far as every reader relies on


def _device_name(fp: dict) -> str:
    return f"{fp.get('kind', '?')} ({fp.get('gpu') or fp.get('cpu') or 'unknown'})"


def cases(trace: Trace, op: str) -> list[dict]:
    """The op's shape corpus, [{"shape": {...}, "calls": n, "dtype": str | None}], most time first: the shapes the
    live engine called it with, which the gate checks and the benchmark weights by calls. UserError (naming the file
    and the field) for an unknown op, an op the run never called, or a malformed entry."""
    if op not in opspecs.OPS:
        raise UserError(f"unknown op {op!r}; known ops: {', '.join(opspecs.OPS)}")
    where = trace.get("_path", "the trace")
    entry = trace["ops"].get(op)
    entries = entry.get("shapes") if isinstance(entry, dict) else None
    if not entries or not isinstance(entries, list):
        raise UserError(f"{where}: no shapes recorded for op '{op}' (expected ops.{op}.shapes)")
    out = []
    for k, e in enumerate(entries):
        shape = e.get("shape") if isinstance(e, dict) else None
        if not isinstance(shape, dict) or not shape or not all(type(v) is int for v in shape.values()):
            raise UserError(f"{where}: ops.{op}.shapes[{k}].shape must be a mapping of dimension names to integers")
        calls = e.get("calls", 1)
        if type(calls) is not int or calls < 1:
            raise UserError(f"{where}: ops.{op}.shapes[{k}].calls must be a positive integer")
        dtype = e.get("dtype")
        out.append({"shape": dict(shape), "calls": calls,
                    "dtype": dtype.removeprefix("torch.") if isinstance(dtype, str) else None})
    return out


def shapes(trace: Trace, op: str) -> list[dict]:
    """The distinct shapes of `cases`, in its order (what `autokernel verify --trace` checks)."""
    return _distinct([c["shape"] for c in cases(trace, op)])
