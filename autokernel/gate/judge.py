"""The parent's judgement of what a numeric job returned: every call, every output element, from its own data.

The child (autokernel.gate.child) returns raw observations per call: launches of the candidate's kernels, aten ops
seen, seconds, and the bytes of the outputs. Nothing it says is taken as truth (docs/design.md, parent-side
judgement): the parent knows which calls it asked for, what each call's inputs were, and what the reference gives
for them, so
- a call it asked for that is missing, unreadable, or not a list of plain tensors is a failure;
- each output's count, shape, dtype and layout must be the reference's (strides: contiguous where the reference is);
- each call must show a launch of the candidate's own kernel and no aten op outside the harness's allowlist;
- every element of every output is compared: poison left in place (never written), NaN/Inf where the float64
  reference is finite, error above the derived tolerance; repeats on equal inputs must give equal bits.
"""
from __future__ import annotations

import io
import re
from typing import Any

import torch

from autokernel.harness import INT_OF_SIZE, Reject, poisoned  # Reject: the one failure type of jobs and judges
from autokernel.ops.spec import OpSpec
from autokernel.ops.tolerance import References, compare_outputs, references

MODE_RANK = {("fresh", "a"): 0, ("copy", "a"): 1, ("refill", "b"): 2, ("refill", "t"): 3,
             ("config", "a"): 5}  # repeats (4) before the autotune configs


def as_list(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view(INT_OF_SIZE[t.element_size()])


# --- what came back ------------------------------------------------------------------------------------------------

def records(data: Any, asked: list[dict]) -> dict[str, dict]:
    """The child's per-call records, by call id, for the calls the parent asked for; type-checked. Outputs stay bytes
    until judged. A record for a call that was not asked for, or a malformed one, is runtime.incomplete."""
    got = data.get("calls") if isinstance(data, dict) else None
    if not isinstance(got, list):
        raise Reject("runtime.incomplete", "the job returned no list of calls")
    wanted = {c["id"] for c in asked}
    out: dict[str, dict] = {}
    for rec in got:
        ok = isinstance(rec, dict) and rec.get("id") in wanted and rec["id"] not in out \
            and type(rec.get("launches")) is int and isinstance(rec.get("outputs"), bytes) \
            and isinstance(rec.get("ops"), dict) \
            and all(type(k) is str and type(n) is int for k, n in rec["ops"].items())
        if not ok:
            raise Reject("runtime.incomplete", "the job returned a call record the gate did not ask for, twice, or "
                                               "malformed")
        out[rec["id"]] = rec
    return out


def check_runtime(rec: dict, where: str, allowed) -> None:
    """A launch of the candidate's own kernel, and nothing but allowlisted aten ops (child.ALLOWED_OPS)."""
    if rec["launches"] < 1:
        raise Reject("runtime.no_triton_launch", f"the call launched none of the candidate's @triton.jit kernels "
                                                 f"({where})")
    bad = sorted(k for k in rec["ops"] if k not in allowed)
    if bad:
        raise Reject("runtime.torch_compute", f"aten.{bad[0]}: torch compute outside the Triton kernel ({where})")


def outputs(rec: dict, where: str) -> list[torch.Tensor]:
    try:
        o = torch.load(io.BytesIO(rec["outputs"]), weights_only=True)
    except Exception as e:  # noqa: BLE001 -- bytes that are not a tensor list are a bad output, whatever they are
        raise Reject("numeric.bad_output", f"the outputs are unreadable ({type(e).__name__}; {where})") from None
    if not isinstance(o, list) or not all(type(t) is torch.Tensor for t in o):
        raise Reject("numeric.bad_output", f"the call returned something other than plain tensors ({where})")
    for i, t in enumerate(o):
        why = bloated(t)
        if why:
            raise Reject("numeric.bad_output", f"output {i}: {why} ({where})")
    return o


STORAGE_SLACK_BYTES = 1 << 16  # padding a storage may have past twice its elements' extent (alignment, a padded block)


def extent_bytes(t: torch.Tensor) -> int:
    """Bytes from a tensor's first element to its last, as laid out in its storage."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))) * t.element_size()


def bloated(t: torch.Tensor) -> str | None:
    """Why an output's storage is too big to ship: a narrow() view of a much larger buffer sends the whole buffer
    (bounded memory, docs/design.md); None if it is not."""
    have, need = t.untyped_storage().nbytes(), extent_bytes(t)
    if have > 2 * need + STORAGE_SLACK_BYTES:
        return (f"its storage holds {have} bytes for {need} bytes of elements: return a tensor of its own size, not "
                "a view of a larger buffer")
    return None


# --- one call against the reference ---------------------------------------------------------------------------------

def judge_call(outs: list, refs: References, poison: dict[str, int], where: str, worst: dict[str, float]) -> None:
    """Every element of every output of one call against the float64 reference:
    autokernel.ops.tolerance.compare_outputs, the one comparison the benchmark and the kernel tests use too. `worst`
    collects max error / bound per dtype."""
    j = compare_outputs(outs, refs.ref64, refs.eager, lambda t: poisoned(t, poison), refs.floors, refs.any_layout,
                        refs.declared, refs.elementwise)
    for name, ratio in j.ratios.items():
        worst[name] = max(worst.get(name, 0.0), ratio)
    if j.reason is not None:  # not j.ok
        raise Reject(j.reason, f"{j.detail} ({where})")


# --- one case: all its calls ------------------------------------------------------------------------------------------

def judge_case(spec: OpSpec, case, calls: list[dict], outs: dict[str, list], poison: dict[str, int],
               worst: dict[str, float], bitwise: bool) -> None:
    """All of a case's calls (payload dicts, each with its outputs in `outs`), in a fixed order whatever order they
    ran in, so a kernel's reason code does not depend on the secret schedule: fresh, copy, refill b, refill t, then
    repeats. Copies and repeats must reproduce the bits of the first call on the same values (bitwise), else they
    are judged against the reference like the others."""
    values = {"a": case.a, "b": case.b, "t": case.t}
    used = sorted({c["values"] for c in calls})
    refs: dict[str, References] = {}

    def ref(v: str) -> References:
        if v not in refs:
            refs[v] = references(spec, values[v])
        return refs[v]

    def stale(got: list, v: str, r: Reject) -> Reject:
        """An output that is the right answer for other values these tensors held is a cache or a replay."""
        w = next((w for w in used if w != v and _matches(got, ref(w), poison)), None)
        if w is None:
            return r
        return Reject("numeric.caching", f"{r.detail}; it is the answer for values the inputs held in another call "
                                         "(a stale output)")

    first: dict[str, tuple[list, dict]] = {}
    names = list((spec.extra.get("target") or {}).get("inplace") or ())  # a launcher's written outputs, by name
    for call in sorted(calls, key=lambda c: (MODE_RANK.get((c["mode"], c["values"]), 4), c["id"])):
        v = call["values"]
        where = f"{case.label()}{_scalars(values[v])}, {_describe(call)}"
        got = outs[call["id"]]
        try:
            if call["mode"] in ("copy", "repeat") and bitwise and v in first:
                _same_bits(got, *first[v], call, where)
            else:  # a "config" call too: another config may round otherwise, within tolerance
                judge_call(got, ref(v), poison, where, worst)
        except Reject as r:
            r = Reject(r.reason, _named(r.detail, names))
            raise (stale(got, v, r) if r.reason in ("numeric.mismatch", "numeric.nondeterministic") else r) from None
        if call["mode"] != "config":
            first.setdefault(v, (got, call))


def _matches(got: list, ref: References, poison: dict[str, int]) -> bool:
    """Would `got` pass as the answer for other values? (the signature of an output cache or replay)"""
    try:
        judge_call(got, ref, poison, "", {})
    except Reject:
        return False
    return True


def _scalars(kwargs: dict) -> str:
    """The call's number arguments (a drawn eps, theta, scale), for the message: a kernel exact only at the model's
    eps is seen failing at the eps it was given."""
    nums = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in kwargs.items()
            if type(v) in (int, float) and not k.startswith("_")][:6]
    return f" ({', '.join(nums)})" if nums else ""


def _named(detail: str, names: list[str]) -> str:
    """'output 1: ...' as 'output 1 (residual): ...' for a launcher whose outputs are arguments it writes."""
    m = re.match(r"output (\d+)", detail)
    if not m or int(m[1]) >= len(names):
        return detail
    return f"{m[0]} ({names[int(m[1])]}){detail[m.end():]}"


def _describe(call: dict) -> str:
    what = {"fresh": "fresh inputs", "copy": "the same values at new addresses",
            "refill": "the inputs refilled in place with " + ("new values" if call["values"] == "b" else
                                                              "a few elements changed"),
            "repeat": "the same inputs again",
            "config": f"the same values under distinct autotune config #{call.get('config', -1) + 1}"}[call["mode"]]
    return f"call on {what}, programs in {call['order']} order"


def _same_bits(got: list, ref: list, ref_call: dict, call: dict, where: str) -> None:
    if len(got) != len(ref):
        raise Reject("numeric.bad_output", f"{len(got)} outputs, {len(ref)} on the same inputs before ({where})")
    for i, (o1, o2) in enumerate(zip(ref, got)):
        if o1.shape != o2.shape or o1.dtype != o2.dtype or not torch.equal(bits(o1), bits(o2)):
            n = int((bits(o1) != bits(o2)).sum()) if o1.shape == o2.shape and o1.dtype == o2.dtype else o2.numel()
            raise Reject("numeric.nondeterministic", f"output {i}: {n} of {o2.numel()} elements differ in their "
                                                     f"bits from the call on equal inputs with programs in "
                                                     f"{ref_call['order']} order ({where})")
