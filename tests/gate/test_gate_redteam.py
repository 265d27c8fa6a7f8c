"""The red team, legitimate rewrites: each goes through the whole gate (sandbox included) on a quick case grid (one
traced shape plus the unseen ones, float32, the distributions its header asks for) and must be accepted. The cheats
are test_gate_cheats.py (the whole gate) and test_gate_defence.py (runtime and numeric alone, the static stage
skipped); fixtures the static stage rejects are checked in test_gate_static.py (no sandbox needed). The fixtures and
the shared job runner: gate_fixtures.py.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gate_fixtures import e2e_fails, fixtures, full, module_jobs, params

from autokernel.gate import StageResult, Verdict, judge, numeric, schedule, verify
from autokernel.ops import get
from autokernel.ops.tolerance import References
from autokernel.paths import INSTALLED_LAYOUT
from autokernel.policy import Policy

PROJECT = Path(__file__).resolve().parents[2]
LEGIT = [f for f in fixtures() if f.expect == "accepted"]


@pytest.fixture(scope="module")
def jobs(request, tmp_path_factory):
    hook = next(f for f in LEGIT if f.path.stem == "legit_block_warps")
    yield from module_jobs(request, tmp_path_factory, lambda fx, run_dir: (full, fx, run_dir / "full"),
                           {"test_stage_hook_runs_after_numeric": lambda run_dir: (full, hook, run_dir / "hook",
                                                                                   [e2e_fails])})


@pytest.mark.parametrize("fx", params(LEGIT))
def test_legit_rewrite_is_accepted(fx, jobs):
    v = jobs[("test_legit_rewrite_is_accepted", fx.id)].result()
    assert v.accepted, f"{fx.id}: {v.reason}: {v.detail}"
    assert [s.name for s in v.stages] == ["static", "runtime", "numeric"]
    assert v.stages[1].metrics["launches"] >= v.stages[1].metrics["calls"] > 0


def test_stage_hook_runs_after_numeric(jobs):
    """An appended stage (the end-to-end KL stage's slot) runs once numeric passed, on the gate's copy."""
    v = jobs["test_stage_hook_runs_after_numeric"].result()
    assert [s.name for s in v.stages] == ["static", "runtime", "numeric", "e2e"]
    assert v.verdict == "rejected" and v.reason == "e2e.kl_exceeded" and "rmsnorm.py for rmsnorm" in v.detail


def test_stage_hook_skipped_after_a_failure(tmp_path):
    seen = []

    def stage(op, candidate, policy, *, kernels_dir=None, measured=None, deadline=None):
        seen.append(op)
        return StageResult.ok("e2e")

    fx = next(f for f in fixtures() if f.path.stem == "call_torch_rsqrt")
    v = verify(fx.op, fx.path, run_dir=tmp_path, kernels_dir=INSTALLED_LAYOUT.kernels, stages=[stage])
    assert v.reason == "static.forbidden_call" and seen == [] and [s.name for s in v.stages] == ["static"]


def test_verdict_is_a_plain_json_value(tmp_path):
    fx = next(f for f in fixtures() if f.path.stem == "fallback_try_except")
    v = verify(fx.op, fx.path, run_dir=tmp_path, kernels_dir=INSTALLED_LAYOUT.kernels, seed=7)
    on_disk = Verdict.from_dict(__import__("json").loads((Path(v.run_dir) / "verdict.json").read_text()))
    assert on_disk.to_dict() == v.to_dict()
    d = v.to_dict()
    assert d["verdict"] == "rejected" and d["reason"] == "static.fallback" and d["seed"] == 7
    assert len(d["candidate_sha256"]) == 64 and d["device"]["kind"] in ("cuda", "cpu-interpreter")
    assert d["stages"][0]["name"] == "static" and d["elapsed_s"] >= 0


# --- the plan and the inputs (no sandbox) ----------------------------------------------------------------------------

def test_default_plan_is_thorough():
    spec = get("rmsnorm")
    planned = numeric.plan(spec, None, None, None, seed=5)
    shapes = {tuple(s.items()) for s, *_ in planned}
    assert {tuple(s.items()) for s in spec.model_shapes + spec.odd_shapes} < shapes  # plus larger and swept ones
    biggest = max(spec.flops(s) for s in spec.model_shapes)
    assert any(spec.flops(dict(s)) > biggest for s in shapes)
    assert {d for _, _, d, _ in planned} == set(numeric.DISTS) and {dt for _, dt, _, _ in planned} == set(spec.dtypes)
    ms = {dict(s)["M"] for s in shapes if dict(s)["N"] == 576}
    assert {1, 2, 3, 5, 7, 13, 31, 61, 127} <= ms and max(ms) > 96  # 1, primes, non-multiples, past the traced
    full = {(tuple(s.items()), dt) for s, dt, _, calls in planned if calls == schedule.FULL}
    assert len(full) >= (len(spec.model_shapes) + len(spec.odd_shapes) + 1) * len(spec.dtypes)
    assert len(planned) == len({(tuple(s.items()), dt, d) for s, dt, d, _ in planned})  # no case twice


def test_the_sweep_hides_a_secret_prime():
    """A threshold on M between the traced size and twice it cannot be placed where the gate never looks."""
    spec = get("rmsnorm")
    traced = [dict(s) for s in spec.model_shapes]
    secret = {s["M"] for seed in range(20) for s in schedule.sweep_shapes(spec, traced, seed)} - set(schedule.SWEEP)
    assert len({m for m in secret if 96 < m < 192}) >= 3


def test_trace_shapes_replace_model_shapes_and_unseen_ones_stay():
    spec = get("rmsnorm")
    planned = numeric.plan(spec, [{"M": 7, "N": 576}], [torch.float32], ["normal"])
    shapes = [s for s, *_ in planned]
    assert shapes[0] == {"M": 7, "N": 576} and {"M": 96, "N": 576} not in shapes
    assert all(dict(s) in shapes for s in spec.odd_shapes) and {"M": 15, "N": 576} in shapes


def test_inputs_follow_the_seed_and_only_the_seed():
    spec = get("rmsnorm")
    planned = numeric.plan(spec, None, [torch.float32], ["mixed"])[:2]
    a, b, c = (numeric.make_cases(spec, planned, s) for s in (1, 1, 2))
    assert torch.equal(a[0].a["x"], b[0].a["x"]) and not torch.equal(a[0].a["x"], c[0].a["x"])
    assert not torch.equal(a[0].a["x"], a[0].b["x"])  # the refill values are new values
    assert numeric.poison_bits(1) != numeric.poison_bits(2)


def test_child_never_receives_the_seed(tmp_path):
    seen = {}

    class Fake:
        ok, reason, detail, wall_s, isolation = False, "sandbox.error", "stop here", 0.0, "none"

    def fake_run(entry, payload, job_dir, limits, inputs=None):
        seen.update(payload=payload, files=sorted(inputs or {}))
        return Fake()

    spec = get("rmsnorm")
    seed = 987654321987654321
    planned = numeric.plan(spec, None, [torch.float32], ["normal"])
    (tmp_path / "rmsnorm.py").write_text("")
    runtime, _ = numeric.run(spec, tmp_path / "rmsnorm.py", tmp_path, Policy().sandbox, seed, planned,
                             sandbox_run=fake_run)
    assert runtime.reason == "sandbox.error"
    assert str(seed) not in repr(seen["payload"]) and "seed" not in repr(seen["payload"])
    assert seen["files"] and all(f.endswith(".pt") or f == "rmsnorm.py" for f in seen["files"])


def test_broken_eager_does_not_make_the_tolerance_unfailable():
    """fp16 'wide' rows overflow eager torch's x.pow(2) (eager returns zeros); the bound must still be tight."""
    spec = get("rmsnorm")
    gen = torch.Generator().manual_seed(0)
    kw = spec.make_inputs({"M": 8, "N": 576}, torch.float16, "cpu", gen, "wide")
    from autokernel.ops.spec import upcast
    ref64 = spec.reference(**upcast(kw))
    eager = spec.reference(**kw)
    wrong = (ref64 * 1.01).to(torch.float16)  # 1% off everywhere: must fail
    with pytest.raises(judge.Reject) as e:
        judge.judge_call([wrong], References([ref64], [eager], [None]), {}, "test", {})
    assert e.value.reason == "numeric.mismatch"
    right = ref64.to(torch.float16)
    judge.judge_call([right], References([ref64], [eager], [None]), {}, "test", {})


# --- the call schedule (no sandbox) -----------------------------------------------------------------------------------

def test_calls_are_interleaved_in_a_secret_order_that_keeps_each_cases_own():
    import random
    per_case = [schedule.case_steps(f"c{i}", schedule.FULL if i % 2 else schedule.SINGLE, random.Random(i))
                for i in range(8)]
    runs = [schedule.interleave(per_case, seed, 0) for seed in (1, 2)]
    for calls in runs:
        for c in per_case:
            assert [(k.mode, k.values) for k in calls if k.case == c.case] == c.steps
        assert all(k.order == {"fresh": "asc", "copy": "desc"}.get(k.mode, "shuffle") for k in calls)
    assert [k.case for k in runs[0]] != [k.case for k in runs[1]]
    counts = {len(schedule.interleave([schedule.case_steps("c", schedule.FULL, random.Random(s))], 0, 0))
              for s in range(20)}
    assert len(counts) > 1  # how many calls a case gets is not fixed either


def test_a_tweak_changes_a_few_elements_in_place_and_keeps_views():
    spec = get("rope")
    a, b = (spec.make_inputs({"B": 2, "T": 5, "H": 3, "D": 8}, torch.float32, "cpu", torch.Generator().manual_seed(s),
                             "normal") for s in (1, 2))
    t = schedule.tweak(a, b, 7)
    assert t["x"].stride() == a["x"].stride() and t["x"].storage_offset() == a["x"].storage_offset()
    changed = int((t["x"] != a["x"]).sum())
    assert 1 <= changed <= max(1, a["x"].numel() // 32) and torch.equal(t["x"][t["x"] != a["x"]],
                                                                          b["x"][t["x"] != a["x"]])


def test_far_rope_positions_reach_the_context():
    from autokernel.ops.rope import CONTEXT, make_positions
    pos = make_positions(4, 24, "cpu", torch.Generator().manual_seed(0))
    assert int(pos.max()) > CONTEXT - 64 and int(pos.max()) < CONTEXT and int(pos.min()) >= 0


@pytest.mark.parametrize("op, arg, lo, hi, model", [
    ("rope", "theta", 1e4, 1e6, 100000.0), ("softmax", "temperature", 0.1, 2.0, 0.7),
    ("rmsnorm", "eps", 1e-6, 1e-5, 1e-5), ("add_rmsnorm", "eps", 1e-6, 1e-5, 1e-5),
    ("attention", "scale", 0.5 / 8, 2.0 / 8, 1 / 8), ("attention_decode", "scale", 0.5 / 8, 2.0 / 8, 1 / 8)])
def test_scalars_are_drawn_per_case_from_the_secret_seed(op, arg, lo, hi, model):
    """A kernel that ignores rope's theta or softmax's temperature was accepted while every case had the model's
    value (issue 25): each case draws its scalar from the case's generator, over the production range, the model's
    own value among the draws; the same seed gives the same value."""
    spec = get(op)
    shape = dict(spec.model_shapes[0])

    def drawn(seed: int) -> float:
        return spec.make_inputs(shape, torch.float32, "cpu", torch.Generator().manual_seed(seed))[arg]
    values = [drawn(s) for s in range(64)]
    assert all(lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9) for v in values), (min(values), max(values))
    assert len(set(values)) > 16 and model in values and drawn(5) == values[5]
    assert min(values) < lo * 2 and max(values) > hi / 2  # the range's ends are reached, not one corner
