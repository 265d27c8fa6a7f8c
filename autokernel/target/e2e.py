"""The end-to-end stage for a target checkout's op: the engine's next-token distributions with the candidate swapped
in, against the engine with its own kernels (policy section e2e: the same thresholds as autokernel's own engine).

Both engines run in the sandbox through the contract's `logits(ids)` (docs/targets.md), each in its own job; the
candidate replaces the op's module before `build()` runs, so every import of it in the engine gets the candidate
(the way a checkout with the file changed would). The baseline job generates greedily from a few fixed prompts;
the candidate job is teacher-forced on the baseline's tokens (per-token KL(baseline || candidate) and top-1
agreement) and generates freely too, for the repeat guard: a run of `repeat_run` identical tokens the baseline did
not have is the symptom of a racing kernel. What comes back is data, checked here.

Both jobs wrap the op's declared launchers (autokernel/target/capture.py). The baseline's count says the engine's
logits() runs the op at all (else the stage could not tell any candidate from the incumbent: exit 2); the
candidate's says its code reached the engine (`e2e.unreached` otherwise: a rewritten file a stale path or another
process never runs would pass with a KL of zero). Some of the candidate's calls (the first of each launcher, then a
random tenth) come back with their arguments and outputs and are judged against the checkout's reference, as the
numeric stage judges a call (`e2e.call_mismatch`): production's own arguments, which the gate's cases only imitate.
"""
from __future__ import annotations

import importlib
import io
import random
import time
from pathlib import Path

from autokernel.errors import UserError
from autokernel.gate.verdict import StageResult
from autokernel.sandbox.channel import load_blob
from autokernel.target import declaration as decl

PROMPT_LENGTHS = (5, 9, 3)  # token ids per prompt: prefill shapes the workload may not have sent
PROMPT_SEED = 0  # the prompts are fixed: a verdict is reproducible, and a baseline is one per checkout
# Of the sandbox's timeout, what the baseline's generation and scoring may take: an engine slow under the interpreter
# (SmolLM2 in transformers: seconds a forward, the contract's logits(ids) recomputes every prefix) runs fewer greedy
# steps, said in the verdict, rather than past the job's limit.
BUDGET_FRACTION = 0.3


def _prompts(vocab: int) -> list[list[int]]:
    r = random.Random(PROMPT_SEED)
    hi = max(2, min(vocab, 1000))
    return [[r.randrange(1, hi) for _ in range(n)] for n in PROMPT_LENGTHS]


def engine_job(payload: dict, inputs) -> dict:
    """Sandbox entry: build the engine (the candidate first loaded as the op's module when payload names one); the
    baseline (no `prompts` given) makes the fixed prompts for the engine's vocabulary, generates `steps` greedy tokens
    from each and returns the logits of every prefix of its own tokens; the candidate gets the baseline's prompts and
    prefixes, and generates freely too."""
    import torch

    from autokernel import device, interp
    from autokernel.target import capture
    from autokernel.target.launches import _failed, run_in
    device.ensure_interpreter()
    interp.install()
    run_in(payload["root"])
    try:
        if payload.get("candidate"):
            mod = capture.load_candidate(payload["module"], Path(inputs) / payload["candidate"])
        else:
            mod = importlib.import_module(payload["module"])
        cap = capture.install(mod, payload["launchers"], payload["outputs"], keep=bool(payload.get("candidate")))
        module, _, fn = payload["build"].partition(":")
        engine = getattr(importlib.import_module(module), fn)()
        with torch.no_grad():
            steps = payload["steps"]
            t0 = time.perf_counter()
            vocab = int(engine.logits([[1]]).shape[-1])
            if not payload.get("prompts"):  # the baseline: as many steps as its budget fits (at least 1)
                per_call = max(time.perf_counter() - t0, 1e-3) * max(PROMPT_LENGTHS)  # a forward grows with length
                steps = max(1, min(steps, int(payload.get("budget_s", 1e9) / (per_call * 2 * len(PROMPT_LENGTHS)))))
            prompts = payload.get("prompts") or _prompts(vocab)
            tokens = []
            for p in prompts:
                ids = list(p)
                for _ in range(steps):
                    ids.append(int(engine.logits([ids])[0].argmax()))
                tokens.append(ids[len(p):])
            prefixes = payload.get("prefixes") or [p + t[:i] for p, t in zip(prompts, tokens) for i in range(steps)]
            forced = engine.logits(prefixes).float()
    except BaseException as e:  # noqa: BLE001 -- the engine's (or the candidate's) failure is reported as data
        return _failed("engine", payload["root"], e)
    buf, kept = io.BytesIO(), io.BytesIO()
    torch.save(forced.detach().cpu().contiguous(), buf)
    torch.save(cap.kept, kept)
    return {"logits": buf.getvalue(), "tokens": tokens, "prompts": prompts, "prefixes": prefixes, "steps": steps,
            "calls": dict(cap.calls), "captured": kept.getvalue(), "unloadable": cap.unloadable}


def _run(root: Path, d: decl.Declaration, op: decl.Op, policy, job_dir: Path, steps: int, base=None,
         candidate: Path | None = None):
    """One engine job: (prompts, tokens, prefixes, logits) checked, or (None, why)."""
    import torch

    from autokernel import device, sandbox
    env = {} if device.is_cuda() else {"TRITON_INTERPRET": "1"}
    payload = {"root": str(root), "build": d.build, "module": decl.module_of(op.file), "steps": steps,
               "launchers": list(op.launchers), "outputs": {k: op.outputs.get(k) for k in op.launchers},
               "budget_s": BUDGET_FRACTION * policy.sandbox.timeout_s,
               "prompts": base["prompts"] if base else None, "prefixes": base["prefixes"] if base else None,
               "candidate": candidate.name if candidate else None}
    res = sandbox.run(engine_job, payload, job_dir, policy.sandbox, pythonpath=[root], env=env,
                      inputs={candidate.name: candidate.read_bytes()} if candidate else None)
    if not res.ok:
        return None, f"{res.reason}: {res.detail}"
    data = res.data if isinstance(res.data, dict) else {}
    if data.get("failed"):
        return None, f"the engine raised: {str(data.get('detail'))[:300]} ({data.get('where') or 'no checkout frame'})"
    try:
        logits = load_blob(data.get("logits"))
    except ValueError as e:  # whatever came back is data
        return None, f"the engine job's logits do not load: {e}"
    out: dict = {k: data.get(k) for k in ("prompts", "tokens", "prefixes")}
    ints = [isinstance(v, list) and all(isinstance(r, list) and all(type(x) is int for x in r) for r in v)
            for v in out.values()]
    got = data.get("steps")
    if base is None and type(got) is int and 1 <= got <= steps:  # the baseline's budget may shorten the run
        steps = got
    if not all(ints) or len(out["tokens"]) != len(out["prompts"]) or any(len(t) != steps for t in out["tokens"]):
        return None, "the engine job returned malformed tokens"
    if type(logits) is not torch.Tensor or logits.dim() != 2 or logits.shape[0] != len(out["prefixes"]):
        return None, "the engine job returned logits of the wrong shape"
    if base is not None and (out["prompts"] != base["prompts"] or out["prefixes"] != base["prefixes"]):
        return None, "the engine job did not run the baseline's prompts"
    calls = data.get("calls")
    if not (isinstance(calls, dict) and all(k in op.launchers and type(v) is int and 0 <= v <= MAX_CALLS
                                            for k, v in calls.items())):
        return None, "the engine job returned malformed launcher counts"
    out["logits"], out["steps"], out["calls"] = logits, steps, sum(calls.values())
    unloadable = data.get("unloadable")
    out["captured"], out["unloadable"] = data.get("captured"), unloadable if type(unloadable) is int and \
        0 <= unloadable <= MAX_CALLS else None
    return out, ""


MAX_CALLS = 1 << 24  # launcher calls one end-to-end job may report: the count reaches the commit message and the PR
# body, so a number the engine chose is bounded (an 87-digit count carried CI's token out, decimal-encoded)


def check(root: Path, d: decl.Declaration, op: decl.Op, candidate: Path, policy) -> StageResult:
    import torch
    e = policy.e2e
    steps = 2 * e.repeat_run
    job_dir = candidate.parent / "e2e"
    base, why = _run(root, d, op, policy, job_dir / "baseline", steps)
    if base is None:
        raise UserError(f"{d.build}: the engine with its own kernels failed in the end-to-end job: {why}")
    if not base["calls"]:
        raise UserError(f"{d.build}: the engine's logits() never called {', '.join(op.launchers)} of {op.file} in the "
                        "end-to-end job: its KL could not tell the candidate from the incumbent; make logits() run "
                        "the op (docs/targets.md)")
    got, why = _run(root, d, op, policy, job_dir / "candidate", base["steps"], base, candidate)
    if got is None:
        return StageResult.fail("e2e", "e2e.engine_error", f"the engine with the candidate: {why}")
    if not got["calls"]:
        return StageResult.fail("e2e", "e2e.unreached", f"the engine with the candidate swapped in never called its "
                                f"{', '.join(op.launchers)} (the incumbent's were called {base['calls']} times): the "
                                "candidate's code did not reach the engine")
    judged, why = _judge_calls(root, op, got, job_dir, policy)
    if got["logits"].shape != base["logits"].shape:
        return StageResult.fail("e2e", "e2e.bad_output", f"logits {tuple(got['logits'].shape)}, the baseline's "
                                                         f"{tuple(base['logits'].shape)}")
    lp, lq = torch.log_softmax(base["logits"].double(), -1), torch.log_softmax(got["logits"].double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).clamp(min=0)
    top1 = float((base["logits"].argmax(-1) == got["logits"].argmax(-1)).double().mean())
    runs = [_longest_run(t) for t in got["tokens"]]
    base_runs = [_longest_run(t) for t in base["tokens"]]
    n = len(base["prefixes"])
    metrics = {"kl_mean": float(kl.mean()), "kl_p99": float(torch.quantile(kl, 0.99)), "kl_max": float(kl.max()),
               "top1": top1, "tokens": n, "repeat_runs": runs, "baseline_repeat_runs": base_runs,
               "calls_judged": judged, "calls": got["calls"],
               "calls_unloadable": got["unloadable"] if type(got["unloadable"]) is int else None}
    line = (f"{judged} of the candidate's {got['calls']} calls in the engine judged against the reference; "
            f"{n} teacher-forced tokens: KL mean {metrics['kl_mean']:.2e}, p99 {metrics['kl_p99']:.2e}, "
            f"max {metrics['kl_max']:.2e} nats; top-1 {top1:.3f}; longest repeat run {max(runs)} "
            f"(baseline {max(base_runs)})")
    # written to fail on NaN (logits a candidate made NaN): every comparison with NaN is false
    if not (metrics["kl_mean"] <= e.kl_mean_max and metrics["kl_p99"] <= e.kl_p99_max
            and metrics["kl_max"] <= e.kl_max_max):
        return StageResult.fail("e2e", "e2e.kl_exceeded", line, **metrics)
    if not top1 >= e.top1_min:
        return StageResult.fail("e2e", "e2e.top1", line, **metrics)
    if any(c >= e.repeat_run and b < e.repeat_run for c, b in zip(runs, base_runs)):
        return StageResult.fail("e2e", "e2e.degenerate_repetition", line, **metrics)
    if why:  # the model-level checks first: a wrong model is reported as such (as autokernel/gate/e2e.py does)
        return StageResult.fail("e2e", "e2e.call_mismatch", why, **metrics)
    short = "" if base["steps"] >= e.repeat_run else (
        f"; only {base['steps']} greedy token(s) per prompt fit the job's time under the interpreter: the repeat "
        f"guard ({e.repeat_run} in a row) NOT CHECKED")
    return StageResult.ok("e2e", line + " (the checkout's engine, its workload's other kernels as they are)" + short,
                          **metrics)


def _judge_calls(root: Path, op: decl.Op, got: dict, job_dir: Path, policy) -> tuple[int, str]:
    """The candidate's calls the engine job kept (autokernel/target/capture.py), each judged as the numeric stage
    judges a call: against the checkout's reference on the same arguments, run in a sandboxed job of its own per
    launcher (contract.ReferenceTable), compared by compare_outputs. (calls judged, "") or (k, why) for the first
    that fails. What came back is untrusted data: malformed is a failure, never a pass."""
    import torch

    from autokernel.ops import tolerance
    from autokernel.target import contract
    try:
        kept = load_blob(got["captured"])
    except ValueError as e:  # missing or unreadable: either way no calls
        return 0, f"the candidate engine returned no readable calls ({e})"
    if not isinstance(kept, list):
        return 0, "the candidate engine returned no list of calls"
    ok = kept and all(
        isinstance(c, list) and len(c) == 3 and c[0] in op.launchers and isinstance(c[1], dict)
        and all(isinstance(k, str) for k in c[1]) and isinstance(c[2], list)
        and all(type(t) is torch.Tensor for t in c[2]) for c in kept)
    if not ok:
        return 0, "the candidate engine returned no well-formed call of the candidate (its first call is always kept)"
    for launcher in op.launchers:
        mine = [(k, c) for k, c in enumerate(kept) if c[0] == launcher]
        if not mine:
            continue
        table = contract.ReferenceTable(root, op.references[launcher], job_dir / f"reference-{launcher}",
                                        policy.sandbox, op.tolerance)
        table.inplace = decl.named(op.outputs.get(launcher))  # None: the arguments each call changed
        try:
            table.prepare([c[1] for _, c in mine])
            for k, (_, kwargs, outs) in mine:
                refs = table(kwargs)
                j = tolerance.compare_outputs(outs, refs.ref64, refs.eager, None, refs.floors, refs.any_layout,
                                              refs.declared)
                if not j.ok:
                    shapes = ", ".join(f"{n} {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}"
                                       for n, v in kwargs.items() if isinstance(v, torch.Tensor))
                    return k, f"{launcher} call {k} in the engine ({shapes}): {j.reason}: {j.detail}"
        except contract.ReferenceError as e:
            raise UserError(f"[ops.{op.name}] {e}") from None
    return len(kept), ""


def _longest_run(tokens: list[int]) -> int:
    best = run = 0
    prev = None
    for t in tokens:
        run = run + 1 if t == prev else 1
        best, prev = max(best, run), t
    return best
