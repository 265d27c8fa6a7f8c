"""agent_command: one session, a summary, exit codes; bad input is a UserError naming what to fix."""
import json
from pathlib import Path

import pytest
from agent_helpers import INCUMBENT, StubEvaluator
from fake_llm_api import Call, FakeAPI, anthropic_turn

from autokernel import device, paths
from autokernel.agent.command import run_session
from autokernel.candidate import Candidate
from autokernel.cli.agent import agent_command
from autokernel.errors import UserError
from autokernel.policy import Policy

SLOW_RMSNORM = Path(__file__).parents[1] / "run" / "slow_rmsnorm.py"  # a BLOCK_N literal the search can tune


def test_search_session_prints_a_summary_and_exits_0(tmp_path):
    engine = tmp_path / "engine"
    (engine / "kernels").mkdir(parents=True)
    (engine / "kernels" / "rmsnorm.py").write_text(SLOW_RMSNORM.read_text())
    lines = []
    rc = agent_command("rmsnorm", "search", run_dir=tmp_path, policy=Policy(), evaluator=StubEvaluator(),
                       echo=lines.append, repo=engine)
    assert rc == 0
    text = "\n".join(lines)
    assert "agent: search:seed=0 on rmsnorm; budget 6 candidates" in text
    assert "passed the gate; speedup 1.250x [1.200, 1.300], 42.00 % of peak: accepted [stub]" in text
    assert f"agent: transcript {tmp_path / 'transcript.json'}" in text
    assert json.loads((tmp_path / "transcript.json").read_text())["submitted"] >= 1


def test_run_session_returns_the_best_candidate_for_the_caller(tmp_path):
    r = run_session("silu_mul", "search", run_dir=tmp_path, layout=paths.target(), policy=Policy(),
                    evaluator=StubEvaluator(), echo=lambda s: None)
    assert r.best is not None and "silu_mul_kernel[grid]" in r.best.source and r.best.feedback.accepted
    assert r.transcript == tmp_path / "transcript.json" and r.submitted >= 1


def test_no_accepted_candidate_exits_1(tmp_path):
    class RejectAll(StubEvaluator):
        def evaluate(self, candidate, deadline=None):
            return super().evaluate(Candidate.of(candidate.op, "torch.nn.functional" + candidate.text))
    policy = Policy()
    policy.agent.max_iterations = 2
    lines = []
    assert agent_command("silu_mul", "search", run_dir=tmp_path, policy=policy, evaluator=RejectAll(),
                         echo=lines.append) == 1
    assert "no accepted candidate: kernels/silu_mul.py stays as it is" in "\n".join(lines)


def test_llm_session_through_the_command(tmp_path, keys, rmsnorm_prompt):
    script = [anthropic_turn("", [Call("submit_candidate", {"source": rmsnorm_prompt.kernel.replace(
        "BLOCK_N=BLOCK_N)", "BLOCK_N=BLOCK_N, num_warps=8)")})], 1000, 100),
        anthropic_turn("", [Call("finish", {"summary": "ok"})], 1200, 10)]
    policy = Policy()
    policy.agent.target_fraction_of_peak = 1.0
    policy.agent.prices = {"claude-test": (3.0, 15.0)}
    lines = []
    with FakeAPI(script) as api:
        rc = agent_command("rmsnorm", "anthropic", "claude-test", api.base_url, run_dir=tmp_path, policy=policy,
                           evaluator=StubEvaluator(), echo=lines.append)
    assert rc == 0
    assert "2200 input + 110 output tokens, $0.0083" in "\n".join(lines)


@pytest.mark.parametrize("op,match", [("lm_head", "may not be rewritten"), ("conv2d", "unknown op"),
                                      ("rmsnorm", "no kernel file")])
def test_ops_that_cannot_be_worked_on(tmp_path, op, match):
    engine = tmp_path / "engine"  # a checkout whose kernels/ has no rmsnorm.py
    (engine / "kernels").mkdir(parents=True)
    (engine / "kernels" / "silu_mul.py").write_text("# another op\n")
    with pytest.raises(UserError, match=match):
        agent_command(op, "search", run_dir=tmp_path, policy=Policy(), evaluator=StubEvaluator(), repo=engine)


def test_repo_that_is_not_an_autokernel_checkout_is_refused(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(UserError, match=r"not an autokernel checkout \(no kernels/<op>.py files\)"):
        agent_command("rmsnorm", "search", run_dir=tmp_path, policy=Policy(), evaluator=StubEvaluator(),
                      repo=tmp_path / "src")


def test_the_prompt_shows_the_target_checkouts_kernel(tmp_path):
    engine = tmp_path / "engine"
    (engine / "kernels").mkdir(parents=True)
    (engine / "kernels" / "rmsnorm.py").write_text(INCUMBENT
                                                   + "# marker: the target checkout's rmsnorm\n")
    run_session("rmsnorm", "search", run_dir=tmp_path / "run", layout=paths.target(engine), policy=Policy(),
                evaluator=StubEvaluator(), echo=lambda s: None)
    messages = json.loads((tmp_path / "run" / "transcript.json").read_text())["messages"]
    assert "# marker: the target checkout's rmsnorm" in messages[1]["content"]  # the task shows the incumbent
    read = [m for m in messages if m["role"] == "tool" and m["name"] == "read_kernel"]
    assert read and all("# marker: the target checkout's rmsnorm" in m["content"] for m in read)


def test_llm_without_key_is_a_user_error_pointing_at_search(tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(UserError, match=r"ANTHROPIC_API_KEY.*--agent search"):
        agent_command("rmsnorm", "anthropic", run_dir=tmp_path, policy=Policy(), evaluator=StubEvaluator())


def test_unknown_agent_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="use search, anthropic or openai"):
        agent_command("rmsnorm", "gemini", run_dir=tmp_path, policy=Policy(), evaluator=StubEvaluator())


def test_trace_gives_the_shapes(tmp_path):
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "summary.json").write_text(json.dumps({"schema": 1, "device": device.fingerprint(), "ops": {
        "rmsnorm": {"shapes": [{"shape": {"M": 5, "N": 576}, "calls": 700, "mean_ms": 2.0}]}}}))
    agent_command("rmsnorm", "search", trace=trace, run_dir=tmp_path / "run", policy=Policy(),
                  evaluator=StubEvaluator(), echo=lambda s: None)
    task = json.loads((tmp_path / "run" / "transcript.json").read_text())["messages"][1]["content"]
    assert "| M=5, N=576 | 700 | float32 |" in task


def test_the_agent_command_exits_2_on_bad_input(capsys, monkeypatch):
    from autokernel import cli
    monkeypatch.setattr("sys.argv", ["autokernel", "agent", "lm_head", "--agent", "search"])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2
    assert "autokernel: error: op 'lm_head' may not be rewritten" in capsys.readouterr().err


def test_the_search_steps_on_the_policys_bench_bar(tmp_path, monkeypatch):
    """make_model gives the offline search the policy's bench.min_speedup (its step bar is the commit's bar) from
    both entry points: agent.command.run_session and run.context (through the run command's lookup)."""
    from autokernel.agent import command
    from autokernel.cli import run
    from autokernel.policy import Bench
    m = command.make_model(Policy().agent, bench=Bench(min_speedup=1.37), interpreter=True)
    assert m.min_speedup == 1.37 and m.interpreter is True
    assert command.make_model(Policy().agent).min_speedup == Bench().min_speedup
    built = []
    real = command.make_model
    monkeypatch.setattr(command, "make_model", lambda *a, **kw: built.append(kw) or real(*a, **kw))
    (tmp_path / "policies.yaml").write_text("bench: {min_speedup: 1.5}\n")
    run_session("silu_mul", "search", run_dir=tmp_path / "r", layout=paths.target(), policy=Policy.model_validate(
        {"bench": {"min_speedup": 1.25}}), evaluator=StubEvaluator(), echo=lambda s: None)
    assert built[-1]["bench"].min_speedup == 1.25
    import git
    from rich.console import Console
    git.Repo.init(tmp_path)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "rmsnorm.py").write_text(SLOW_RMSNORM.read_text())
    ctx = run.context(agent="search", model=None, base_url=None, repo=tmp_path, policy_file=None,
                      console=Console(), make_evaluator=lambda *a: None)
    assert ctx.llm.min_speedup == 1.5
