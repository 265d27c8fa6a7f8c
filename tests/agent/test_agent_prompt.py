"""What the model is told comes from the templates and the trusted side: kernel, spec, shapes, roofline, rules."""
import inspect

import jinja2
import pytest
from agent_helpers import KERNEL_FILE

from autokernel.agent import prompt
from autokernel.gate.verdict import REASONS
from autokernel.ops import get
from autokernel.policy import Agent


def test_task_has_kernel_spec_reference_shapes_device_and_budget(rmsnorm_prompt):
    task, spec = rmsnorm_prompt.task, get("rmsnorm")
    assert KERNEL_FILE.read_text() in task
    assert spec.doc in task and inspect.getsource(spec.reference).strip() in task
    assert "rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor" in task
    assert "2 x (the error eager torch makes in the same dtype)" in task  # the tolerance rule, from tolerance.py
    assert "| M=96, N=576 | - | float32 |" in task  # the spec's model shapes when no trace is given
    assert "cpu-interpreter" in task and "GB/s" in task
    assert "6 submissions, 200000 tokens, $2.0 and 600.0 s" in task and "80.0 % of the roofline" in task
    assert rmsnorm_prompt.spec in task  # read_spec answers with the same section


def test_system_prompt_has_tools_rules_and_every_reason_code(rmsnorm_prompt):
    system = rmsnorm_prompt.system
    for tool in ("read_kernel()", "read_spec()", "submit_candidate(source)", "finish(summary)"):
        assert tool in system
    for code in REASONS:
        assert f"`{code}`" in system
    assert "Cheating is pointless" in system and "secret per-run seed" in system


def test_traced_shapes_carry_calls_times_and_percent_of_peak():
    trace = {"_path": "traces/x/summary.json", "ops": {"rmsnorm": {"shapes": [
        {"shape": {"M": 1, "N": 576}, "calls": 3000, "mean_ms": 0.010, "dtype": "bfloat16"},
        {"shape": {"M": 96, "N": 576}, "calls": 60, "mean_ms": 0.050, "dtype": "bfloat16"}]}}}
    p = prompt.build("rmsnorm", Agent(), trace, kernel_file=KERNEL_FILE)
    rows = p.context["shapes"]
    assert [r["calls"] for r in rows] == [3000, 60] and rows[0]["now_us"] == "10.00" and rows[0]["dtype"] == "bfloat16"
    assert rows[0]["pct"] != "-" and p.context["incumbent_pct"] is not None
    assert "traced: traces/x/summary.json" in p.task and "The incumbent reaches" in p.task


def test_templates_are_strict():
    with pytest.raises(jinja2.UndefinedError):
        prompt.render("task.md", op="rmsnorm")


def test_tools_file_declares_the_four_tools():
    tools = prompt.tools_file()["tools"]
    assert [t["name"] for t in tools] == ["read_kernel", "read_spec", "check_candidate", "submit_candidate", "finish"]
    assert all(t["description"] and t["parameters"]["type"] == "object" for t in tools)


def test_system_prompt_carries_the_gates_allowlist(rmsnorm_prompt, monkeypatch):
    """The static stage's grammar is in the prompt, so the rules are read, not learnt by losing submissions; a gate
    without the allowlist module still builds a prompt (the reason codes name every rule)."""
    from autokernel.gate.allowlist import describe
    assert describe() in rmsnorm_prompt.system and "triton.{cdiv, next_power_of_2}" in rmsnorm_prompt.system
    assert "answered from memory and not counted" in " ".join(rmsnorm_prompt.system.split())
    monkeypatch.setitem(__import__("sys").modules, "autokernel.gate.allowlist", None)  # import fails
    assert "allowlist is not available" in prompt.allowlist()
