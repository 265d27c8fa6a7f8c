"""Sandbox side of the end-to-end stage: the engine with one op swapped for the candidate. Trusted harness code.

One pass per engine, the same for the baseline (autokernel/gate/e2e.py, in the parent) and the candidate (here, in
the sandbox): a batched prefill of the prompts that keeps every position's logits, then greedy decode steps with the
KV cache, one token per row and step, each step's logits kept. While a row's greedy tokens equal the baseline's,
its logits are exactly teacher-forced ones (same prefix), so one pass gives the KL positions and the free-running
tokens the repetition guard reads (autokernel/gate/e2e.py judges which positions compare). Greedy decoding never
samples, so a sampled pass follows where the parent asks for it (sampled): the engine's own sampler on every step's
logits, which is where an op like softmax is called.
"""
from __future__ import annotations

import io
from pathlib import Path

import torch

from autokernel.engine.generate import left_pad

_save, _BytesIO = torch.save, io.BytesIO  # bound at import, before any candidate code runs


def layer_of(site: str) -> int | None:
    """The layer index of a call site ("blk.7.attn_q.weight" -> 7); None for sites outside the layers (the
    embedding, the final norm, the logits head)."""
    head, _, rest = site.partition(".")
    num = rest.partition(".")[0]
    return int(num) if head == "blk" and num.isdigit() else None


def decode(eng, rows: list[list[int]], new_tokens: int, on_phase=None,
           steps: list[torch.Tensor] | None = None) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy continuation of each prompt row (up to `new_tokens` tokens, a stop token ends a row) and, per row, the
    float32 logits (n_b, V) of its real positions: the prompt's positions (the last one predicts new token 1), then
    one per decode step the row was live in (the step fed new token j predicts token j + 1). on_phase(name) is
    called with "prefill" and "decode" as each begins (the parent's call counter and clock). `steps`, if given,
    receives the (B, V) logits each token was picked from, as generate() hands them to its sampler (sampled)."""
    m, tok = eng.model, eng.tokenizer
    ids, kv_start = left_pad(rows, tok.pad_id, m.device)
    B, P = ids.shape
    cache = m.new_cache(B, P + new_tokens)
    if on_phase:
        on_phase("prefill")
    first = m.forward(ids, cache, kv_start, all_logits=True).float().cpu()  # (B, P, V)
    out = [[first[b, P - len(r):]] for b, r in enumerate(rows)]
    new: list[list[int]] = [[] for _ in rows]
    done = [False] * B
    last = first[:, -1]
    if on_phase:
        on_phase("decode")
    for step in range(new_tokens):
        if steps is not None:
            steps.append(last)
        nxt = last.argmax(-1)
        for b in range(B):
            if not done[b]:
                t = int(nxt[b])
                done[b] = t in tok.stop_ids
                if not done[b]:
                    new[b].append(t)
        if all(done) or step == new_tokens - 1:
            break
        feed = torch.tensor([tok.pad_id if done[b] else new[b][-1] for b in range(B)], dtype=torch.int64)
        last = m.forward(feed[:, None].to(m.device), cache, kv_start).float().cpu()  # (B, V)
        for b in range(B):
            if not done[b]:
                out[b].append(last[b:b + 1])
    return new, [torch.cat(o) for o in out]


def sampled(eng, steps: list[torch.Tensor], temperature: float, seed: int, on_phase=None) -> str:
    """The sampled pass: the engine's own sampler (autokernel.engine.generate.pick: softmax of logits / temperature,
    then a draw) on the logits of every step of the greedy pass, as generate() hands them over. Its draws are thrown
    away (the greedy pass's tokens are what the stage compares); it runs so that an op only sampling calls (softmax)
    is called by the live engine on the model's real logits, and judged (Capture). Returns "" or, when a draw
    failed on what the op returned (NaN probabilities), the error: the call itself was captured and is judged."""
    from autokernel.engine.generate import Sampling, pick
    if on_phase:
        on_phase("sample")
    gen = torch.Generator().manual_seed(seed)
    for logits in steps:
        try:
            pick(eng.model, logits, Sampling(temperature=temperature), gen)
        except RuntimeError as e:
            return f"{type(e).__name__}: {e}"[:200]
    return ""


CAPTURE_BYTES = 64 << 20  # the most input and output bytes of the candidate's calls returned for judging


def _copy(x):
    """A detached CPU copy of a call's tensor (or a plain value as it is), taken by the harness around the call."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, (tuple, list)):
        return [_copy(v) for v in x]
    return x


def _nbytes(x) -> int:
    """The tensor bytes in a value _copy made."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    return sum(map(_nbytes, x)) if isinstance(x, list) else 0


class Capture:
    """Some of the candidate's calls in the live engine, exactly as production makes them (the engine's tensor
    layouts, ranks and dtypes, real activations): the arguments before the call and its outputs, for the parent to
    judge each one as the numeric stage judges (autokernel/gate/e2e.py). Which calls: the first one of each phase,
    the first one of every call site in each of `site_phases` (the parent's choice: the decode steps, whose calls
    are the smallest and reach every site the candidate runs at; a shortcut on one site, the final norm told apart
    by its weights, is judged wherever it hides), and then each other call with probability `p`, drawn from the
    parent's secret seed, until CAPTURE_BYTES. The firsts are always kept: their bytes are bounded by the engine's
    call sites, one call each."""

    def __init__(self, seed: int, p: float, site_phases: tuple[str, ...] = ()):
        import random
        self.rng, self.p, self.bytes = random.Random(seed), p, 0
        self.calls: list[list[object]] = []  # [phase, site, arguments before, outputs]
        self.phases: set[str] = set()
        self.site_phases = frozenset(site_phases)
        self.sites: set[tuple[str, str]] = set()  # (phase, site)

    def __call__(self, phase: str, site: str, fn, args):
        first = phase not in self.phases
        self.phases.add(phase)
        if phase in self.site_phases and (phase, site) not in self.sites:
            self.sites.add((phase, site))
            first = True
        if not first and (self.bytes > CAPTURE_BYTES or not self.rng.random() < self.p):
            return fn(*args)
        before = _copy(list(args))
        out = fn(*args)
        after = _copy(out)
        self.bytes += _nbytes(before) + _nbytes(after)
        self.calls.append([phase, site, before, after])
        return out


def route(eng, op: str, sites: list[str] | None, capture: Capture | None = None, phase: str = ""):
    """Run the candidate (the engine's launcher for `op`) only at `sites` (None: everywhere), the op's torch
    reference at its other call sites: the part of the model the stage's time plan (autokernel/gate/e2e.py plan) has
    room for under the CPU interpreter. The candidate cannot tell which: every layer calls it with the same shapes.
    `capture` keeps some of the candidate's calls for the parent to judge."""
    from autokernel.engine.optable import load_launcher
    reference, keep = load_launcher(op, "reference"), None if sites is None else frozenset(sites)

    def observe(name, site, fn, args):
        if name != op:
            return fn(*args)
        if keep is not None and site not in keep:
            return reference(*args)
        return capture(phase, site, fn, args) if capture is not None else fn(*args)
    eng.model.ops.observer = observe


def run(payload: dict, inputs: Path) -> dict:
    """Sandbox entry: the candidate is payload["candidate"] in the read-only `inputs` directory; payload["sites"]
    ({"prefill": [...], "decode": [...]}; absent: every call site) says where it runs in each phase. The logits are
    returned as torch.save bytes, one (sum n_b, V) tensor and the rows' n_b; the parent loads them weights-only and
    checks them against the token lists (autokernel.sandbox: results travel through the pipe)."""
    from autokernel import kernel_loader
    kernel_loader.neutral_process()  # the same argv and env keys as the numeric job; imports kernels (interpreter)
    from autokernel.engine import open_engine
    op = payload["op"]
    from autokernel.gate.coverage_probe import untimed_autotune
    untimed_autotune(op)
    eng = open_engine(payload["model"], kernels=payload["backend"], weights=payload["weights"],
                      overrides={**payload.get("others", {}), op: str(Path(inputs) / payload["candidate"])})
    sites = payload.get("sites")
    capture = Capture(payload["capture_seed"], payload["capture_p"], tuple(payload.get("site_phases", ()))) \
        if "capture_seed" in payload else None

    def on_phase(name):  # the sampled pass runs the candidate at every sampling site: the plan cuts layers only
        route(eng, op, None if sites is None else sites.get(name), capture, name)
    sample = payload.get("sample")
    steps: list[torch.Tensor] = []
    new, logits = decode(eng, payload["prompts"], payload["new_tokens"], on_phase, steps if sample else None)
    sample_error = sampled(eng, steps, float(sample["temperature"]), int(sample["seed"]), on_phase) if sample else ""
    snap, calls = _BytesIO(), _BytesIO()
    _save(torch.cat(logits), snap)
    _save(capture.calls if capture is not None else [], calls)
    return {"new": new, "lengths": [int(x.shape[0]) for x in logits], "logits": snap.getvalue(),
            "calls": calls.getvalue(), "sample_error": sample_error}
