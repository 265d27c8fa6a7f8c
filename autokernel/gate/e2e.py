"""End-to-end stage: swap the candidate into the live engine for one op and watch the model itself.

One pass per engine (autokernel/gate/e2e_child.py decode): a batched prefill of the policy's prompts, then greedy
decode steps with the KV cache. Compared with the baseline's pass: per-token KL(baseline || candidate) and top-1
agreement at every prompt position and at each decode step while the candidate's greedy tokens still equal the
baseline's (there its logits are teacher-forced ones); then a repetition guard on the free-running tokens (a run of
one token where the baseline had none is the classic signature of a race in an attention or cache kernel). The
baseline is the unmodified engine (trusted, run here and cached); the candidate engine runs only in the sandbox.

Which engine: on CUDA every other op runs its Triton kernel. On CPU every other op runs its torch reference: the
Triton interpreter needs tens of seconds per forward of the full model, and only the swapped op is under test; the
baseline is that same engine with no op swapped. Under the interpreter the candidate itself runs in as much of the
model as its measured speed fits in gate.e2e_interpreter_budget_s (plan): the job's size is derived, never a guess.

Production's own calls, judged. The numeric stage calls the candidate with inputs the op's spec makes; the engine
calls it with its own (tensor layouts and ranks, index dtypes, real activations). A kernel that branches on what
only production sends (a stride, `x.dim()`, int64 ids) is right on the first and wrong on the second, and a small
error per call can stay under the KL limits. So the job also returns some of the candidate's calls, arguments and
outputs as the engine made them (e2e_child.Capture: the first call of each phase, the first call of every call site
the candidate runs at in the decode steps, then calls at random from a secret seed), and each is judged here exactly
as the numeric stage judges a call: `e2e.call_mismatch` names the first that fails; a call site the baseline has and
the job returned no call of is `e2e.bad_output`. An op the model never calls with the policy's weights (embedding and
matmul when the weights stay quantized) is run with dequantized weights, so that the stage always exercises it. An
op only sampling calls (softmax: the greedy pass never samples) runs in a sampled pass after the greedy one
(e2e_child.sampled: the engine's own sampler on every step's logits, at a secret temperature), where its calls are
judged; an op the engine calls in neither pass is passed as "not exercised", never rejected for it.
"""
from __future__ import annotations

import hashlib
import json
import random
import secrets
import time
from pathlib import Path

import torch

from autokernel import device, paths, sandbox
from autokernel.deadline import Deadline
from autokernel.engine.divergence import divergence, longest_run
from autokernel.gate import e2e_child
from autokernel.gate.verdict import StageResult
from autokernel.paths import INSTALLED_LAYOUT
from autokernel.policy import Policy
from autokernel.sandbox.channel import load_blob


def _cache() -> Path:
    """The baselines' cache: the user's cache directory (autokernel.paths.user_cache), never the installed package
    (a wheel's site-packages) nor a checkout. Written only here, by the trusted process."""
    return paths.user_cache() / "e2e"
PHASES = ("prefill", "decode")  # the greedy pass's phases: what the plan cuts; "sample" (the sampled pass) follows


def backend() -> str:
    """The implementation of every op other than the one under test (see the module docstring)."""
    return "triton" if device.is_cuda() else "reference"


def _others(kernels_dir: Path, skip: str | None = None) -> dict[str, str]:
    """On CUDA, the target checkout's kernels (autokernel.paths) for every other op, when that is not the installed
    project (whose kernels/ the engine imports anyway): the engine around the candidate is the one the commit will
    land in. On CPU every other op runs its reference (module docstring), so there is nothing to swap."""
    if backend() != "triton" or Path(kernels_dir).resolve() == INSTALLED_LAYOUT.kernels.resolve():
        return {}
    from autokernel.ops import OPS
    files = {o: Path(kernels_dir) / f"{o}.py" for o in OPS if o != skip}
    return {o: str(f) for o, f in files.items() if f.is_file()}


_DIGESTS: dict[tuple, str] = {}  # (path, size, mtime, ctime, inode) -> the file's sha256, for this process


def _digest(model: Path) -> str:
    """The model file's content hash: the cached baseline is keyed on what the file holds, not on its path and size
    (a checkout's model file, replaced by another of the same size at the same path, reused the first's baseline)."""
    st = model.stat()
    key = (str(model), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)  # ctime: no one sets it back
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(model, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def _key(policy: Policy, kernels_dir: Path) -> str:
    from autokernel.engine.gguf_model import embedded_model_path
    model = Path(policy.target.model) if policy.target.model else embedded_model_path()
    h = hashlib.sha256()
    h.update(json.dumps(["decode-v4", _digest(model), policy.target.weights, policy.e2e.prompts,
                         policy.e2e.max_new_tokens, backend(), device.kind()]).encode())
    if backend() == "triton":  # on CPU the baseline engine runs no kernel file (module docstring)
        for f in sorted(Path(kernels_dir).glob("*.py")):
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def baseline(policy: Policy, kernels_dir: Path) -> dict:
    """The unmodified engine's pass (autokernel/gate/e2e_child.py decode, then sampled; its kernels: those of
    `kernels_dir`, the target checkout's kernels/): prompts, greedy tokens, the real positions' logits, each op's
    calls by phase ("prefill", "decode", "sample") and call site (they plan the candidate's job), the engine's own
    time per phase, and the noise floor (cached on disk)."""
    path = _cache() / f"e2e-{_key(policy, kernels_dir)}.pt"
    if path.exists():
        return torch.load(path, weights_only=True)
    from autokernel.engine import open_engine
    from autokernel.gate.e2e_child import decode, sampled
    t0 = time.perf_counter()
    eng = open_engine(policy.target.model, kernels=backend(), weights=policy.target.weights,
                      overrides=_others(kernels_dir) or None)
    calls: dict = {}  # op -> phase -> site -> shape -> calls
    clock = {"load": time.perf_counter() - t0}
    phase = _Phase(clock)
    eng.model.ops.observer = _counter(calls, phase)
    rows = [eng.encode_prompt(p) for p in policy.e2e.prompts]
    step_logits: list[torch.Tensor] = []
    new, logits = decode(eng, rows, policy.e2e.max_new_tokens, phase, step_logits)
    sampled(eng, step_logits, 1.0, 0, phase)  # counts the calls only a sampling generation makes (softmax)
    phase("end")
    eng.model.ops.observer = None
    steps = max((len(x) - len(r) for x, r in zip(logits, rows)), default=0)
    # noise floor: the same engine, each prompt alone instead of batched (other padding, same math), over the
    # prompt positions (a prefill each: the baseline is computed once, but on a loaded CPU every pass is minutes)
    alone = [decode(eng, [r], 1) for r in rows]
    a, b = _compared(rows, new, logits, [n[0] for n, _ in alone], [x[0] for _, x in alone], 1)
    floor = divergence(a, b)
    out = {"prompts": rows, "new": new, "logits": torch.cat(logits), "lengths": [len(x) for x in logits],
           "floor": torch.tensor([floor.kl_mean, floor.kl_p99, floor.kl_max, floor.top1]), "calls": calls,
           "steps": steps, "load_s": clock["load"], "prefill_s": clock.get("prefill", 0.0),
           "step_s": clock.get("decode", 0.0) / max(steps, 1)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")  # renamed: readers never see half a file
    torch.save(out, tmp)
    tmp.replace(path)
    return out


class _Phase:
    """on_phase for decode(): the current phase's name, and each finished phase's seconds in `clock`."""

    def __init__(self, clock: dict):
        self.clock, self.t = clock, time.perf_counter()
        self.name: str | None = None

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        if self.name:
            self.clock[self.name] = now - self.t
        self.name, self.t = name, now


def _counter(calls: dict, phase: _Phase):
    """An OpTable observer that counts each op's calls by phase, call site and shape (autokernel.ops shape_of)."""
    from autokernel.ops import get

    def observe(op, site, fn, args):
        key = ",".join(f"{k}={v}" for k, v in get(op).shape_of(*args).items())
        by_shape = calls.setdefault(op, {}).setdefault(phase.name, {}).setdefault(site, {})
        by_shape[key] = by_shape.get(key, 0) + 1
        return fn(*args)
    return observe


def _shape(key: str) -> dict[str, int]:
    return {k: int(v) for k, v in (kv.split("=") for kv in key.split(","))}


def _compared(prompts: list[list[int]], new_a: list[list[int]], rows_a: list[torch.Tensor],
              new_b: list[list[int]], rows_b: list[torch.Tensor], new_tokens: int) -> tuple[torch.Tensor, ...]:
    """The logits of two passes (decode()) at the positions where both are teacher-forced on the same tokens:
    every prompt position, then each decode step j while both rows' first j greedy tokens agree (the position
    that predicts the first differing token is compared too: its prefix is still shared). Concatenated rows."""
    a, b = [], []
    for p, na, ra, nb, rb in zip(prompts, new_a, rows_a, new_b, rows_b):
        na, nb = na[:new_tokens], nb[:new_tokens]
        agree = next((i for i, (x, y) in enumerate(zip(na, nb)) if x != y), min(len(na), len(nb)))
        n = len(p) + min(agree, len(ra) - len(p), len(rb) - len(p), new_tokens - 1)
        a.append(ra[:n])
        b.append(rb[:n])
    return torch.cat(a), torch.cat(b)


def _rows(flat: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    return list(torch.split(flat, lengths))


# --- the job's plan: how much of the model the candidate runs in, within the time it has -------------------------

def plan(op: str, policy: Policy, base: dict, measured: dict | None, rng: random.Random | None = None) -> dict:
    """Where the candidate runs in the end-to-end job and for how many greedy tokens.

    Where the kernels compile (CUDA), or with no per-call times measured: at every call site of the op, for
    e2e.max_new_tokens tokens. Under the CPU interpreter a call costs ~0.2-60 s (matmul_q4_1: 210 calls a token,
    so the full pass, 3,570 calls, ran past 78 minutes), and the candidate's own predicted time (its per-call times
    as the numeric stage measured them, _per_call, times the op's calls per layer,
    phase and shape, counted in the baseline) is sized to gate.e2e_interpreter_budget_s; the engine's time around
    it is the same whatever the plan, and is added only to the job's time limit. Layers are taken in a secret random
    order, all of a layer's call sites together (every weight shape of the op); layers before tokens, since an error
    small per call shows in the logits only as it adds up over layers. The call sites outside the layers (the
    embedding, the final norm, the logits head) are always taken: each is one of a kind, told apart by its weights
    whatever the plan, so a shortcut there would hide in any layer count (issue 25: one on the final norm escaped).
    The first option that fits wins:
    1. everywhere, prefill and e2e.max_new_tokens greedy tokens: the full check;
    2. the prefill and 2 * e2e.repeat_run greedy tokens (room for the guard's run to start anywhere in the first
       half), in as many layers as fit; then as many more tokens as still fit in those layers;
    3. likewise with the decode steps only (the prefill all reference: M=120 calls cost the most), for an op the
       decode steps call (not prefill attention: a plan without its prefill never called the candidate, and an
       unchanged copy of the incumbent was rejected e2e.bad_output on a loaded machine);
    4. else the smallest: one layer, decode only where the decode steps call the op, else its prefill, 2 *
       repeat_run tokens; its job limit is stretched to fit it.
    The power this costs is real: the known-bad add_rmsnorm (eps x 1000) that the full check rejects passes in one
    layer of 31, decode only (KL max 5.8e-6 nats); the numeric stage, and the full check where kernels compile,
    stay the defence against errors that small.
    Returns {"sites": None (everywhere) | {"prefill": [...], "decode": [...]}, "layers", "of_layers", "prefill",
    "new_tokens", "predicted_s"}."""
    g_max = policy.e2e.max_new_tokens
    g_min = min(g_max, 2 * policy.e2e.repeat_run)
    calls = {ph: s for ph, s in ((base.get("calls") or {}).get(op) or {}).items() if ph in PHASES}
    groups = sorted({e2e_child.layer_of(s) for ph in calls.values() for s in ph}, key=lambda g: (g is not None, g))
    full = {"sites": None, "layers": len(groups), "of_layers": len(groups), "prefill": True, "new_tokens": g_max,
            "predicted_s": None}
    call_s = (measured or {}).get("call_s")
    if backend() == "triton" or not isinstance(call_s, dict) or not call_s or not groups:
        return full
    steps = max(int(base.get("steps", 0)), 1)
    cost = _layer_costs(op, call_s, calls, groups)
    order = [g for g in groups if g is not None]
    (rng or random.Random(secrets.randbits(64))).shuffle(order)
    fixed: list[int | None] = [g for g in groups if g is None]  # the sites outside the layers: always (docstring)
    engine_s = float(base.get("load_s", 0.0)) + float(base.get("prefill_s", 0.0))

    def interpreted(k: int, prefill: bool, g: int) -> float:
        """The candidate's own predicted seconds (what the plan sizes: the engine's time around it is the same
        whatever the plan, and on a loaded machine mostly load)."""
        chosen = fixed + order[:k]
        pre = sum(cost["prefill"][c] for c in chosen) if prefill else 0.0
        return pre + (g - 1) * sum(cost["decode"][c] for c in chosen) / steps

    def predict(k: int, prefill: bool, g: int) -> float:
        return interpreted(k, prefill, g) + engine_s + (g - 1) * float(base.get("step_s", 0.0))

    n, budget = len(order), policy.gate.e2e_interpreter_budget_s
    lowest = 1 if n else 0  # at least one layer, where the op has any
    cuts = (True, False) if calls.get("decode") else (True,)  # a prefill-only op keeps its prefill (docstring, 3.)
    options = [(n, True, g_max)] + [(k, pre, g_min) for pre in cuts for k in range(n, lowest - 1, -1)]
    k, prefill, g = next((o for o in options if interpreted(*o) <= budget), options[-1])
    while g < g_max and interpreted(k, prefill, g + 1) <= budget:  # the layers fixed, as many tokens as fit
        g += 1
    if k == n and prefill and g == g_max:
        return {**full, "predicted_s": predict(k, prefill, g)}
    chosen = {*fixed, *order[:k]}
    sites = {ph: sorted(s for s in calls.get(ph, {}) if e2e_child.layer_of(s) in chosen and (prefill or ph == "decode"))
             for ph in PHASES}
    return {"sites": sites, "layers": len(chosen), "of_layers": len(groups), "prefill": prefill, "new_tokens": g,
            "predicted_s": predict(k, prefill, g)}


def _layer_costs(op: str, call_s: dict[str, float], calls: dict, groups: list) -> dict[str, dict]:
    """The candidate's predicted seconds in each layer (group) and phase of one pass: calls x _per_call."""
    per_call = _per_call(op, call_s)
    cost = {ph: {g: 0.0 for g in groups} for ph in ("prefill", "decode")}
    for ph, sites in calls.items():
        for site, shapes in sites.items():
            cost[ph][e2e_child.layer_of(site)] += sum(n * per_call(_shape(k)) for k, n in shapes.items())
    return cost


def _per_call(op: str, call_s: dict[str, float]):
    """Predicted seconds of one call of a shape, from the numeric stage's measured ones: the measured shape that
    differs only in the leading dimension and is the next larger (an upper bound: more rows never cost less), else
    the largest smaller one grown as the best-measured such family grows over the same rows (tiles make cost a step
    function of the rows, not a line); a shape with no such relative gets the numeric stage's pessimistic
    a + b * work model (autokernel.gate.numeric.per_call_model: its steepest slope, often from a tiny odd shape, can
    overstate a decode call 20x, which would shrink the plan for nothing)."""
    from autokernel.gate.numeric import per_call_model
    from autokernel.ops import get
    measured = [(_shape(k), float(t)) for k, t in call_s.items()]
    fallback = per_call_model(get(op), {k: (_shape(k), float(t)) for k, t in call_s.items()})

    def rows(shape: dict[str, int]) -> tuple[str, list[tuple[int, float]]]:
        """The leading dimension's name, and the measured (size, seconds) of shapes equal to `shape` but in it."""
        lead = next(iter(shape))
        rest = {k: v for k, v in shape.items() if k != lead}
        return lead, sorted((m[lead], t) for m, t in measured
                            if lead in m and {k: v for k, v in m.items() if k != lead} == rest)

    def at(kin: list[tuple[int, float]], n: int) -> float | None:
        return next((t for m, t in kin if m >= n), None)

    def predict(shape: dict[str, int]) -> float:
        lead, kin = rows(shape)
        n = shape[lead]
        if (exact := at(kin, n)) is not None:
            return exact
        if not kin:
            return fallback(shape)
        m, t = kin[-1]  # measured only below n: grow it as the best-measured relative grows from m to n
        ref = max((rows(s)[1] for s, _ in measured if next(iter(s)) == lead), key=len)
        lo, hi = at(ref, m), at(ref, n)
        return t * (hi / lo if lo and hi else n / max(m, 1))
    return predict


def job_limits(policy: Policy, predicted: float | None, deadline: Deadline = Deadline.none()):
    """The e2e job's limits: the policy's sandbox limits, the wall clock stretched to gate.e2e_timeout_factor times
    the plan's predicted time when that is longer (a slow but correct candidate under the CPU interpreter must not
    fail on the clock), and never past `deadline` (the gate's overall deadline, which autokernel/gate/pipeline.py
    judges)."""
    limits = policy.sandbox
    if predicted is not None and policy.gate.e2e_timeout_factor * predicted > limits.timeout_s:
        need = policy.gate.e2e_timeout_factor * predicted
        limits = limits.model_copy(update={"timeout_s": need, "cpu_s": max(limits.cpu_s, int(2 * need))})
    return limits.model_copy(update={"timeout_s": max(0.001, min(limits.timeout_s, deadline.left()))})


def _returned(data: dict, base: dict, new_tokens: int) -> tuple[list[torch.Tensor] | None, list, str]:
    """The job's rows of logits and greedy tokens, type-checked against what the parent asked for (the child's data
    is untrusted: each row's length must follow from its prompt and its own tokens, the vocabulary from the
    baseline's); (None, [], why) if malformed."""
    new, lengths, prompts = data.get("new"), data.get("lengths"), base["prompts"]
    if (not isinstance(new, list) or len(new) != len(prompts) or not all(
            isinstance(r, list) and len(r) <= new_tokens and all(type(t) is int for t in r) for r in new)):
        return None, [], "the candidate engine returned no token list per prompt"
    want = [len(p) + min(len(r), new_tokens - 1) for p, r in zip(prompts, new)]
    if not isinstance(lengths, list) or [type(x) for x in lengths] != [int] * len(want) or lengths != want:
        return None, [], f"logit rows {lengths!r:.60} from the candidate engine, expected {want}"
    try:
        logits = load_blob(data.get("logits"))
    except ValueError as e:  # missing or unreadable: either way not logits
        return None, [], f"the candidate engine returned no readable logits ({e})"
    shape = (sum(want), base["logits"].shape[1])
    if type(logits) is not torch.Tensor or tuple(logits.shape) != shape or logits.dtype != base["logits"].dtype:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        return None, [], f"logits {got} from the candidate engine, expected {shape} {base['logits'].dtype}"
    return _rows(logits, want), new, ""


CAPTURE_P = 0.05  # the chance that a candidate call after the first of its phase is returned for judging


def judge_calls(op: str, blob) -> tuple[int, str, set[tuple[str, str]]]:
    """The candidate's captured engine calls (e2e_child.Capture), each judged as the numeric stage judges a call
    (autokernel.ops.tolerance.compare_outputs against the float64 reference on the same arguments): (calls judged,
    "") when all pass, (k, why) naming the first that failed, (-1, why) when the data is malformed (untrusted: it
    comes from the candidate's process, and a well-formed call is still judged by the parent); then the (phase, call
    site) of each call judged and passed (what expected_sites is held against)."""
    import inspect

    from autokernel.ops import get
    from autokernel.ops.tolerance import compare_outputs, references
    spec = get(op)
    try:
        calls = load_blob(blob)
    except ValueError as e:  # missing or unreadable: either way no calls
        return -1, f"the candidate engine returned no readable calls ({e})", set()
    if not isinstance(calls, list) or not calls:
        return -1, "the candidate engine returned no call of the candidate (its first call is always kept)", set()
    sig = inspect.signature(spec.reference)
    seen: set[tuple[str, str]] = set()
    for k, call in enumerate(calls):
        try:
            phase, site, args, outs = call
            kwargs = dict(sig.bind(*args).arguments)
            if not isinstance(phase, str) or not isinstance(site, str):
                raise TypeError
        except (TypeError, ValueError):
            return -1, f"captured call {k} is malformed", seen
        outs = outs if isinstance(outs, list) else [outs]
        refs = references(spec, kwargs)
        j = compare_outputs(outs, refs.ref64, refs.eager, None, refs.floors, elementwise=refs.elementwise)
        if not j.ok:
            shapes = ", ".join(f"{n} {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}"
                               for n, v in kwargs.items() if isinstance(v, torch.Tensor))
            return k, f"{phase} call at {site} ({shapes}): {j.reason}: {j.detail}", seen
        seen.add((phase, site))
    return len(calls), "", seen


def site_phases(new_tokens: int) -> tuple[str, ...]:
    """The phases in which the first call of every call site is captured (e2e_child.Capture): the decode steps,
    whose calls are the smallest and reach every site the candidate runs at (the prefill where a pass has no decode
    step), and the sampled pass."""
    return ("decode" if new_tokens > 1 else "prefill", "sample")


def expected_sites(calls: dict, sites: dict | None, phases: tuple[str, ...]) -> set[tuple[str, str]]:
    """(phase, call site) of every site the candidate runs at in `phases`: the baseline's sites of the op (`calls`,
    by phase), cut to the plan's `sites` (None: everywhere; the sampled pass is never cut)."""
    out = set()
    for ph in phases:
        keep = None if sites is None or ph not in sites else set(sites[ph])
        out |= {(ph, s) for s in calls.get(ph, {}) if keep is None or s in keep}
    return out


def _sample_temperature() -> float:
    """The sampled pass's temperature: secret, from the range the softmax spec draws (autokernel/ops/softmax.py)."""
    from autokernel.ops.softmax import TEMPERATURE, TEMPERATURES
    from autokernel.ops.spec import draw
    return draw(torch.Generator().manual_seed(secrets.randbits(63)), *TEMPERATURES, (TEMPERATURE, 1.0))


def stage(op: str, candidate: Path, policy: Policy, job_dir: Path | None = None, *,
          kernels_dir: Path, measured: dict | None = None,
          deadline: Deadline = Deadline.none()) -> StageResult:
    """The gate's end-to-end stage for `candidate` (the gate's own copy of the file) in slot `op`. `measured`: the
    numeric stage's metrics (per-call times by shape), which size the job (plan) and its time limit (job_limits);
    `deadline`: the gate's overall deadline, past which the job is cut. `kernels_dir`: the target checkout's
    kernels/, as gate.verify was given it (the caller resolves the checkout: autokernel.paths)."""
    t0 = time.perf_counter()
    kernels_dir = Path(kernels_dir)
    job_dir = job_dir or candidate.parent / "e2e"  # the parent's evidence (sandbox.log); the candidate never sees it
    base = baseline(policy, kernels_dir)
    if not base["calls"].get(op) and policy.target.weights != "dequant":  # e.g. matmul with quantized weights
        policy = policy.model_copy(update={"target": policy.target.model_copy(update={"weights": "dequant"})})
        base = baseline(policy, kernels_dir)
    calls = base["calls"].get(op) or {}
    if not calls:  # nothing of the model to compare: never a rejection (issue 25)
        return StageResult.ok("e2e", f"not exercised: the engine calls {op} in neither its greedy nor its sampled "
                              "pass", exercised=False, weights=policy.target.weights)
    others = _others(kernels_dir, skip=op)
    p = plan(op, policy, base, measured)
    g = p["new_tokens"]
    sample = {"temperature": _sample_temperature(), "seed": secrets.randbits(63)} if calls.get("sample") else None
    payload = {"op": op, "candidate": candidate.name, "model": policy.target.model, "backend": backend(),
               "weights": policy.target.weights, "prompts": base["prompts"], "new_tokens": g,
               "capture_seed": secrets.randbits(63), "capture_p": CAPTURE_P, "site_phases": list(site_phases(g)),
               **({"sample": sample} if sample else {}),
               **({"sites": p["sites"]} if p["sites"] is not None else {}), **({"others": others} if others else {})}
    ro_paths = ([kernels_dir.resolve()] if others else []) + (
        [Path(policy.target.model).resolve()] if policy.target.model else [])
    limits = job_limits(policy, p["predicted_s"], deadline)
    shown = {k: (None if v is None else round(v, 1)) if k == "predicted_s" else v for k, v in p.items() if k != "sites"}
    res = sandbox.run(e2e_child.run, payload, job_dir, limits, ro_paths=ro_paths,
                      inputs={candidate.name: candidate.read_bytes()})
    if not res.ok:
        return StageResult.fail("e2e", res.reason or "sandbox.error", res.detail, timeout_s=round(limits.timeout_s, 1),
                                plan=shown)
    rows, new, why = _returned(res.data, base, g)
    if why:
        return StageResult.fail("e2e", "e2e.bad_output", why)
    assert rows is not None  # _returned gives rows wherever it gives no reason
    judged, why, seen = judge_calls(op, res.data.get("calls"))
    missing = sorted(expected_sites(calls, p["sites"], site_phases(g)) - seen)
    if not why and missing:
        judged, why = -1, f"the candidate engine returned no call at {missing[0][1]} ({missing[0][0]}; " \
                          f"{len(missing)} sites in all): the first call of every call site is judged"
    sample_error = res.data.get("sample_error")
    if not why and sample and sample_error:
        judged, why = -1, f"the engine's sampler failed on the candidate's output ({str(sample_error)[:120]})"
    prompts = base["prompts"]
    a, b = _compared(prompts, base["new"], _rows(base["logits"], base["lengths"]), new, rows, g)
    d = divergence(a, b)
    floor = dict(zip(("kl_mean", "kl_p99", "kl_max", "top1"), base["floor"].tolist()))
    runs = [(longest_run(x[:g]), longest_run(c)) for x, c in zip(base["new"], new)]
    e, m = policy.e2e, {"kl_mean": d.kl_mean, "kl_p99": d.kl_p99, "kl_max": d.kl_max, "top1": d.top1,
                        "positions": d.positions, "decode_positions": d.positions - sum(map(len, prompts)),
                        "noise_floor": floor, "repeat_runs": runs, "plan": shown, "calls_judged": max(judged, 0),
                        "sites_judged": len(seen), "sampled_pass": sample is not None, "weights": policy.target.weights,
                        "elapsed_s": round(time.perf_counter() - t0, 2), "timeout_s": round(limits.timeout_s, 1)}
    verdict = _judge(d, runs, m, e, floor)
    if verdict.passed and why:  # the model-level checks first: a wrong model is reported as such
        return StageResult.fail("e2e", "e2e.bad_output" if judged < 0 else "e2e.call_mismatch", why, **m)
    return verdict


def _judge(d, runs: list[tuple[int, int]], m: dict, e, floor: dict) -> StageResult:
    if not all(map(torch.isfinite, (torch.tensor(d.kl_mean), torch.tensor(d.kl_max)))):
        return StageResult.fail("e2e", "e2e.kl_exceeded", "non-finite KL: the candidate engine produced NaN/Inf", **m)
    for stat, limit in (("kl_mean", e.kl_mean_max), ("kl_p99", e.kl_p99_max), ("kl_max", e.kl_max_max)):
        if not m[stat] <= limit:  # written to fail on NaN too
            return StageResult.fail("e2e", "e2e.kl_exceeded", f"{stat} {m[stat]:.3g} nats > policy {limit:g} "
                                    f"(noise floor {floor[stat]:.2g})", **m)
    if not d.top1 >= e.top1_min:
        return StageResult.fail("e2e", "e2e.top1", f"top-1 agreement {d.top1:.3f} < policy {e.top1_min}", **m)
    for i, (b, c) in enumerate(runs):
        if c >= e.repeat_run and b < e.repeat_run:
            return StageResult.fail("e2e", "e2e.degenerate_repetition", f"prompt {i}: one token repeated {c} "
                                    f"times in a row (baseline's longest run: {b})", **m)
    p = m["plan"]
    where = ("" if p["layers"] == p["of_layers"] else f"; candidate in {p['layers']} of {p['of_layers']} layers") + \
        ("" if p["prefill"] else "; decode steps only")
    sampled = ", a sampled pass at the engine's sampler" if m.get("sampled_pass") else ""
    return StageResult.ok("e2e", f"KL mean {d.kl_mean:.2g} / p99 {d.kl_p99:.2g} / max {d.kl_max:.2g} nats, "
                          f"top-1 {d.top1:.3f} over {d.positions} tokens ({m['decode_positions']} decoded), "
                          f"{m['plan']['new_tokens']} greedy tokens{where}{sampled}; {m['calls_judged']} of its "
                          f"calls judged, at {m.get('sites_judged', 0)} call site(s)", **m)
