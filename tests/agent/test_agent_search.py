"""The offline search: knobs from the AST, legal complete candidate files, coordinate descent through the same loop;
on CPU only the knobs the interpreter feels, steps only on intervals that clear the bar, inside the wall budget."""
import ast
import json
import math
from pathlib import Path

import pytest
from agent_helpers import INCUMBENT, PLANTED, WholeEvaluator

from autokernel.agent.evaluate import Feedback, SandboxEvaluator
from autokernel.agent.loop import Session
from autokernel.agent.prompt import Prompt, build
from autokernel.agent.search import MAX_TILE_ELEMENTS, SearchModel, apply, coordinate_descent, find_knobs, grid_size
from autokernel.policy import Agent, Policy

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
OPS = sorted(p.stem for p in KERNELS.glob("*.py") if not p.name.startswith("_"))


def knobs_of(op):
    return {k.name: (k.value, k.default) for k in find_knobs((KERNELS / f"{op}.py").read_text())}


def test_knobs_are_launch_literals_and_triton_defaults():
    assert knobs_of("matmul") == {"BLOCK_M": (32, 32), "BLOCK_N": (64, 64), "BLOCK_K": (128, 128),
                                  "num_warps": (4, 4), "num_stages": (None, 3)}
    assert knobs_of("silu_mul") == {"BLOCK": (1024, 1024), "num_warps": (4, 4), "num_stages": (None, 3)}
    # blocks the launcher computes from the shape (next_power_of_2(N)) and semantic constants (QK=QK) are not free
    assert knobs_of("rmsnorm") == {"num_warps": (None, 4), "num_stages": (None, 3)}
    assert knobs_of("rope") == {"num_warps": (2, 2), "num_stages": (None, 3)}
    assert "QK" not in knobs_of("embedding_q8_0")


def test_apply_edits_only_the_literals():
    src = (KERNELS / "matmul.py").read_text()
    knobs = find_knobs(src)
    assert apply(src, knobs, {}) == src  # the incumbent's own config is the incumbent
    out = apply(src, knobs, {"BLOCK_M": 64, "BLOCK_K": 32, "num_warps": 8, "num_stages": 3})
    assert "BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=8," in out
    assert "num_stages" not in out  # Triton's default stays implicit
    ast.parse(out)
    assert [ln for ln in out.splitlines() if "BLOCK" not in ln] == [ln for ln in src.splitlines() if "BLOCK" not in ln]
    out = apply(INCUMBENT, find_knobs(INCUMBENT), {"num_warps": 2, "num_stages": 1})
    assert "BLOCK_N=BLOCK_N, num_warps=2, num_stages=1)" in out
    ast.parse(out)


def test_two_launches_get_distinct_knobs():
    src = INCUMBENT + "\n\ndef twice(x, weight, eps):\n    y = torch.empty_like(x)\n" \
                      "    rmsnorm_kernel[(1,)](x, weight, y, 1, 1, 1, eps, BLOCK_N=64, num_warps=2)\n    return y\n"
    names = [k.name for k in find_knobs(src)]
    assert names == ["num_warps@0", "num_stages@0", "BLOCK_N", "num_warps@1", "num_stages@1"]


OPTIMUM = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 8, "num_stages": 4}
START = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3}


def synthetic_speedup(config):
    """A smooth bowl in log2 space around OPTIMUM, relative to the incumbent: 1.0 at START, ~2.5x at the optimum."""
    def fit(c):
        return math.exp(-0.15 * sum((math.log2(c[k]) - math.log2(v)) ** 2 for k, v in OPTIMUM.items()))
    return fit(config) / fit(START)


class Synthetic(WholeEvaluator):
    """Feedback from the cost function, in the same JSON shape the real evaluator gives; rejects BLOCK_K < 32 the
    way the gate would reject a kernel that breaks on it."""

    def __init__(self):
        self.configs = []

    def evaluate(self, candidate, deadline=None):
        op, source = candidate.op, candidate.text
        config = {k.name: k.default for k in find_knobs(source)}
        self.configs.append(config)
        if config["BLOCK_K"] < 32:
            return Feedback(op, candidate.sha256, "rejected", reasons=[
                {"stage": "numeric", "code": "numeric.mismatch", "detail": "BLOCK_K < 32 splits a Q4 block"}])
        s = synthetic_speedup(config)
        return Feedback(op, candidate.sha256, "accepted", accepted=s > 1.02, speedup=s, speedup_ci=[s * .98, s * 1.02],
                        pct_of_peak=20 * s)


@pytest.fixture(scope="module")
def matmul_prompt():
    return build("matmul", Agent(), kernel_file=KERNELS / "matmul.py")


def search_session(tmp_path, prompt, seed=0, max_iterations=60):
    """The search as on CUDA (num_warps / num_stages searched too), against the synthetic cost."""
    ev = Synthetic()
    policy = Agent(max_iterations=max_iterations, target_fraction_of_peak=1.0)
    result = Session("matmul", SearchModel(seed, interpreter=False), ev, prompt, policy, tmp_path).run()
    return result, ev


def test_search_finds_the_optimum_of_a_synthetic_cost(tmp_path, matmul_prompt):
    result, ev = search_session(tmp_path, matmul_prompt)
    best = {k.name: k.default for k in find_knobs(result.best.source)}
    assert best == OPTIMUM and result.best.feedback.speedup == pytest.approx(synthetic_speedup(OPTIMUM))
    assert result.status == "finished" and "converged" in result.detail
    assert len(ev.configs) < 40 < grid_size(find_knobs(matmul_prompt.kernel)) / 100  # 33275 configs in the grid
    assert len({json.dumps(c, sort_keys=True) for c in ev.configs}) == len(ev.configs)  # nothing evaluated twice
    t = json.loads((tmp_path / "transcript.json").read_text())
    assert t["model"] == "search:seed=0" and t["messages"][2]["tool_calls"][0]["name"] == "read_kernel"
    assert t["usage"] == {"input_tokens": 0, "output_tokens": 0, "usd": 0.0, "price_per_mtok": None}


def test_search_is_deterministic_for_a_seed(tmp_path, matmul_prompt):
    a = search_session(tmp_path / "a", matmul_prompt, seed=3, max_iterations=8)[1].configs
    b = search_session(tmp_path / "b", matmul_prompt, seed=3, max_iterations=8)[1].configs
    c = search_session(tmp_path / "c", matmul_prompt, seed=4, max_iterations=8)[1].configs
    assert a == b and a != c


def test_search_respects_the_iteration_budget(tmp_path, matmul_prompt):
    result, ev = search_session(tmp_path, matmul_prompt, max_iterations=5)
    assert len(ev.configs) == 5 and result.status == "limit"
    assert result.best is not None and result.best.feedback.speedup > 1.0  # climbing from the first steps


def test_proposals_stay_legal():
    knobs = find_knobs((KERNELS / "matmul.py").read_text())
    gen, seen, score = coordinate_descent(knobs, seed=1), [], None
    try:
        while True:
            config = gen.send(score) if seen else next(gen)
            seen.append(config)
            assert config["BLOCK_M"] * config["BLOCK_N"] * config["BLOCK_K"] <= MAX_TILE_ELEMENTS
            assert all(config[k.name] in k.choices and config[k.name] >= 16 for k in knobs if "BLOCK" in k.name)
            score = float(config["BLOCK_M"])  # bigger BLOCK_M is always better: only legality stops the climb
    except StopIteration:
        pass
    # the climb in BLOCK_M went right up to the tile limit, and no further
    assert any(c["BLOCK_M"] * c["BLOCK_N"] * c["BLOCK_K"] == MAX_TILE_ELEMENTS for c in seen)


def test_nothing_to_tune_finishes_at_once(tmp_path):
    src = "import torch\nimport triton\n\n\ndef rmsnorm(x, weight, eps):\n    return x\n"
    prompt = Prompt(system="s", task="t", kernel=src, spec="spec", context={})
    result = Session("rmsnorm", SearchModel(), Synthetic(), prompt, Agent(), tmp_path).run()
    assert result.status == "finished" and "no tunable launch meta-parameters" in result.detail


def test_interpreter_searches_only_what_it_can_feel(tmp_path, matmul_prompt):
    """num_warps / num_stages change nothing under the Triton interpreter: on CPU they are neither found nor
    inserted, so no evaluation is spent on them (the incumbent rmsnorm, whose only block is computed, has none)."""
    src = (KERNELS / "matmul.py").read_text()
    assert [k.name for k in find_knobs(src, launch_options=False)] == ["BLOCK_M", "BLOCK_N", "BLOCK_K"]
    assert find_knobs(INCUMBENT, launch_options=False) == []
    ev = Synthetic()
    Session("matmul", SearchModel(interpreter=True), ev, matmul_prompt,
            Agent(max_iterations=60, target_fraction_of_peak=1.0), tmp_path / "m").run()
    assert ev.configs and all(c["num_warps"] == 4 and c["num_stages"] == 3 for c in ev.configs)
    prompt = Prompt(system="s", task="t", kernel=INCUMBENT, spec="spec", context={})
    result = Session("rmsnorm", SearchModel(interpreter=True), Synthetic(), prompt, Agent(), tmp_path / "r").run()
    assert result.submitted == 0 and "no tunable launch meta-parameters" in result.detail


def test_blocks_bound_to_a_name_are_knobs():
    """`BLOCK_N=BLOCK_N` with one `BLOCK_N = 256` in the launcher (or the module) is the same knob as a literal;
    a name the launcher computes or binds twice is not."""
    in_launcher = PLANTED.replace("eps, BLOCK_N=256)", "eps, BLOCK_N=BLOCK_N)").replace(
        "    y = torch.empty((M, N)", "    BLOCK_N = 256\n    y = torch.empty((M, N)")
    knobs = find_knobs(in_launcher, launch_options=False)
    assert [(k.name, k.value) for k in knobs] == [("BLOCK_N", 256)]
    out = apply(in_launcher, knobs, {"BLOCK_N": 1024})
    assert "    BLOCK_N = 1024\n" in out and "BLOCK_N=BLOCK_N)" in out
    assert out.count("1024") == PLANTED.count("1024") + 1
    at_module = PLANTED.replace("eps, BLOCK_N=256)", "eps, BLOCK_N=CHUNK)").replace(
        "\n\n@triton.jit", "\nCHUNK = 256\n\n\n@triton.jit", 1)
    assert [(k.name, k.value) for k in find_knobs(at_module, launch_options=False)] == [("BLOCK_N", 256)]
    twice = in_launcher.replace("    BLOCK_N = 256\n", "    BLOCK_N = 256\n    if N > 4096:\n        BLOCK_N = 128\n")
    assert find_knobs(twice, launch_options=False) == []


@pytest.mark.parametrize("op", OPS)
def test_every_proposal_passes_the_static_stage(op):
    """The search edits only the literals of launch meta-parameters: each neighbour of each knob (CUDA's
    num_warps / num_stages included) is a file the real static stage accepts, as the incumbent is."""
    from autokernel.gate import static
    src = (KERNELS / f"{op}.py").read_text()
    assert static.check_source(src, op, KERNELS / f"{op}.py").passed
    knobs = find_knobs(src)
    proposals = [apply(src, knobs, {k.name: k.choices[j]}) for k in knobs
                 for j in (k.choices.index(k.default) - 1, k.choices.index(k.default) + 1) if 0 <= j < len(k.choices)]
    assert proposals or op == "rmsnorm"
    for p in proposals:
        verdict = static.check_source(p, op, KERNELS / f"{op}.py")
        assert verdict.passed, (op, verdict.reason, verdict.detail)


PLANTED_BLOCK = 256


def interpreter_ms(block: int, n: int = 576) -> float:
    """The planted kernel's cost under the interpreter, as a model: two passes of ceil(n / block) chunks, each a
    fixed round of numpy calls plus a per-element part (fastest at 1024, one chunk, ~2x over 256 as measured on the
    issue's planted file; 2048 only adds masked work)."""
    return 2 * math.ceil(n / block) * (1.0 + block / 1280)


class PlantedScorer(WholeEvaluator):
    """A fast, deterministic stand-in for gate + bench on the planted file: the real static stage, then the speedup
    interpreter_ms predicts over the planted incumbent with a +-2 % interval, as the real evaluator reports it."""

    def __init__(self, clock_step_s: float = 0.0, now: list | None = None):
        self.blocks: list[int] = []
        self.sources: list[str] = []
        self.clock_step_s, self.now = clock_step_s, now

    def evaluate(self, candidate, deadline=None):
        from autokernel.gate import static
        op, source = candidate.op, candidate.text
        if self.now is not None:
            self.now[0] += self.clock_step_s
        self.sources.append(source)
        self.blocks.append(find_knobs(source, launch_options=False)[0].default)
        verdict = static.check_source(source, op, KERNELS / f"{op}.py")
        if not verdict.passed:
            return Feedback(op, candidate.sha256, "rejected",
                            reasons=[{"stage": "static", "code": verdict.reason, "detail": verdict.detail}])
        s = interpreter_ms(PLANTED_BLOCK) / interpreter_ms(self.blocks[-1])
        return Feedback(op, candidate.sha256, "accepted", accepted=0.98 * s > 1.02, speedup=round(s, 4),
                        speedup_ci=[round(0.98 * s, 4), round(1.02 * s, 4)], device="cpu-interpreter")


def planted_prompt():
    return Prompt(system="s", task="t", kernel=PLANTED, spec="spec", context={})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_search_finds_the_planted_block_size(tmp_path, seed):
    ev = PlantedScorer()
    result = Session("rmsnorm", SearchModel(seed, interpreter=True), ev, planted_prompt(),
                     Agent(max_iterations=20, target_fraction_of_peak=1.0), tmp_path).run()
    assert result.status == "finished" and "converged" in result.detail
    assert find_knobs(result.best.source, launch_options=False)[0].default == 1024
    assert result.best.feedback.speedup == pytest.approx(interpreter_ms(256) / interpreter_ms(1024), abs=1e-3)
    assert not any("num_warps" in s or "num_stages" in s for s in ev.sources)
    assert ev.blocks == [512, 1024, 2048]  # larger blocks first under the interpreter; 2048 does not pay


def test_a_step_needs_its_interval_to_clear_the_bar():
    """A noisy 1.005 (interval [0.995, 1.015]) is not a direction: both neighbours are tried and the search stops.
    The same climb with intervals that clear bench.min_speedup goes all the way."""
    knobs = find_knobs(PLANTED, launch_options=False)
    gen = coordinate_descent(knobs, seed=0, min_gain=1.02)
    tried = [next(gen)["BLOCK_N"]]
    with pytest.raises(StopIteration):
        while True:
            tried.append(gen.send((1.005, 0.995))["BLOCK_N"])
    assert sorted(tried) == [128, 512]
    gen = coordinate_descent(knobs, seed=0, min_gain=1.02)
    tried = [next(gen)["BLOCK_N"]]
    with pytest.raises(StopIteration):
        while True:
            b = tried[-1]
            tried.append(gen.send((b / 256, 0.99 * b / 256) if b > 256 else None)["BLOCK_N"])
    assert 1024 in tried and max(tried) == 16384  # a monotone climb is followed to the largest legal block


def test_search_stops_when_another_evaluation_cannot_fit(tmp_path):
    """Each evaluation takes 100 s on a 250 s budget: after the second (200 s) the 50 s left cannot fit a third,
    so the search finishes instead of starting one that would overrun the budget."""
    now = [0.0]
    ev = PlantedScorer(clock_step_s=100.0, now=now)
    clock = lambda: now[0]  # noqa: E731
    result = Session("rmsnorm", SearchModel(interpreter=True, clock=clock), ev, planted_prompt(),
                     Agent(max_wall_s=250, max_iterations=20, target_fraction_of_peak=1.0), tmp_path,
                     clock=clock).run()
    assert len(ev.blocks) == 2 and result.status == "finished"
    assert result.detail.startswith("stopped after 2 candidates: another evaluation takes ~100 s")
    assert "50 s of the wall-clock budget" in result.detail and now[0] == 200.0



SLOW_WALL_S = 900.0  # the wall budget of the real search below: ample (see its docstring), so it never cuts it short
PLANTED_WIN_N = 1024  # the real search's row width: 4, 2 and 1 chunks a pass at BLOCK_N 256, 512 and 1024


@pytest.mark.slow
def test_search_finds_the_planted_win_through_the_real_evaluator(tmp_path):
    """One real offline search on CPU: the planted file is the incumbent of a temporary checkout, every candidate
    goes through the sandboxed gate (static, runtime, numeric on float32 normal inputs, no range sweep) and the
    interleaved benchmark against the planted incumbent, on one traced shape (M 4 x N 1024). The search must find the
    planted win, BLOCK_N 1024: accepted by the bench (its interval's lower bound clears bench.min_speedup) at a point
    estimate >= 1.5x (Triton-interpreter timings), inside the wall budget, every candidate passing the gate. Two
    candidates, the search's first two steps up from BLOCK_N 256: 512 (a step: its interval's lower bound must clear
    bench.min_speedup) and 1024; its third, 2048, adds minutes and proves nothing more. The end-to-end KL stage is
    left out here: a real gate with it, on a real candidate, through `autokernel run`, is tests/run/test_run_e2e.py,
    and the stage itself on the live model is tests/gate/test_gate_e2e.py.
    The margin under load: six rounds make the interval [min, max] of six ratios, and on a loaded machine (2 xdist
    workers on 2 cores, load 5-10) the worst round measured 0.67x the point estimate (2.13x [1.42, 2.43]). A step
    therefore needs ~1.02 / 0.67 = 1.5x to be one under such load. On N 576 (the model's width, 256 -> 512 is 3 -> 2
    chunks a pass) the step to 512 measured 1.43x [1.40, 1.50] idle: a loaded round could drop its lower bound under
    1.02, the search then turned down to 128 and missed 1024 (this test failed under load). On N 1024 every step up
    halves the chunks a pass (4 -> 2 -> 1: ~1.7x, then ~1.6x, by interpreter_ms), so a round at 0.67x still clears
    the bar, and 1024 over the incumbent still clears 1.5x: measured 512 1.73x [1.67, 1.88], 1024 2.99x [2.89, 3.11]
    (on N 576, side by side: 1.38x [1.27, 1.43] and 2.32x [2.17, 2.44]); 66 s, as on N 576 (64 s), at load ~3.
    Ten rounds, not the default six: at six the 95% interval of the median is [min, max] of the rounds' ratios, so one
    round slowed by load sets the lower bound (0.67x on a loaded machine: 1.73 x 0.67 = 1.16 clears 1.02, but a slower
    CPU's smaller step or a worse round need not); at ten it is the 2nd lowest to the 2nd highest (P(Binomial(10, 1/2)
    <= 1) = 1.1% <= 2.5%, bench/stats.py _order_stat_k), and one bad round no longer decides the step. A lower step
    bar in SearchModel would not help: the step's score exists only if the bench accepted, at bench.min_speedup."""
    import shutil
    import time

    import torch

    from autokernel.paths import Layout
    root = tmp_path / "checkout"
    shutil.copytree(KERNELS, root / "kernels")
    (root / "kernels" / "rmsnorm.py").write_text(PLANTED)
    policy = Policy()
    policy.agent.max_wall_s, policy.agent.max_iterations, policy.agent.target_fraction_of_peak = SLOW_WALL_S, 2, 1.0
    policy.bench.max_time_s = 10.0
    policy.bench.job_time_s = 0.3  # timed CPU seconds per bench job (default 1.0): the 2x win stands out at 0.3
    policy.bench.rounds = 10  # the lower bound is then the 2nd lowest round's, not the lowest's (docstring)
    from delivery_doubles import write_trace
    trace = write_trace(tmp_path / "trace")  # one traced shape (the spec's three include a 96-row one), 4 x 1024 here:
    summary = json.loads((trace / "summary.json").read_text())  # each step up from 256 halves the chunks (docstring)
    summary["ops"]["rmsnorm"]["shapes"][0]["shape"]["N"] = PLANTED_WIN_N
    (trace / "summary.json").write_text(json.dumps(summary))
    policy.gate.max_rows = 0  # no production-range sweep (M up to 1024: tests/gate/test_gate_coverage.py)
    run_dir = tmp_path / "run"
    ev = SandboxEvaluator(run_dir, policy, trace=trace, layout=Layout(root),
                          verify_kwargs={"dtypes": [torch.float32], "dists": ["normal"], "stages": []})
    prompt = build("rmsnorm", policy.agent, kernel_file=root / "kernels" / "rmsnorm.py")
    t0 = time.monotonic()
    result = Session("rmsnorm", SearchModel(seed=0, min_speedup=policy.bench.min_speedup), ev, prompt, policy.agent,
                     run_dir).run()
    elapsed_s = time.monotonic() - t0
    messages = json.loads((run_dir / "transcript.json").read_text())["messages"]
    blocks = [find_knobs(c["arguments"]["source"], launch_options=False)[0].default for m in messages
              for c in m.get("tool_calls") or [] if c["name"] == "submit_candidate"]
    verdicts = [json.loads(p.read_text()) for p in run_dir.glob("*/feedback.json")]
    print(f"\nreal search: {elapsed_s:.0f} s, {result.submitted} candidates (BLOCK_N {blocks}), {result.status}: "
          f"{result.detail}; " + "; ".join(v["summary"] for v in verdicts))
    assert result.best is not None, result.detail
    fb = result.best.feedback
    assert fb.accepted and fb.device == "cpu-interpreter" and fb.speedup >= 1.5, fb.summary
    assert fb.speedup_ci[0] > policy.bench.min_speedup, fb.summary
    assert find_knobs(result.best.source, launch_options=False)[0].default == 1024
    assert blocks == [512, 1024] and result.submitted == 2  # larger blocks first under the interpreter
    assert all([s["name"] for s in v["stages"] if s["name"] != "bench"] == ["static", "runtime", "numeric"]
               for v in verdicts), verdicts  # every candidate through the gate's three stages, the e2e one left out
    assert elapsed_s <= SLOW_WALL_S + 60  # the budget, plus at most the tail of the evaluation running at its end
    assert len(verdicts) == result.submitted  # every candidate passed the gate; only the bench may say "no win"
    assert all(v["verdict"] == "accepted" or v["reasons"][0]["stage"] == "bench" for v in verdicts), verdicts


def test_autotune_configs_are_knobs_and_every_proposal_passes_the_static_stage():
    """An @triton.autotune kernel (vLLM and Liger ship them) had nothing the offline search could change: its launch
    passes no BLOCK literal. Each Config's literal *BLOCK* entries are knobs now (num_warps / num_stages too where
    launches compile), named by config; every neighbour is a file the static stage accepts."""
    from autokernel.gate import static
    path = Path(__file__).parents[1] / "gate" / "fixtures" / "rmsnorm" / "legit_autotune_configs.py"
    src = path.read_text()
    knobs = find_knobs(src, launch_options=False)
    assert [(k.name, k.value) for k in knobs] == [("BLOCK_N@config0", 256), ("BLOCK_N@config1", 128),
                                                  ("BLOCK_N@config2", 512)]
    assert {k.name for k in find_knobs(src)} >= {"num_warps@config2", "num_stages@config0"}
    out = apply(src, knobs, {"BLOCK_N@config1": 64})
    assert out.replace('triton.Config({"BLOCK_N": 64}', 'triton.Config({"BLOCK_N": 128}') == src
    incumbent = KERNELS / "rmsnorm.py"
    every = find_knobs(src)
    for k in every:
        for j in (k.choices.index(k.default) - 1, k.choices.index(k.default) + 1):
            if 0 <= j < len(k.choices):
                changed = apply(src, every, {k.name: k.choices[j]})
                assert changed != src
                v = static.check_source(changed, "rmsnorm", incumbent)
                assert v.passed, (k.name, v.reason, v.detail)
