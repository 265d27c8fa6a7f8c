"""The offline search: knobs from the AST, legal complete candidate files, coordinate descent through the same loop."""
import ast
import json
import math
from pathlib import Path

import pytest
from agent_helpers import INCUMBENT

from autokernel.agent.evaluate import Feedback, SandboxEvaluator, sha256
from autokernel.agent.loop import Session
from autokernel.agent.prompt import Prompt, build
from autokernel.agent.search import (MAX_TILE_ELEMENTS, SearchModel, apply, coordinate_descent, find_knobs,
                                     grid_size)
from autokernel.policy import Agent, Policy

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


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


class Synthetic:
    """Feedback from the cost function, in the same JSON shape the real evaluator gives; rejects BLOCK_K < 32 the
    way the gate would reject a kernel that breaks on it."""

    def __init__(self):
        self.configs = []

    def evaluate(self, op, source):
        config = {k.name: k.default for k in find_knobs(source)}
        self.configs.append(config)
        if config["BLOCK_K"] < 32:
            return Feedback(op, sha256(source), "rejected", reasons=[
                {"stage": "numeric", "code": "numeric.mismatch", "detail": "BLOCK_K < 32 splits a Q4 block"}])
        s = synthetic_speedup(config)
        return Feedback(op, sha256(source), "accepted", accepted=s > 1.02, speedup=s, speedup_ci=[s * .98, s * 1.02],
                        pct_of_peak=20 * s)


@pytest.fixture(scope="module")
def matmul_prompt():
    return build("matmul", Agent())


def search_session(tmp_path, prompt, seed=0, max_iterations=60):
    ev = Synthetic()
    policy = Agent(max_iterations=max_iterations, target_fraction_of_peak=1.0)
    result = Session("matmul", SearchModel(seed), ev, prompt, policy, tmp_path).run()
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


@pytest.mark.slow
def test_search_candidates_pass_the_real_gate(tmp_path):
    """Two rmsnorm candidates from the search go through the real sandboxed gate (float32, normal values, to keep
    this test minutes, not tens) and the benchmark; every one of them must pass the gate."""
    import torch
    policy = Policy()
    policy.agent.max_iterations = 2
    policy.bench.max_time_s = 3.0
    ev = SandboxEvaluator(tmp_path, policy, verify_kwargs={"dtypes": [torch.float32], "dists": ["normal"]})
    prompt = build("rmsnorm", policy.agent)
    result = Session("rmsnorm", SearchModel(seed=0), ev, prompt, policy.agent, tmp_path).run()
    assert result.submitted == 2 and result.status == "limit", (result.status, result.detail)
    feedback = [json.loads((tmp_path / d / "feedback.json").read_text()) for d in
                sorted(p.name for p in tmp_path.iterdir() if (p / "feedback.json").is_file())]
    assert len(feedback) == 2
    for fb in feedback:
        assert fb["verdict"] == "accepted", fb["summary"]
        assert Path(fb["path"]).name == "rmsnorm.py" and Path(fb["path"]).parent.name == fb["sha256"][:8]
        assert fb["speedup"] is not None and fb["speedup_ci"][0] <= fb["speedup"] <= fb["speedup_ci"][1]
        assert fb["device"] == "cpu-interpreter"
        assert "num_warps=" in Path(fb["path"]).read_text()
