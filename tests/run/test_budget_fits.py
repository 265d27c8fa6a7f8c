"""Budgets sized from measured candidate times (issue 23, item 3): under the CPU interpreter a candidate's gate and
bench cost ~130 s before its end-to-end check (run.CPU_GATE_AND_BENCH_S, measured), so an op is tried only where one
candidate fits its share of agent.max_wall_s; the shipped policies.yaml gives the ops of the real profile room for
that. Pure arithmetic over a trace's numbers: no timing, no sandbox."""
import io
from pathlib import Path

import pytest
from rich.console import Console

from autokernel import device, run
from autokernel.policy import Policy, load

ROOT = Path(__file__).parents[2]
# The default workload's profile on this project's CPU box (7 forwards): op -> total interpreter ms.
TRACE = {"ops": {"lm_head": {"calls": 7, "total_ms": 4814.3}, "matmul_q4_1": {"calls": 1470, "total_ms": 91148.7},
                 "attention_decode": {"calls": 180, "total_ms": 6190.8}, "rmsnorm": {"calls": 7, "total_ms": 128.1}}}


@pytest.fixture(autouse=True)
def cpu(monkeypatch):
    monkeypatch.setattr(device, "is_cuda", lambda: False)


def fits(op: str, pol: Policy) -> tuple[bool, str]:
    console = Console(file=io.StringIO(), width=400)
    return run.fits(op, TRACE, pol, console), console.file.getvalue()


def test_a_budget_of_100_s_a_candidate_fits_none():
    """The old shipped budget (300 s / 3 candidates) gave each candidate 100 s: less than the gate and bench alone
    take here, however cheap the op's end-to-end check."""
    ok, said = fits("rmsnorm", Policy.model_validate({"agent": {"max_wall_s": 300, "max_iterations": 3}}))
    assert not ok
    assert "skipping rmsnorm: one candidate would take ~130 s on the Triton interpreter (gate and bench ~130 s " \
           "measured, its end-to-end check ~0 s) and the budget is 100 s a candidate (agent.max_wall_s 300 / " \
           "agent.max_iterations 3)" in said


def test_the_shipped_policy_fits_a_candidate_of_the_ops_it_can_judge():
    pol = load(ROOT / "policies.yaml")
    assert pol.agent.max_wall_s / pol.agent.max_iterations >= run.CPU_GATE_AND_BENCH_S
    assert fits("rmsnorm", pol)[0] and fits("attention_decode", pol)[0]
    ok, said = fits("matmul_q4_1", pol)  # its end-to-end check alone: ~221 s under the interpreter
    assert not ok and "its end-to-end check ~221 s" in said


def test_the_search_skips_an_op_without_knobs_before_weighing_its_budget(tmp_path):
    """Why the offline search skips an op must not vary between nights with the profile's timings (a real nightly
    skipped rope for its budget one night and for having no launch meta-parameters the next): the searchable check
    comes first."""
    from delivery_doubles import ScriptedModel, StubEvaluator, write_trace

    from autokernel import paths
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "rmsnorm.py").write_text((ROOT / "kernels" / "rmsnorm.py").read_text())
    pol = Policy.model_validate({"agent": {"max_wall_s": 300, "max_iterations": 3}})  # the search; budget too small
    ctx = run.Context(paths.Layout(tmp_path), pol, pol.agent, ScriptedModel([]),
                      lambda op_dir, *a: StubEvaluator(op_dir), Console(file=io.StringIO()), yes=True)
    state, _ = run.pipeline(ctx, op=None, resume=None, trace=write_trace(tmp_path / "t"))
    assert "no launch meta-parameters" in state.skipped["rmsnorm"], state.skipped


def test_a_nightly_that_skipped_every_op_says_why_not_no_improvement(tmp_path):
    """The real CPU nightly of a checkout still at the old budget (300 s / 3) skipped every op and its pr.md said
    "no improvement ... no op was tried" with no reason: the skips are kept in the run's state and reported."""
    from delivery_doubles import ScriptedModel, StubEvaluator, write_trace

    from autokernel import paths
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "rmsnorm.py").write_text((ROOT / "kernels" / "rmsnorm.py").read_text())
    # an LLM provider: the offline search would skip rmsnorm first for having no launch meta-parameters
    pol = Policy.model_validate({"agent": {"max_wall_s": 300, "max_iterations": 3, "provider": "openai"}})
    ctx = run.Context(paths.Layout(tmp_path), pol, pol.agent, ScriptedModel([]),
                      lambda op_dir, *a: StubEvaluator(op_dir), Console(file=io.StringIO()), yes=True)
    state, outcomes = run.pipeline(ctx, op=None, resume=None, trace=write_trace(tmp_path / "t"))
    assert outcomes == [] and "budget is 100 s a candidate" in state.skipped["rmsnorm"]
    assert run.RunState.load(state.run_dir).skipped == state.skipped
    text = run.nightly_report(state, outcomes)
    assert text.startswith("# autokernel nightly: nothing tried\n") and "no improvement" not in text
    assert "- rmsnorm: one candidate would take ~130 s on the Triton interpreter" in text
