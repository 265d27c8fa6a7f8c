"""`autokernel profile`: replay a workload on the live engine under torch.profiler and write traces/<run-id>/.

The run: for each batch of prompts, one left-padded prefill, then `decode_steps` decode forwards (stop tokens
ignored, so every run does the same work). Every op call goes through the Recorder (recorder.py); torch.profiler
records the ranges for the Chrome trace and, on CUDA, the device kernels inside them.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import shutil
import time
from pathlib import Path

import torch

from autokernel.errors import UserError

# The interpreter: after 2 timed calls of one (op, shape) later ones are charged their mean (recorder.py). Two
# because repeated calls of one shape agree within ~10 % even on a loaded 2-core machine (matmul_q4_1 M=96 N=1536:
# 3.13, 3.10, 3.89 s; each shape's min_ms/max_ms in the trace shows the spread), while every extra sample of the
# default workload's prefill shapes costs ~10 s there.
CPU_TIMED_PER_SHAPE = 2


def drive(eng, wl, rec) -> dict:
    """Run the workload's batches; returns token counts and wall times."""
    from autokernel.engine.generate import Sampling, left_pad, pick
    model, tok = eng.model, eng.tokenizer
    sampling = Sampling(temperature=wl.temperature, seed=wl.seed)
    gen = torch.Generator(device="cpu").manual_seed(wl.seed) if wl.temperature > 0 else None
    counts = {"batches": 0, "prefill_tokens": 0, "padded_prefill_tokens": 0, "decode_tokens": 0,
              "prefill_ms": 0.0, "decode_ms": 0.0}
    ctx = model.cfg.context_length
    for batch in wl.batches():
        rows = [eng.encode_prompt(p, wl.chat) for p in batch]
        longest = max(len(r) for r in rows)
        if longest + wl.decode_steps + 1 > ctx:
            raise UserError(f"workload prompt of {longest} tokens + {wl.decode_steps} decode steps exceeds the "
                            f"model's context of {ctx}: shorten the prompt or lower decode_steps")
        ids, kv_start = left_pad(rows, tok.pad_id, model.device)
        B = ids.shape[0]
        cache = model.new_cache(B, ids.shape[1] + wl.decode_steps + 1)
        rec.phase = "prefill"
        t0 = time.perf_counter()
        logits = model.forward(ids, cache, kv_start)
        _sync()
        t1 = time.perf_counter()
        rec.phase = "decode"
        for _ in range(wl.decode_steps):
            nxt = pick(model, logits.float().cpu() if gen is not None else logits, sampling, gen)
            logits = model.forward(nxt.to(model.device)[:, None], cache, kv_start)
        _sync()
        t2 = time.perf_counter()
        counts["batches"] += 1
        counts["prefill_tokens"] += sum(len(r) for r in rows)
        counts["padded_prefill_tokens"] += ids.numel()
        counts["decode_tokens"] += B * wl.decode_steps
        counts["prefill_ms"] += (t1 - t0) * 1e3
        counts["decode_ms"] += (t2 - t1) * 1e3
    return counts


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_id(tag: str) -> str:
    """Sortable by time, unique by a short hash of what ran and when."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    digest = hashlib.sha256(f"{time.time_ns()}|{os.getpid()}|{tag}".encode()).hexdigest()[:6]
    return f"{stamp}-{digest}"


def profile(workload_path: str | Path | None = None, kernels: str = "triton", weights: str = "quant",
            model_path: str | Path | None = None, out: str | Path = "traces", py_spy: bool = False,
            timed_per_shape: int | None = -1) -> Path:
    """Profile one workload; returns the run directory. `timed_per_shape` -1 means the device's default
    (every call on CUDA, CPU_TIMED_PER_SHAPE on the interpreter), None or 0 means every call."""
    from autokernel import device
    device.ensure_interpreter()  # before triton is first imported (the engine's kernels, the roofline's fingerprint)
    from autokernel.bench import roofline
    from autokernel.engine import open_engine
    from autokernel.profile import trace, workload
    from autokernel.profile.recorder import Recorder

    wl, _text, sha = workload.load(workload_path)
    fp = device.fingerprint()
    cuda = fp["kind"] == "cuda"
    if timed_per_shape == -1:
        timed_per_shape = None if cuda else CPU_TIMED_PER_SHAPE
    timed_per_shape = timed_per_shape or None
    eng = open_engine(model_path, kernels=kernels, weights=weights)
    rec = Recorder(cuda, timed_per_shape)
    rid = run_id(f"{sha}|{kernels}|{weights}|{model_path}")
    run_dir = Path(out) / rid
    run_dir.mkdir(parents=True, exist_ok=False)
    counts, wall_ms, spy, sources = _record(eng, wl, rec, run_dir, cuda, py_spy)

    observer_ms = rec.observer_s * 1e3
    # time outside op calls: on CPU the wall minus what the calls actually took (references and warm-ups included);
    # on CUDA the wall minus device op time and warm-up compiles (launch gaps count as outside)
    non_op_ms = (max(0.0, wall_ms - rec.warmup_s * 1e3 - sum(trace.charged_ms(rec.calls))) if cuda
                 else max(0.0, wall_ms - observer_ms))
    ops_section, total_op_ms = trace.summarize(rec.calls, non_op_ms)
    summary = {
        "schema": trace.SCHEMA,
        "run_id": rid,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": fp,
        "kernels": kernels,
        "weights": weights,
        "model": {"path": str(eng.gguf.path), **dataclasses.asdict(eng.model.cfg), "dtype": str(eng.model.dtype)},
        "workload": {"name": wl.name, "path": str(workload_path or workload.DEFAULT), "sha256": sha,
                     "spec": wl.model_dump()},
        "timing": _timing(rec, sources, cuda, timed_per_shape),
        "totals": {"total_op_ms": total_op_ms, "non_op_ms": non_op_ms, "e2e_ms": total_op_ms + non_op_ms,
                   "wall_ms": wall_ms, "observer_ms": observer_ms, "calls": len(rec.calls), **counts,
                   **_decode_rate(rec, ops_section, counts)},
        "total_op_ms": total_op_ms,
        "roofline": roofline.describe(fp),  # the benchmark's peaks: rank's headroom and bench's % of peak agree
        "files": {"chrome_trace": "trace.json", "py_spy": spy.get("raw") if spy else None},
        "py_spy": spy,
        "ops": ops_section,
    }
    trace.write(summary, run_dir)
    return run_dir


def _record(eng, wl, rec, run_dir: Path, cuda: bool, py_spy: bool) -> tuple[dict, float, dict | None, dict]:
    """Drive the workload under torch.profiler with `rec` observing every op call (and py-spy sampling, if asked);
    writes the Chrome trace. Returns (token and phase counts, wall ms, py-spy's summary, timing sources). A failed
    run leaves no half-written run directory for `rank` to pick up as the latest."""
    from autokernel.profile.pyspy import Sampler
    eng.model.ops.observer = rec
    sampler = Sampler(run_dir / "pyspy.txt") if py_spy else None
    if sampler is not None:
        sampler.start()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    try:
        with torch.profiler.profile(activities=activities) as prof:
            t0 = time.perf_counter()
            counts = drive(eng, wl, rec)
            wall_ms = (time.perf_counter() - t0) * 1e3
    except BaseException:
        if sampler is not None:
            sampler.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    finally:
        eng.model.ops.observer = None
    spy = sampler.stop() if sampler is not None else None
    sources = rec.finish(prof)
    prof.export_chrome_trace(str(run_dir / "trace.json"))
    return counts, wall_ms, spy, sources


def _timing(rec, sources: dict, cuda: bool, timed_per_shape: int | None) -> dict:
    """The summary's `timing` section: where the times come from and what they mean on this device."""
    timed = sum(c.timed for c in rec.calls)
    return {
        "source": max(sources, key=lambda s: sources[s]) if sources else "none",
        "sources": sources,
        "label": "CUDA device time" if cuda else "CPU / Triton interpreter",
        "timed_calls_per_shape": timed_per_shape,
        "timed_calls": timed,
        "extrapolated_calls": len(rec.calls) - timed,
        "note": ("device kernel time inside each op's record_function range" if cuda else
                 "wall time of each call through the Triton interpreter: correctness-only timings, never a "
                 "GPU speed claim" + (f"; after {timed_per_shape} timed calls of a shape, later calls ran the "
                                      f"torch reference and are charged the shape's mean" if timed_per_shape
                                      else "")),
    }


def _decode_rate(rec, ops_section: dict, counts: dict) -> dict:
    """Decode tokens per second. With sampling the wall is not the engine's: decode time is then the decode calls'
    charged times."""
    sampled = sum(c.timed for c in rec.calls) < len(rec.calls)
    decode_op_ms = sum(e["phases"].get("decode", {}).get("total_ms", 0.0) for e in ops_section.values())
    decode_s = (decode_op_ms if sampled else counts["decode_ms"]) / 1e3
    return {"decode_op_ms": decode_op_ms,
            "decode_tokens_per_s": counts["decode_tokens"] / decode_s if decode_s else None,
            "decode_tokens_per_s_basis": "charged op time (sampled)" if sampled else "wall"}
