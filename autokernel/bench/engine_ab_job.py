"""One arm of the engine A/B, one fresh process: sandbox entry `autokernel.bench.engine_ab_job:run` (the parent is
autokernel/bench/engine_ab.py).

The job loads the engine with ONE file in the op's slot, the incumbent or the candidate (inputs/<op>.py: the same
name whichever it is, as the end-to-end stage's job loads it, autokernel/gate/e2e_child.py), runs a fixed workload
and returns raw figures: the prefill's time and each decode step's time. It decides nothing: the parent picks the
clock by the device it knows, checks the figures and computes every statistic.

The workload: the policy's first e2e prompt cut to `prompt_tokens` tokens, one batched prefill, then `decode_steps`
greedy steps with the KV cache. A stop token does not end it (every arm does the same number of forwards); the
greedy tokens come back so that the parent can say whether the arms generated the same text. Before the timed
pass, one untimed prefill and decode step (the interpreter's and driver's lazy set-up, autotuning).

Clocks, per forward, bound when this module is imported, before the kernel file exists in the process (as in
autokernel/bench/job.py, which explains them): `cpu_ms`, the process's CPU time (getrusage, all threads), the
verdict's clock under the CPU interpreter; `wall_ms`, the monotonic clock around the same forward, after
torch.cuda.synchronize() where there is a GPU (the verdict's clock there). What a file could still do to its own
figures (introspect this module: the static gate's ban list) only flatters its own arm, never slows the other: each
arm is its own process.
"""
from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

import torch

_perf_ns = time.perf_counter_ns
_rusage = resource.getrusage
_SELF = resource.RUSAGE_SELF
_sync = torch.cuda.synchronize
PROCESS = os.urandom(8).hex()  # this process's own: the parent holds every job to a fresh one (two equal: one process)


def _cpu_ns() -> int:
    r = _rusage(_SELF)
    return int((r.ru_utime + r.ru_stime) * 1e9)


def _timed(fn, cuda: bool):
    """(fn(), {clock: ms}) for one forward."""
    if cuda:
        _sync()
    w0, c0 = _perf_ns(), _cpu_ns()
    out = fn()
    if cuda:
        _sync()
    c1, w1 = _cpu_ns(), _perf_ns()
    return out, {"cpu_ms": (c1 - c0) / 1e6, "wall_ms": (w1 - w0) / 1e6}


def _pass(eng, prompt: list[int], steps: int, cuda: bool, phase: list[str] | None = None
          ) -> tuple[list[int], dict, list[dict]]:
    """A prefill of `prompt` and `steps` greedy decode steps: (tokens, prefill clocks, each step's clocks).
    `phase`, if given, holds the name of the phase running ("prefill", "decode") for an observer to read."""
    from autokernel.engine.generate import left_pad
    m = eng.model
    phase = phase if phase is not None else [""]
    x, kv_start = left_pad([prompt], eng.tokenizer.pad_id, m.device)  # (1, P)
    cache = m.new_cache(1, x.shape[1] + steps + 1)
    phase[0] = "prefill"
    last, pre = _timed(lambda: m.forward(x, cache, kv_start), cuda)  # (1, V)
    tokens, clocks = [], []
    phase[0] = "decode"
    for _ in range(steps):
        t = int(last.float().argmax(-1)[0])
        tokens.append(t)
        feed = torch.tensor([[t]], dtype=torch.int64, device=m.device)
        last, ms = _timed(lambda f=feed: m.forward(f, cache, kv_start), cuda)
        clocks.append(ms)
    return tokens, pre, clocks


def run(payload: dict, inputs: Path) -> dict:
    """Sandbox entry. payload: op, model, backend, weights, prompt_text (cut to its first prompt_tokens tokens),
    decode_steps, others ({op: path} on CUDA: the checkout's other kernels). Returns {"process", "device", "prompt",
    "op_calls" (the op's calls in the warm-up's prefill and its decode step), "tokens", "prefill": {clock: ms},
    "steps": [{clock: ms}]}."""
    from autokernel import kernel_loader
    kernel_loader.neutral_process()  # the same argv and env keys as every kernel job; imports kernels (interpreter)
    from autokernel.engine import open_engine
    from autokernel.gate.coverage_probe import untimed_autotune
    op = payload["op"]
    untimed_autotune(op)
    eng = open_engine(payload["model"], kernels=payload["backend"], weights=payload["weights"],
                      overrides={**payload.get("others", {}), op: str(Path(inputs) / f"{op}.py")})
    cuda = torch.cuda.is_available()
    prompt = eng.encode_prompt(payload["prompt_text"])[:int(payload["prompt_tokens"])]
    calls, phase = {"prefill": 0, "decode": 0}, [""]

    def count(name, site, fn, args):
        calls[phase[0]] += name == op
        return fn(*args)
    eng.model.ops.observer = count  # the warm-up only: the timed pass runs with no observer
    _pass(eng, prompt, 1, cuda, phase)  # warm-up: lazy set-up, autotuning, the interpreter's first rewrite of kernels
    eng.model.ops.observer = None
    tokens, pre, steps = _pass(eng, prompt, int(payload["decode_steps"]), cuda)
    return {"process": PROCESS, "device": "cuda" if cuda else "cpu", "prompt": prompt, "op_calls": calls,
            "tokens": tokens, "prefill": pre, "steps": steps}


if __name__ == "__main__":  # not a script
    sys.exit("autokernel.bench.engine_ab_job is a sandbox entry, run by autokernel.bench.engine_ab")
