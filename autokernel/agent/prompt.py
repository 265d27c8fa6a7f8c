"""What the agent is told: the templates in prompts/ filled with the op's trusted spec, its shapes, the roofline and
the gate's allowlist, and, after each submission, the verdict with everything the gate measured.

Everything here comes from the trusted side (the op spec, the trace, the device, the gate) or from the current kernel
file; nothing from a candidate. Numbers are formatted here, words live in the templates.
"""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import jinja2
import torch
import yaml

from autokernel import device, paths
from autokernel import ops as opspecs
from autokernel.agent import context
from autokernel.ops import tolerance
from autokernel.policy import Agent as AgentPolicy
from autokernel.untrusted import fenced

PROMPTS = Path(__file__).parent / "prompts"


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(PROMPTS), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    env.filters["fence"] = fenced  # a checkout's source in a code block its own backticks cannot close
    return env


@lru_cache(maxsize=1)
def tools_file() -> dict:
    return yaml.safe_load((PROMPTS / "tools.yaml").read_text())


def render(name: str, **ctx) -> str:
    return _env().get_template(name).render(**ctx)


@dataclass
class Prompt:
    """The rendered texts of one session; the loop serves `kernel` and `spec` from the read_* tools."""
    system: str
    task: str
    kernel: str
    spec: str
    context: dict


def kernel_text(path: Path) -> str:
    """A checkout's kernels/<op>.py for the prompt: a regular file inside that checkout (autokernel.paths), so a
    symlink to a file in your home is refused (exit 2), never sent to the model."""
    return paths.read_text(path, paths.checkout_of(path))


def _us(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e6:.2f}"


def shape_rows(op: str, corpus: list[dict], roof: dict) -> list[dict]:
    """corpus entries {shape, calls, dtype, now_s} -> table rows with the roofline floor and % of peak."""
    from autokernel.bench import roofline as roofline_mod
    spec, peak = opspecs.get(op), roofline_mod.from_description(roof)
    rows = []
    for c in corpus:
        dtype = getattr(torch, c["dtype"])
        nbytes, flop = spec.bytes_moved(c["shape"], dtype), spec.flops(c["shape"])
        floor_s = (roofline_mod.floor_ms(flop, nbytes, dtype, peak) / 1e3 or None) if peak else None
        now_s = c["now_s"]
        pct = 100 * floor_s / now_s if floor_s and now_s else None
        rows.append({"shape": ", ".join(f"{k}={v}" for k, v in c["shape"].items()),
                     "calls": c["calls"] or "-", "dtype": c["dtype"],
                     "mb": f"{nbytes / 1e6:.3f}", "mflop": f"{flop / 1e6:.3f}",
                     "intensity": f"{flop / nbytes:.2f}" if nbytes else "-",
                     "floor_us": _us(floor_s), "now_us": _us(now_s), "pct": "-" if pct is None else f"{pct:.2f}",
                     "_weight": c["calls"] or 1, "_floor_s": floor_s, "_now_s": now_s})
    return rows


def overall_pct(rows: list[dict]) -> float | None:
    """Call-weighted % of peak of the incumbent over the corpus, when every shape has a measured time."""
    if not rows or any(r["_now_s"] is None or r["_floor_s"] is None for r in rows):
        return None
    floor = sum(r["_weight"] * r["_floor_s"] for r in rows)
    now = sum(r["_weight"] * r["_now_s"] for r in rows)
    return 100 * floor / now


def corpus(op: str, trace: Mapping[str, Any] | None) -> tuple[list[dict], str]:
    """The shapes to optimise for, [{shape, calls, dtype, now_s}]: the trace's shape corpus (with its call counts
    and measured mean times) or, without a trace, the spec's model shapes (calls and times unknown)."""
    default = str(device.default_dtype()).removeprefix("torch.")
    entry = ((trace or {}).get("ops") or {}).get(op) or {}
    if entry.get("shapes"):
        return ([{"shape": dict(s["shape"]), "calls": int(s["calls"]), "dtype": s.get("dtype") or default,
                  "now_s": s["mean_ms"] / 1e3 if s.get("mean_ms") else None} for s in entry["shapes"]],
                f"traced: {(trace or {}).get('_path', 'the trace')}")
    return ([{"shape": dict(s), "calls": None, "dtype": default, "now_s": None} for s in opspecs.get(op).model_shapes],
            "the spec's model shapes; no trace given")


def roofline() -> dict:
    """The peaks the benchmark's % of peak is computed against (a trace's own roofline may differ on CPU)."""
    from autokernel.bench.roofline import describe
    return describe(device.fingerprint())


def _tolerance_rule() -> str:
    return (f"per output, max |out - ref64| <= {tolerance.EAGER_FACTOR:g} x (the error eager torch makes in the "
            f"same dtype) + {tolerance.ULPS:g} x eps(dtype) x max |ref64|; every element finite where the reference "
            f"is. Where the op amplifies rounding (attention over large logits, long float32 dot products), eager's "
            f"error counts as at least the float32 accumulation error these inputs allow, element by element (a "
            f"narrower significand is outside it). Accumulate in float32 where the spec says so.")


def _reasons() -> list[tuple[str, str]]:
    from autokernel.gate.verdict import REASONS
    extra = {"e2e.kl_exceeded": "the model's next-token distributions moved more than the policy allows",
             "e2e.degenerate_repetition": "greedy generation repeats a token where the unmodified engine did not",
             "bench.implausible": "faster than the roofline allows, or more than the implausible factor",
             "bench.no_win": "the weighted speedup's lower confidence bound does not clear the policy minimum"}
    order = ("static", "runtime", "numeric", "e2e", "bench", "sandbox")  # the gate's order, then the sandbox's
    rank = {stage: i for i, stage in enumerate(order)}
    return sorted({**REASONS, **extra}.items(), key=lambda kv: (rank.get(kv[0].split(".")[0], len(order)), kv[0]))


def allowlist() -> str:
    """The gate's grammar of a kernel file (autokernel.gate.allowlist.describe), so the model learns the rules from
    the prompt rather than by losing submissions to static rejections."""
    try:
        from autokernel.gate.allowlist import describe
    except ImportError:  # a gate without the allowlist module: the reason codes below still name every rule
        return "(the gate's allowlist is not available in this build: see the reason codes below)"
    return describe()


def feedback_text(fb, submissions_left: int, wall_s_left: float) -> str:
    """What the model reads after a submission: the verdict as JSON, the one-line summary first, with every static
    finding (not only the first), the numeric slack (worst error / tolerance: 1.0 is the limit) and the end-to-end
    KL where the gate got that far, and the budget left. The gate's seed is never shown: a later candidate must
    not be able to key on it."""
    d = fb.to_dict()
    stages = {s.get("name"): s.get("metrics") or {} for s in d.pop("stages", None) or []}
    for private in ("seed", "isolation"):
        d.pop(private, None)
    if stages.get("static", {}).get("findings"):
        d["static_findings"] = stages["static"]["findings"]
    if stages.get("numeric", {}).get("worst_error_ratio"):
        d["numeric_worst_error_over_tolerance"] = stages["numeric"]["worst_error_ratio"]
    e2e = {k: stages.get("e2e", {})[k] for k in ("kl_mean", "kl_p99", "kl_max", "top1", "noise_floor")
           if k in stages.get("e2e", {})}
    if e2e:
        d["e2e_kl_nats"] = e2e
    d["budget_left"] = {"submissions": submissions_left, "wall_s": round(wall_s_left, 1)}
    return json.dumps(d, indent=1, default=str)


def build(op: str, policy: AgentPolicy, trace: Mapping[str, Any] | None = None, *, kernel_file: Path) -> Prompt:
    """kernel_file: the target checkout's kernels/<op>.py (autokernel.paths: the caller's layout names it)."""
    spec = opspecs.get(op)
    path = Path(kernel_file)
    roof = roofline()
    shapes, shapes_source = corpus(op, trace)
    rows = shape_rows(op, shapes, roof)
    pct = overall_pct(rows)
    fp = device.fingerprint()
    gflops = ", ".join(f"{k} {v:.4g} GFLOP/s" for k, v in (roof.get("gflops") or {}).items())
    gbps = f"{roof['gbps']:.4g} GB/s" if roof.get("gbps") else "? GB/s"
    ctx = {
        "op": op, "doc": spec.doc, "reference_source": inspect.getsource(spec.reference).rstrip(),
        "signature": str(inspect.signature(spec.reference)), "tolerance": _tolerance_rule(),
        "dtypes": [str(d).removeprefix("torch.") for d in spec.dtypes], "shapes": rows,
        "shapes_source": shapes_source, "reasons": _reasons(), "kernel_source": kernel_text(path),
        "device": f"{fp['kind']}: {fp.get('gpu') or fp.get('cpu')} (torch {fp['torch']}, triton {fp['triton']})",
        "roofline": f"{gbps}; {gflops or '? FLOP/s'} ({roof.get('source', '?')})",
        "timing_note": fp.get("timing_note") or roof.get("note") or "",
        "overall": (f"The incumbent reaches {pct:.2f} % of the roofline over these shapes (call-weighted)."
                    if pct is not None else "No measured time for the incumbent yet: the first verdict gives it."),
        "max_iterations": policy.max_iterations, "max_tokens": policy.max_tokens, "max_usd": policy.max_usd,
        "max_wall_s": policy.max_wall_s, "max_checks": policy.max_checks,
        "target_pct": round(100 * policy.target_fraction_of_peak, 1),
        "incumbent_pct": pct, "default_dtype": str(device.default_dtype()).removeprefix("torch."),
        "corpus": shapes, "allowlist": allowlist(), "device_facts": context.device_facts(),
        "call_sites": context.call_sites(op), "siblings": context.sibling_sources(op, path.parent),
    }
    return Prompt(system=render("system.md", **ctx), task=render("task.md", **ctx), kernel=str(ctx["kernel_source"]),
                  spec=render("spec.md", **ctx), context=ctx)
