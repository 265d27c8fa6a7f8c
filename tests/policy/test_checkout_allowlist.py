"""Trust rule 6 as an allowlist (docs/design.md): a checkout's policies.yaml may set only the fields in
autokernel.policy.CHECKOUT, each within its rule; any other field (one added later included) is the user's own choice.
The red team's policies.yaml (B4) set fields the old denylist missed: agent.top_k_ops (multiplies the per-op-session
budget), sandbox.slots (multiplies the per-job limits), gate.allow_inline_asm (switches a gate defence off),
gate.max_rows (unbounded work). Each test here fails with the allowlist replaced by the old GUARDED denylist."""
import subprocess
import sys
from pathlib import Path

import pytest

from autokernel import policy
from autokernel.errors import UserError

ROOT = Path(__file__).parents[2]


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    monkeypatch.setenv("AUTOKERNEL_CONFIG", "")
    return root


def _refused(root: Path, text: str, field: str, **kw) -> str:
    f = root / "policies.yaml"
    f.write_text(text)
    with pytest.raises(UserError) as e:
        policy.for_checkout(root, **kw)
    msg = str(e.value)
    assert f"{f}:{text.count(chr(10))}: field '{field}': refused" in msg, msg
    assert "--policy" in msg and "user config" in msg and "\n" not in msg
    return msg


@pytest.mark.parametrize("text, field", [
    ("agent:\n  top_k_ops: 500\n", "agent.top_k_ops"),
    ("sandbox:\n  slots: 64\n", "sandbox.slots"),
    ("gate:\n  allow_inline_asm: true\n", "gate.allow_inline_asm"),
    ("gate:\n  max_rows: 100000000\n", "gate.max_rows"),
    ("gate:\n  max_rows: 0\n", "gate.max_rows"),  # 0 turns the range sweep off
    ("gate:\n  max_rows: 1024\n", "gate.max_rows"),  # no calls past the CPU cap: fewer rows vouched for
    ("gate:\n  max_rows_interpreter: 64\n", "gate.max_rows_interpreter"),
    ("e2e:\n  max_new_tokens: 2\n", "e2e.max_new_tokens"),  # a repeat guard that never sees 4 tokens
    ("gate:\n  e2e_interpreter_budget_s: 1\n", "gate.e2e_interpreter_budget_s"),  # one layer end to end
    ("gate:\n  max_rows_interpreter: 8192\n", "gate.max_rows_interpreter"),
    ("gate:\n  coverage_cases: 1000000000\n", "gate.coverage_cases"),
    ("gate:\n  e2e_timeout_factor: 1.0e9\n", "gate.e2e_timeout_factor"),
    ("agent:\n  model: o1-pro\n", "agent.model"),
    ("agent:\n  max_iterations: 100000\n", "agent.max_iterations"),
    ("agent:\n  max_wall_s: 1.0e9\n", "agent.max_wall_s"),
    ("agent:\n  max_output_tokens: 1000000\n", "agent.max_output_tokens"),
    ("agent:\n  thinking_budget_tokens: 64000\n", "agent.thinking_budget_tokens"),
    ("agent:\n  early_success: false\n", "agent.early_success"),
    ("e2e:\n  kl_mean_max: 1.0e9\n", "e2e.kl_mean_max"),
    ("e2e:\n  top1_min: 0\n", "e2e.top1_min"),
    ("bench:\n  min_speedup: 0.000001\n", "bench.min_speedup"),
    ("bench:\n  rounds: 100000000\n", "bench.rounds"),
    ("cluster:\n  job_timeout_s: 1.0e9\n", "cluster.job_timeout_s"),
    ("git:\n  branch_prefix: release/\n", "git.branch_prefix"),
])
def test_the_checkout_may_not_raise_limits_or_weaken_the_gate(checkout, text, field):
    _refused(checkout, text, field)


def test_a_field_outside_the_allowlist_is_refused_whatever_it_is(checkout, monkeypatch):
    """The allowlist is the rule: a field CHECKOUT does not name (here ops.deny, taken off it) is heard from a
    checkout only at its default."""
    monkeypatch.delitem(policy.CHECKOUT, "ops.deny")
    _refused(checkout, "ops:\n  deny: [rope]\n", "ops.deny")
    (checkout / "policies.yaml").write_text("ops:\n  deny: []\n")
    assert policy.for_checkout(checkout).ops.deny == []


def test_every_allowlisted_name_is_a_field():
    assert set(policy.CHECKOUT) <= set(policy._fields())


def test_the_project_may_set_its_own_fields_and_tighten(checkout):
    """What this repository and the test suite's checkouts write into their own policies.yaml still loads."""
    (checkout / "policies.yaml").write_text(
        "target:\n  weights: dequant\nops:\n  protected: [lm_head, rope]\n  deny: [silu_mul]\n"
        "agent:\n  max_iterations: 2\n  max_wall_s: 1500\n  target_fraction_of_peak: 0.5\n"
        "bench:\n  max_time_s: 8\n  job_time_s: 0.3\n  min_speedup: 1.5\n"
        "e2e:\n  max_new_tokens: 32\n  prompts: [\"What is the capital of France?\"]\n  kl_mean_max: 1.0e-4\n"
        "  top1_min: 0.99\ngate:\n  max_rows: 16384\n  require_coverage: true\n  allow_inline_asm: false\n"
        "sandbox:\n  isolation: required\n  slots: null\ngit:\n  commit: false\n")
    p = policy.for_checkout(checkout)
    assert (p.target.weights, p.ops.deny, p.agent.max_wall_s, p.gate.max_rows) == ("dequant", ["silu_mul"], 1500, 16384)
    assert (p.e2e.kl_mean_max, p.bench.min_speedup, p.git.commit) == (1e-4, 1.5, False)
    policy.for_checkout(ROOT)  # this repository's own policies.yaml (agent.max_wall_s 900)


def test_a_trusted_source_sets_what_the_checkout_may_not(checkout, tmp_path, monkeypatch):
    mine = tmp_path / "mine.yaml"
    mine.write_text("agent:\n  top_k_ops: 5\nsandbox:\n  slots: 4\n")
    monkeypatch.setenv("AUTOKERNEL_CONFIG", str(mine))
    (checkout / "policies.yaml").write_text("agent:\n  top_k_ops: 500\nsandbox:\n  slots: 64\n")
    p = policy.for_checkout(checkout)  # the user's values apply; the checkout's are moot, not refused
    assert (p.agent.top_k_ops, p.sandbox.slots) == (5, 4) and p.sandbox.origin("slots") == str(mine)
    p = policy.for_checkout(checkout, explicit=checkout / "policies.yaml")  # --policy: the user read it
    assert (p.agent.top_k_ops, p.sandbox.slots) == (500, 64)


def test_a_field_of_a_section_the_command_does_not_act_on_is_dropped(checkout):
    (checkout / "policies.yaml").write_text("agent:\n  top_k_ops: 500\n  target_fraction_of_peak: 0.5\n")
    p = policy.for_checkout(checkout, uses=policy.RUNS_CODE)  # verify and bench send no key
    assert (p.agent.top_k_ops, p.agent.target_fraction_of_peak) == (1, 0.5)


def test_policy_check_lists_what_a_checkout_may_not_set(tmp_path):
    f = tmp_path / "pol_unguarded.yaml"
    f.write_text("agent:\n  top_k_ops: 500\nsandbox:\n  slots: 64\ngate:\n  allow_inline_asm: true\n"
                 "  max_rows: 100000000\n")
    r = subprocess.run([sys.executable, "-c", "from autokernel.cli import main; main()", "policy", "check", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "4 field(s) would be refused" in r.stdout, r.stdout + r.stderr
    for field in ("agent.top_k_ops", "sandbox.slots", "gate.allow_inline_asm", "gate.max_rows"):
        assert f"field '{field}': refused" in r.stdout


def test_the_command_lines_model_makes_the_checkouts_moot(tmp_path):
    """`--model` overrides a checkout's agent.model, as --agent and --base-url do theirs: `run` passed the flag to
    the agent but not to the policy, so a checkout naming a model made `run --model X` exit 2 on agent.model."""
    root = tmp_path / "co"
    root.mkdir()
    (root / "policies.yaml").write_text("agent:\n  model: o1-pro\n")
    (root / "autokernel.toml").write_text('[engine]\nbuild = "toyt.engine:build"\n')  # a target checkout
    for args in (["init", "-q"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
                                   "-m", "x"]):
        subprocess.run(["git", *args], cwd=root, check=True)
    cli = Path(sys.executable).parent / "autokernel"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AUTOKERNEL_CONFIG": "", "OPENAI_API_KEY": "sk-test",
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = subprocess.run([str(cli), "run", "--repo", str(root), "--agent", "openai", "--model", "gpt-test",
                        "--base-url", "http://127.0.0.1:9/v1", "--yes"], capture_output=True, text=True, timeout=120,
                       env=env)
    said = r.stdout + r.stderr
    assert r.returncode == 2 and "agent.model" not in said and "cannot reach" in said, said  # past the policy


@pytest.mark.parametrize("text", ["e2e:\n  kl_mean_max: .nan\n", "e2e:\n  top1_min: .nan\n",
                                  "e2e:\n  kl_max_max: .inf\n", "bench:\n  min_speedup: .nan\n"])
def test_a_number_that_is_not_finite_is_refused(checkout, text):
    """NaN compares false with every bound: `e2e.kl_*_max: .nan` from a checkout was neither above its default nor
    below it, so it was admitted, and `kl > limit` then passed every KL (a wrecked engine was accepted). No policy
    field takes NaN or infinity, from any source."""
    f = checkout / "policies.yaml"
    f.write_text(text)
    with pytest.raises(UserError, match="finite"):
        policy.for_checkout(checkout)
    with pytest.raises(UserError, match="finite"):
        policy.load(f)
