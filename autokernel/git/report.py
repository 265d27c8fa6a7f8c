"""What a delivered win says: the commit message / PR body and the small evidence file committed beside the kernel.

Everything here is written by the parent from data it holds itself: the Measurement it computed, the gate's stage
results as returned in-process (never a verdict.json read back from a directory a candidate could write), the
device fingerprint, the session's provenance. Text a model or candidate produced (the model's summary, rejection
details, a server's model id) goes through autokernel.untrusted: control characters stripped, fenced in Markdown so
it is shown, never rendered, and made inert (untrusted.inert) so that no `Closes #1`, `owner/repo#2`, `@team` or
`Co-authored-by:` in it acts on GitHub: the fence means nothing in a commit message. Repro commands name only
repository paths, so they work on a reviewer's machine.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from autokernel.untrusted import fenced, inert, line

MAX_RATIONALE_CHARS = 1500  # a summary a reviewer reads, not the session: the transcript stays in sandbox/


class Measured(Protocol):
    """What a report reads of autokernel.bench.measure.Measurement (declared here: git/ imports no stage package)."""
    label: str
    fingerprint: dict
    policy: dict
    files: list[Any]  # FileResults, the incumbent first: .speedup, .shapes (each .shape, .dtype, .calls, ...)
    isolation: str


@dataclass
class Win:
    """One accepted, confirmed candidate and what is known about it (all trusted except `rationale`)."""
    op: str
    measurement: Measured  # autokernel.bench.measure.Measurement (the confirming benchmark)
    gate: dict  # {"seed", "isolation", "sha256", "stages": [{name, passed, reason, detail, elapsed_s, metrics}]}
    provenance: dict = field(default_factory=dict)  # agent, model, candidates, tokens, usd
    rationale: str = ""  # the model's own words (untrusted)
    trace_id: str | None = None  # the profile's run id (not its path: that is machine-local)
    evidence_path: str = ""  # where the evidence file goes in the repository
    share: float | None = None  # of profiled end-to-end time (profile/rank.py e2e_share); None: unknown
    profile_path: str = ""  # where the profile summary is committed (its shapes and calls), "" when it is not
    trace_dir: str = ""  # the trace directory (repository-relative) when its summary is too big to commit
    engine_ab: Any = None  # autokernel.bench.engine_ab: EngineAB (EngineMeasured), or NotMeasured (.why); None: none


def impact(w: Win) -> str:
    """The kernel speedup beside what it can do end to end (Amdahl on the op's share of profiled time): a 5x kernel
    for an op taking 0.1 % of the time moves the engine by 0.1 %, and the reviewer should see that first."""
    from autokernel.profile.rank import amdahl
    s = w.measurement.files[-1].speedup.est
    head = f"{s:.2f}x faster {w.op}"
    if w.share is None:
        return f"{head}; {w.op}'s share of profiled time is unknown (no profile): the end-to-end effect is not bounded"
    return (f"{head}; {w.op} is {100 * w.share:.1f}% of profiled time: x{amdahl(w.share, s):.2f} end to end at most "
            "(Amdahl)")


class EngineMeasured(Protocol):
    """What a report reads of autokernel.bench.engine_ab.EngineAB (declared here: git/ imports no stage package)."""
    label: str
    rounds: int
    prompt_tokens: int
    decode_steps: int
    tokens_per_s: list  # Intervals (.est, .lo, .hi): decode tokens/s, the incumbent's then the candidate's
    speedup: Any  # Interval: candidate tokens/s / incumbent's, paired by round
    prefill_speedup: Any
    same_tokens: bool
    confidence: float
    elapsed_s: float
    op_calls: dict  # the op's calls in the A/B's prefill and in one decode step: {"prefill": n, "decode": m}


def tokens_line(ab) -> str:
    """The end-to-end tokens/s A/B of the engine with and without the kernel (autokernel/bench/engine_ab.py: an
    EngineAB, or NotMeasured with its reason, which is printed as is). Under the CPU interpreter the figures are the
    interpreter's, with every other op on its torch reference, and the line says so next to them: the op weighs more
    in that engine than in the profile (where every op is interpreted), so the A/B can pass the Amdahl bound above
    (the first real nightly: attention_decode 4.1% of profiled time, bound x1.00, A/B decode x1.079)."""
    head = "End-to-end tokens/s (the engine with vs without this kernel"
    if ab is None or not hasattr(ab, "speedup"):
        why = getattr(ab, "why", None) or "this run did not measure it"
        return (f"{head}): **not measured**: {line(why, 300)}. The bound above (Amdahl on the op's share of profiled "
                "time) is what is known end to end.")
    inc, cand = ab.tokens_per_s
    s, p = ab.speedup, ab.prefill_speedup
    what = (f"{ab.label}, synchronized wall time" if ab.label.startswith("CUDA") else
            "Triton-interpreter CPU time of an engine whose every other op runs its torch reference, so the op "
            "weighs more there than in the profile and the figure can pass the Amdahl bound above: the interpreter's "
            "tokens/s, not GPU speed")
    calls = ab.op_calls or {}
    decode = (f"decode **{inc.est:.3g} -> {cand.est:.3g} tokens/s**, x{s.est:.3f} [{s.lo:.3f}, {s.hi:.3f}]"
              if calls.get("decode", 1) else "decode: the op is not called there")
    prefill = (f"prefill of {ab.prompt_tokens} tokens x{p.est:.3f} [{p.lo:.3f}, {p.hi:.3f}]"
               if calls.get("prefill", 1) else f"prefill of {ab.prompt_tokens} tokens: the op is not called there")
    return (f"{head}; {what}): {decode}; {prefill}. Paired over {ab.rounds} interleaved rounds in "
            f"{ab.elapsed_s:.0f} s (A B, B A, ...; each arm a fresh sandboxed process), "
            f"{100 * ab.confidence:.0f} % confidence intervals. Workload: the first e2e prompt's first "
            f"{ab.prompt_tokens} tokens, {ab.decode_steps} greedy decode steps"
            + ("" if ab.same_tokens else "; the two engines generated different tokens") + ".")


def _label(m) -> str:
    return m.label + ("" if m.label.startswith("CUDA") else " (interpreter timings, not GPU speed)")


def perf_table(m, op: str) -> list[str]:
    """Markdown rows: per shape before/after, speedup with CI, GB/s and % of peak, then the weighted speedup."""
    inc, cand = m.files[0], m.files[-1]
    rows = [f"Timings: **{_label(m)}**", "",
            "| shape | dtype | calls | before ms | after ms | speedup [CI] | after GB/s | after % peak |",
            "|---|---|---:|---:|---:|---|---:|---:|"]
    for a, b in zip(inc.shapes, cand.shapes):
        shape = " ".join(f"{k}={v}" for k, v in a.shape.items())
        pct = "—" if b.fraction_of_peak is None else f"{100 * b.fraction_of_peak:.2f}"
        rows.append(f"| {shape} | {a.dtype} | {a.calls} | {a.median_ms.est:.4g} | {b.median_ms.est:.4g} | "
                    f"{b.speedup.est:.3f} [{b.speedup.lo:.3f}, {b.speedup.hi:.3f}] | {b.gbps:.3g} | {pct} |")
    s = cand.speedup
    rows += ["", f"Speedup of `{op}` over the traced calls (their total time, incumbent / candidate): "
                 f"**{s.est:.3f}x** [{s.lo:.3f}, {s.hi:.3f}] at {100 * m.policy['confidence']:.0f} % confidence "
                 f"(policy: lower bound > {m.policy['min_speedup']:g})."]
    return rows


def _e2e(gate: dict) -> dict | None:
    return next((s for s in gate.get("stages", []) if s.get("name") == "e2e"), None)


def kl_line(gate: dict) -> str:
    e = _e2e(gate)
    if e is None:
        return "- (no end-to-end stage in this verdict)"
    mt = e.get("metrics") or {}

    def num(k):
        v = mt.get(k)
        return f"{v:.3g}" if isinstance(v, (int, float)) else "?"
    return (f"- KL mean {num('kl_mean')} / p99 {num('kl_p99')} / max {num('kl_max')} nats over {mt.get('positions')} "
            f"tokens; top-1 agreement {num('top1')}; longest token runs (baseline, candidate) "
            f"{mt.get('repeat_runs')}\n{plan_line(mt.get('plan'))}")


def plan_line(plan) -> str:
    """Where the candidate ran in the end-to-end check (autokernel/gate/e2e.py plan): a partial check says so."""
    if not isinstance(plan, dict) or not isinstance(plan.get("layers"), int):
        return "- checked where: not recorded"
    layers, of, g = plan.get("layers"), plan.get("of_layers"), plan.get("new_tokens")
    if layers == of and plan.get("prefill", True):
        return f"- checked where: every call site of the op, prefill and {g} greedy tokens (the full check)"
    return (f"- checked where: a PARTIAL check (Triton-interpreter budget): the candidate in {layers} of {of} layers "
            f"(drawn at random){'' if plan.get('prefill', True) else ', decode steps only'}, {g} greedy tokens; "
            "rerun `autokernel verify` where kernels compile for the full check")


def reach_line(gate: dict) -> str | None:
    """What the numeric stage vouched for of production's range (autokernel/gate/numeric.py _reach), when it stopped
    short of it: the interpreter's row cap, a call past it too slow to make on this machine."""
    num = next((s for s in gate.get("stages", []) if s.get("name") == "numeric"), None) or {}
    r = (num.get("metrics") or {}).get("reach")
    if not isinstance(r, dict):
        return None
    found = r.get("thresholds_left")
    left = ", ".join(map(str, found[:6])) if isinstance(found, list) else ""
    rerun = "rerun `autokernel verify` where kernels compile before relying on it there"
    if r.get("checked"):
        return (f"- NOT CHECKED at {r.get('dim')} = {left}, where the kernel's thresholds fall past the Triton "
                f"interpreter's row cap (over its time or the sandbox's memory); {rerun}") if left else None
    sizes = f"; nor at {r.get('dim')} = {left}, where the kernel's thresholds fall" if left else ""
    return (f"- NOT CHECKED past {r.get('dim')} = {r.get('vouched')} of production's {r.get('production')} (one call "
            f"there would take ~{r.get('est_s')} s under the Triton interpreter){sizes}; {rerun}")


def title(w: Win) -> str:
    from autokernel.profile.rank import amdahl
    s = w.measurement.files[-1].speedup
    e2e = "share of profiled time unknown" if w.share is None else \
        f"{100 * w.share:.1f}% of profiled time, <= x{amdahl(w.share, s.est):.2f} end to end"
    return inert(line(f"autokernel: faster {w.op} ({s.est:.3f}x [{s.lo:.3f}, {s.hi:.3f}], {w.measurement.label}; "
                      f"{e2e})", 250))


def body(w: Win, base: str) -> str:
    """The commit message body and PR body (Markdown), inert as a whole (module docstring): the trusted lines have
    nothing GitHub acts on, so the model's words, wherever they sit, cannot either."""
    m, g, op = w.measurement, w.gate, w.op
    stages = ", ".join(f"{s['name']} ({s.get('elapsed_s', 0):.1f} s)" for s in g.get("stages", []))
    out = [f"**{impact(w)}**", "", tokens_line(w.engine_ab), ""] + perf_table(m, op)
    reach = reach_line(g)
    out += ["", "End to end (teacher-forced KL vs the unmodified engine, then a greedy run):",
            kl_line(g), *([reach] if reach else []), "",
            f"Gate: passed {stages}; isolation {line(g.get('isolation') or 'unknown')}; "
            f"seed {g.get('seed')}; candidate sha256 {str(g.get('sha256', ''))[:16]}.",
            f"Benchmark isolation: {line(m.isolation or 'unknown')}.",
            "", "Device: " + json.dumps(m.fingerprint, sort_keys=True)]
    if w.provenance:
        out += ["", "Agent: " + line(", ".join(f"{k} {v}" for k, v in w.provenance.items()), 400)]
    if w.rationale.strip():
        out += ["", "The model's summary (its own words, unverified):", "",
                fenced(w.rationale[:MAX_RATIONALE_CHARS])]
    trace = w.profile_path.removesuffix("/summary.json") if w.profile_path else w.trace_dir
    t = f" --trace {trace}" if trace else ""
    out += ["", "Reproduce on this branch (any machine with autokernel installed)"
            + (", on the profiled shapes and call counts:" if trace else ":"), "", "```sh",
            f"autokernel verify {op} kernels/{op}.py{t} --seed {g.get('seed')}",
            f"git show {base[:12]}:kernels/{op}.py > /tmp/base_{op}.py",
            f"autokernel bench {op} kernels/{op}.py --incumbent /tmp/base_{op}.py{t}", "```"]
    if w.evidence_path:
        out += ["", f"Evidence: `{w.evidence_path}`" + (f" (profile {line(w.trace_id)})" if w.trace_id else "")]
    if w.profile_path:
        out += [f"Profile (shapes, calls, times): `{w.profile_path}`, committed with the evidence."]
    elif w.trace_dir:
        out += [f"Profile: `{w.trace_dir}/summary.json` on the machine that ran autokernel (not committed: too "
                "big); the repro commands need a copy of it there."]
    else:
        out += ["Profile: none (the run had no trace): the repro benchmarks the model's own shapes, one call each."]
    return inert("\n".join(out))


def message(w: Win, base: str) -> str:
    return f"{title(w)}\n\n{body(w, base)}\n"


def _small(v, depth: int = 0):
    """Numbers, short strings and small lists/dicts of them; anything bigger is dropped (evidence stays small)."""
    if isinstance(v, bool) or v is None or isinstance(v, int):
        return v
    if isinstance(v, float):
        return float(f"{v:.6g}")
    if isinstance(v, str):
        return line(v, 200)
    if isinstance(v, (list, tuple)) and len(v) <= 16 and depth < 3:
        return [_small(x, depth + 1) for x in v]
    if isinstance(v, dict) and len(v) <= 24 and depth < 3:
        return {line(k, 60): _small(x, depth + 1) for k, x in v.items()}
    return None


def evidence(w: Win, base: str) -> str:
    """The committed evidence file: a trimmed, reviewable JSON summary (tens of lines)."""
    m = w.measurement
    inc, cand = m.files[0], m.files[-1]
    shapes = [{"shape": a.shape, "dtype": a.dtype, "calls": a.calls, "before_ms": _small(a.median_ms.est),
               "after_ms": _small(b.median_ms.est),
               "speedup": [_small(b.speedup.est), _small(b.speedup.lo), _small(b.speedup.hi)],
               "after_pct_of_peak": None if b.fraction_of_peak is None else _small(100 * b.fraction_of_peak)}
              for a, b in zip(inc.shapes, cand.shapes)]
    data = {"op": w.op, "base": base, "timings": _label(m), "confidence": m.policy.get("confidence"),
            "min_speedup": m.policy.get("min_speedup"),
            "speedup": [_small(cand.speedup.est), _small(cand.speedup.lo), _small(cand.speedup.hi)],
            "shapes": shapes, "bench_isolation": line(m.isolation or ""),
            "gate": {"seed": w.gate.get("seed"), "sha256": w.gate.get("sha256"),
                     "isolation": line(w.gate.get("isolation") or ""),
                     "stages": [{"name": s["name"], "passed": s.get("passed"), "reason": s.get("reason"),
                                 "detail": line(s.get("detail", ""), 200), "elapsed_s": s.get("elapsed_s"),
                                 "metrics": {k: x for k, x in ((k, _small(v)) for k, v in
                                                                (s.get("metrics") or {}).items()) if x is not None}}
                                for s in w.gate.get("stages", [])]},
            "device": _small(m.fingerprint), "provenance": _small(w.provenance),
            "trace": line(w.trace_id) if w.trace_id else None, "profile": w.profile_path or None,
            "share_of_profiled_time": None if w.share is None else _small(w.share),
            "engine_ab": _engine_ab(w.engine_ab)}
    return json.dumps(data, indent=1, sort_keys=False) + "\n"


def _engine_ab(ab) -> dict | None:
    """The engine A/B in the evidence file: its figures as [est, lo, hi], or why it was not measured."""
    if ab is None:
        return None
    if not hasattr(ab, "speedup"):
        return {"not_measured": line(getattr(ab, "why", ""), 300)}

    def iv(x):
        return [_small(x.est), _small(x.lo), _small(x.hi)]
    return {"timings": line(ab.label), "rounds": ab.rounds, "prompt_tokens": ab.prompt_tokens,
            "decode_steps": ab.decode_steps, "decode_tokens_per_s": [iv(x) for x in ab.tokens_per_s],
            "speedup": iv(ab.speedup), "prefill_speedup": iv(ab.prefill_speedup), "same_tokens": ab.same_tokens,
            "op_calls": _small(ab.op_calls), "elapsed_s": _small(ab.elapsed_s)}
