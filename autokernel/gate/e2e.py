"""End-to-end stage: swap the candidate into the live engine for one op and watch the model itself.

Teacher-forced on the baseline's own tokens (prompt + its greedy continuation), per-token KL(baseline || candidate)
and top-1 agreement; then a free-running greedy generation with a repetition guard (a run of one token where the
baseline had none is the classic signature of a race in an attention or cache kernel). The baseline is the
unmodified engine (trusted, run here and cached); the candidate engine runs only in the sandbox.

Which engine: on CUDA every other op runs its Triton kernel. On CPU every other op runs its torch reference: the
Triton interpreter needs tens of seconds per forward of the full model, and only the swapped op is under test; the
baseline is that same engine with no op swapped.
"""
from __future__ import annotations

import hashlib
import io
import json
import time
from pathlib import Path

import torch

from autokernel import device, sandbox
from autokernel.engine.divergence import Divergence, divergence, longest_run
from autokernel.gate.verdict import StageResult
from autokernel.paths import INSTALLED_LAYOUT
from autokernel.policy import Policy

CACHE = INSTALLED_LAYOUT.sandbox / "cache"


def backend() -> str:
    """The implementation of every op other than the one under test (see the module docstring)."""
    return "triton" if device.is_cuda() else "reference"


def _others(kernels_dir: Path | None, skip: str | None = None) -> dict[str, str]:
    """On CUDA, the target checkout's kernels (autokernel.paths) for every other op, when that is not the installed
    project: the engine around the candidate is the one the commit will land in. On CPU every other op runs its
    reference (module docstring), so there is nothing to swap."""
    installed = INSTALLED_LAYOUT.kernels.resolve()
    if backend() != "triton" or kernels_dir is None or Path(kernels_dir).resolve() == installed:
        return {}
    from autokernel.ops import OPS
    files = {o: Path(kernels_dir) / f"{o}.py" for o in OPS if o != skip}
    return {o: str(f) for o, f in files.items() if f.is_file()}


def _key(policy: Policy, kernels_dir: Path | None = None) -> str:
    from autokernel.engine.gguf_model import embedded_model_path
    model = Path(policy.target.model) if policy.target.model else embedded_model_path()
    h = hashlib.sha256()
    h.update(json.dumps(["calls-v2", str(model), model.stat().st_size, policy.target.weights, policy.e2e.prompts,
                         policy.e2e.max_new_tokens, backend(), device.kind()]).encode())
    for f in sorted(Path(kernels_dir or INSTALLED_LAYOUT.kernels).glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def baseline(policy: Policy, kernels_dir: Path | None = None) -> dict:
    """The unmodified engine's greedy continuations, teacher-forced logits and noise floor (cached on disk)."""
    path = CACHE / f"e2e-{_key(policy, kernels_dir)}.pt"
    if path.exists():
        return torch.load(path, weights_only=True)
    from autokernel.engine import open_engine
    from autokernel.gate.e2e_child import greedy, teacher_forced
    t0 = time.perf_counter()
    eng = open_engine(policy.target.model, kernels=backend(), weights=policy.target.weights,
                      overrides=_others(kernels_dir) or None)
    calls: dict[str, dict[str, int]] = {}  # op -> shape -> calls in the job's workload (sizes its time limit)
    eng.model.ops.observer = _counter(calls)
    rows = [eng.encode_prompt(p) for p in policy.e2e.prompts]
    new = greedy(eng, rows, policy.e2e.max_new_tokens)
    seqs = [r + n for r, n in zip(rows, new)]
    logits, mask = teacher_forced(eng, seqs)
    eng.model.ops.observer = None
    model_s = time.perf_counter() - t0
    # noise floor: the same engine, each sequence alone instead of batched (different padding, same math)
    alone = [teacher_forced(eng, [s])[0][0] for s in seqs]
    T = logits.shape[1]
    floor = _div_rows(logits, mask, [torch.nn.functional.pad(a, (0, 0, T - a.shape[0], 0)) for a in alone])
    out = {"seqs": seqs, "prompt_lens": [len(r) for r in rows], "new": new, "logits": logits, "mask": mask,
           "floor": torch.tensor([floor.kl_mean, floor.kl_p99, floor.kl_max, floor.top1]), "calls": calls,
           "model_s": model_s}
    CACHE.mkdir(parents=True, exist_ok=True)
    torch.save(out, path)
    return out


def _counter(calls: dict[str, dict[str, int]]):
    """An OpTable observer that counts each op's calls by shape (autokernel.ops specs' shape_of)."""
    from autokernel.ops import get

    def observe(op, site, fn, args):
        key = ",".join(f"{k}={v}" for k, v in get(op).shape_of(*args).items())
        calls.setdefault(op, {})[key] = calls.setdefault(op, {}).get(key, 0) + 1
        return fn(*args)
    return observe


def _shape(key: str) -> dict[str, int]:
    return {k: int(v) for k, v in (kv.split("=") for kv in key.split(","))}


def job_limits(op: str, policy: Policy, base: dict, measured: dict | None):
    """The e2e job's limits: the policy's sandbox limits, the wall clock stretched to gate.e2e_timeout_factor times
    the predicted time when that is longer. Predicted: the baseline engine's own time plus the op's calls in the
    job's workload (counted when the baseline ran) times the candidate's per-call time as the numeric stage
    measured it (autokernel.gate.numeric.per_call_model: pessimistic by design).
    A slow but correct candidate under the CPU interpreter must not fail on the clock (sandbox.timeout)."""
    limits = policy.sandbox
    call_s = (measured or {}).get("call_s")
    counts = base.get("calls", {}).get(op) if isinstance(base.get("calls"), dict) else None
    if not isinstance(call_s, dict) or not call_s or not counts:
        return limits, None
    from autokernel.gate.numeric import per_call_model
    from autokernel.ops import get
    per_call = per_call_model(get(op), {k: (_shape(k), float(t)) for k, t in call_s.items()})
    predicted = float(base.get("model_s", 0.0)) + sum(n * per_call(_shape(k)) for k, n in counts.items())
    need = policy.gate.e2e_timeout_factor * predicted
    if need <= limits.timeout_s:
        return limits, predicted
    return limits.model_copy(update={"timeout_s": need, "cpu_s": max(limits.cpu_s, int(2 * need))}), predicted


def _div_rows(logits: torch.Tensor, mask: torch.Tensor, other_rows: list[torch.Tensor]) -> Divergence:
    return divergence(logits, torch.stack(other_rows), mask)


def _returned(data: dict, base: dict) -> tuple[torch.Tensor | None, list, str]:
    """The job's logits and greedy tokens, type-checked against what the parent asked for (the child's data is
    untrusted: the expected shape is the baseline's, never one the child reports); (None, [], why) if malformed."""
    try:
        logits = torch.load(io.BytesIO(data["logits"]), weights_only=True)
    except Exception as e:  # noqa: BLE001 -- missing or unreadable: either way not logits
        return None, [], f"the candidate engine returned no readable logits ({type(e).__name__})"
    want = tuple(base["logits"].shape)
    if type(logits) is not torch.Tensor or tuple(logits.shape) != want or logits.dtype != base["logits"].dtype:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        return None, [], f"logits {got} from the candidate engine, expected {want} {base['logits'].dtype}"
    new = data.get("new")
    if (not isinstance(new, list) or len(new) != len(base["new"])
            or not all(isinstance(r, list) and all(type(t) is int for t in r) for r in new)):
        return None, [], "the candidate engine returned no token list per prompt"
    return logits, new, ""


def stage(op: str, candidate: Path, policy: Policy, job_dir: Path | None = None,
          kernels_dir: Path | None = None, measured: dict | None = None) -> StageResult:
    """The gate's end-to-end stage for `candidate` (the gate's own copy of the file) in slot `op`. `measured`: the
    numeric stage's metrics (per-call times by shape), which size the job's time limit (job_limits)."""
    t0 = time.perf_counter()
    job_dir = job_dir or candidate.parent / "e2e"  # the parent's evidence (sandbox.log); the candidate never sees it
    base = baseline(policy, kernels_dir)
    others = _others(kernels_dir, skip=op)
    payload = {"op": op, "candidate": candidate.name, "model": policy.target.model, "backend": backend(),
               "weights": policy.target.weights, "seqs": base["seqs"], "prompt_lens": base["prompt_lens"],
               "max_new_tokens": policy.e2e.max_new_tokens, **({"others": others} if others else {})}
    ro_paths = ([Path(kernels_dir).resolve()] if others else []) + (
        [Path(policy.target.model).resolve()] if policy.target.model else [])
    limits, predicted = job_limits(op, policy, base, measured)
    res = sandbox.run("autokernel.gate.e2e_child:run", payload, job_dir, limits, ro_paths=ro_paths,
                      inputs={candidate.name: candidate.read_bytes()})
    if not res.ok:
        return StageResult.fail("e2e", res.reason or "sandbox.error", res.detail, timeout_s=round(limits.timeout_s, 1),
                                predicted_s=None if predicted is None else round(predicted, 1))
    logits, new, why = _returned(res.data, base)
    if why:
        return StageResult.fail("e2e", "e2e.bad_output", why)
    d = divergence(base["logits"], logits, base["mask"])
    floor = dict(zip(("kl_mean", "kl_p99", "kl_max", "top1"), base["floor"].tolist()))
    runs = [(longest_run(b), longest_run(c)) for b, c in zip(base["new"], new)]
    e, m = policy.e2e, {"kl_mean": d.kl_mean, "kl_p99": d.kl_p99, "kl_max": d.kl_max, "top1": d.top1,
                        "positions": d.positions, "noise_floor": floor, "repeat_runs": runs,
                        "elapsed_s": round(time.perf_counter() - t0, 2), "timeout_s": round(limits.timeout_s, 1),
                        "predicted_s": None if predicted is None else round(predicted, 1)}
    if not all(map(torch.isfinite, (torch.tensor(d.kl_mean), torch.tensor(d.kl_max)))):
        return StageResult.fail("e2e", "e2e.kl_exceeded", "non-finite KL: the candidate engine produced NaN/Inf", **m)
    for stat, limit in (("kl_mean", e.kl_mean_max), ("kl_p99", e.kl_p99_max), ("kl_max", e.kl_max_max)):
        if m[stat] > limit:
            return StageResult.fail("e2e", "e2e.kl_exceeded", f"{stat} {m[stat]:.3g} nats > policy {limit:g} "
                                    f"(noise floor {floor[stat]:.2g})", **m)
    if d.top1 < e.top1_min:
        return StageResult.fail("e2e", "e2e.top1", f"top-1 agreement {d.top1:.3f} < policy {e.top1_min}", **m)
    for i, (b, c) in enumerate(runs):
        if c >= e.repeat_run and b < e.repeat_run:
            return StageResult.fail("e2e", "e2e.degenerate_repetition", f"prompt {i}: one token repeated {c} "
                                    f"times in a row (baseline's longest run: {b})", **m)
    return StageResult.ok("e2e", f"KL mean {d.kl_mean:.2g} / p99 {d.kl_p99:.2g} / max {d.kl_max:.2g} nats, "
                          f"top-1 {d.top1:.3f} over {d.positions} tokens", **m)
