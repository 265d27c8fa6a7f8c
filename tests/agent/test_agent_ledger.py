"""The ledger of tried candidates (autokernel/agent/ledger.py): a source judged in an earlier run on this device is
answered from the ledger and never evaluated again (not counted); a past win is evaluated again (the ledger is never
evidence); the first user message shows the earlier runs; `autokernel ledger` prints it."""
import json
from dataclasses import replace

import typer
from agent_helpers import CHEAT, GOOD, KERNEL_FILE, ScriptedModel, StubEvaluator, sha256, turn
from typer.testing import CliRunner

from autokernel.agent.ledger import Ledger
from autokernel.agent.loop import Session
from autokernel.agent.prompt import build
from autokernel.policy import Agent


def session(tmp_path, name, sources, evaluator, ledger):
    p = Agent()
    model = ScriptedModel([turn("", ("submit_candidate", {"source": s})) for s in sources]
                          + [turn("", ("finish", {"summary": "done"}))])
    prompt = build("rmsnorm", p, kernel_file=KERNEL_FILE)
    s = Session("rmsnorm", model, evaluator, prompt, p, tmp_path / name, ledger=ledger)
    return s.run(), s, model


def test_a_second_run_skips_the_already_judged_candidate(tmp_path):
    led = Ledger(tmp_path / "sandbox" / "ledger.jsonl", device="cpu-test [abc]")
    first = StubEvaluator()
    r1, _, _ = session(tmp_path, "run1", [CHEAT, GOOD], first, led)
    assert r1.submitted == 2 and first.calls == [CHEAT, GOOD]
    assert [e["verdict"] for e in led.entries("rmsnorm")] == ["rejected", "accepted"]
    second = StubEvaluator()
    r2, s2, model = session(tmp_path, "run2", [CHEAT, GOOD], second, led)
    assert second.calls == [GOOD]  # the rejected source was not evaluated again; the past win was
    assert r2.submitted == 1 and r2.best is not None  # not counted; the win is this session's own
    reply = json.loads([m for m in s2.messages if m["role"] == "tool"][0]["content"])
    assert reply["from_ledger"] is True and reply["reason"] == "static.forbidden_import"
    task = model.seen[0][1]["content"]
    assert "Earlier runs on rmsnorm" in task and "\"static.forbidden_import\" (1x)" in task
    assert "Best measured: " in task and "1.250x (accepted)" in task


def test_another_device_or_a_broken_line_is_not_an_answer(tmp_path):
    path = tmp_path / "ledger.jsonl"
    session(tmp_path, "run1", [CHEAT], StubEvaluator(), Ledger(path, device="gpu-a [1]"))
    with open(path, "a") as f:
        f.write("{not json\n" + json.dumps({"sha256": "x"}) + "\n")
    other = StubEvaluator()
    r, s, model = session(tmp_path, "run2", [CHEAT], other, Ledger(path, device="gpu-b [2]"))
    assert other.calls == [CHEAT] and "Earlier runs" not in model.seen[0][1]["content"]
    assert len(Ledger(path, device="gpu-a [1]").entries()) == 1  # the broken lines are skipped


def test_ledger_command_prints_this_checkouts_ledger(tmp_path):
    from autokernel.cli import ledger as ledger_cli
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "rmsnorm.py").write_text(GOOD)
    led = Ledger(tmp_path / "sandbox" / "ledger.jsonl")
    session(tmp_path, "run1", [CHEAT, GOOD], StubEvaluator(), led)
    app = typer.Typer()
    ledger_cli.register(app)
    app.command("noop")(lambda: None)  # two commands: typer then takes the command name
    r = CliRunner().invoke(app, ["ledger", "--repo", str(tmp_path), "--op", "rmsnorm", "--json"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.output.splitlines()]
    assert [x["verdict"] for x in rows] == ["rejected", "accepted"] and rows[1]["speedup"] == 1.25
    r = CliRunner().invoke(app, ["ledger", "--repo", str(tmp_path), "--op", "silu_mul"])
    assert r.exit_code == 0 and "no candidates for silu_mul" in r.output
    # a committed ledger is the checkout's data: an entry of the wrong types (a 4000-digit speedup overflowed the
    # table's float(); a list for a string) is skipped like a broken line, never a traceback
    good = json.loads((tmp_path / "sandbox" / "ledger.jsonl").read_text().splitlines()[1])
    with open(tmp_path / "sandbox" / "ledger.jsonl", "a") as f:
        for bad in [{"speedup": int("9" * 4000)}, {"speedup_ci": ["a", 1]}, {"op": ["rmsnorm"]},
                    {"accepted": "yes"}, {"speedup": float("nan")}]:
            f.write(json.dumps({**good, **bad}) + "\n")
    for args in (["--op", "rmsnorm", "--json"], ["--op", "rmsnorm"], []):
        r = CliRunner().invoke(app, ["ledger", "--repo", str(tmp_path), *args])
        assert r.exit_code == 0 and r.exception is None, r.output
    assert len(Ledger(tmp_path / "sandbox" / "ledger.jsonl").entries("rmsnorm")) == 2


class StagedStub(StubEvaluator):
    """StubEvaluator counting each gate and bench, its gate's acceptance carrying a gate record."""

    def __init__(self, won: bool = True):
        super().__init__()
        self.won, self.gates, self.benches = won, [], []

    def evaluate(self, candidate, deadline=None):
        fb = self.gate(candidate)
        return fb if fb.verdict != "accepted" else self.bench(candidate, fb)

    def gate(self, candidate, deadline=None):
        self.gates.append(candidate.text)
        fb = super().gate(candidate)  # static.forbidden_import, or accepted
        return fb if fb.verdict != "accepted" else replace(
            fb, stages=[{"name": "numeric", "passed": True}], seed=7, isolation="bwrap+cgroup", note="")

    def bench(self, candidate, fb, deadline=None):
        self.benches.append((candidate.text, fb))
        s = 1.25 if self.won else 1.0
        return replace(fb, accepted=self.won, speedup=s, speedup_ci=[s - 0.05, s + 0.05])


def keyed(path, base="a" * 40, policy="p1", key=b"k" * 32):
    return Ledger(path, device="cpu-test [abc]", base=base, policy=policy, key=key)


def test_an_acceptance_is_reused_only_for_the_same_source_base_device_and_policy(tmp_path):
    """Issue 23: a gate's acceptance (here it also won) is benchmarked again without a gate when the source, base
    commit, device and policy digest all match; another base, policy or device gates it again."""
    path = tmp_path / "ledger.jsonl"
    session(tmp_path, "run1", [GOOD], StagedStub(), keyed(path))
    same = StagedStub()
    r, _, _ = session(tmp_path, "run2", [GOOD], same, keyed(path))
    assert same.gates == [] and len(same.benches) == 1 and r.best is not None and r.submitted == 1
    fb = same.benches[0][1]
    assert fb.seed == 7 and fb.stages == [{"name": "numeric", "passed": True}]  # the gate's own record
    assert fb.path.endswith(f"run2/ledger-{sha256(GOOD)[:8]}/rmsnorm.py")  # benched from a fresh copy
    for other in (keyed(path, base="b" * 40), keyed(path, policy="p2"),
                  Ledger(path, device="gpu [def]", base="a" * 40, policy="p1", key=b"k" * 32)):
        ev = StagedStub()
        session(tmp_path, "run3", [GOOD], ev, other)
        assert ev.gates == [GOOD], other.base + str(other.policy) + other.device


def test_a_lost_benchmark_is_an_answer_only_over_the_same_base_and_policy(tmp_path):
    path = tmp_path / "ledger.jsonl"
    session(tmp_path, "run1", [GOOD], StagedStub(won=False), keyed(path))
    ev = StagedStub()
    r, s, _ = session(tmp_path, "run2", [GOOD], ev, keyed(path))
    assert ev.gates == ev.benches == [] and r.submitted == 0  # answered from the ledger
    assert json.loads([m for m in s.messages if m["role"] == "tool"][0]["content"])["from_ledger"] is True
    for other in (keyed(path, base="b" * 40), keyed(path, policy="p2")):
        ev = StagedStub(won=False)
        session(tmp_path, "run3", [GOOD], ev, other)
        assert ev.gates == [GOOD]  # the incumbent or the judge changed: judged again


def test_an_acceptance_without_this_users_mac_is_gated_again(tmp_path):
    """The ledger is in the checkout (untrusted): a line written without this user's key, or edited, never skips
    the gate."""
    path = tmp_path / "ledger.jsonl"
    session(tmp_path, "run1", [GOOD], StagedStub(), keyed(path, key=b"someone else's key"))
    ev = StagedStub()
    session(tmp_path, "run2", [GOOD], ev, keyed(path))
    assert ev.gates == [GOOD]
    path.unlink()
    session(tmp_path, "run3", [GOOD], StagedStub(), keyed(path))
    line = json.loads(path.read_text())
    line["gate"]["seed"] = 8  # any edit breaks the MAC
    path.write_text(json.dumps(line) + "\n")
    ev = StagedStub()
    session(tmp_path, "run4", [GOOD], ev, keyed(path))
    assert ev.gates == [GOOD]


def test_the_user_key_is_made_once_outside_the_checkout(tmp_path, monkeypatch):
    from autokernel.agent.ledger import policy_digest, user_key
    from autokernel.policy import Policy
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    k = user_key()
    assert len(k) == 32 and user_key() == k
    assert (tmp_path / "cache" / "autokernel" / "ledger.key").stat().st_mode & 0o777 == 0o600
    p = Policy()
    assert policy_digest(p) == policy_digest(Policy.model_validate({"agent": {"max_wall_s": 5}}))  # budgets: same
    assert policy_digest(p) != policy_digest(Policy.model_validate({"e2e": {"kl_mean_max": 1e-2}}))


def test_the_next_prompt_shows_near_misses_with_the_best_as_a_diff(tmp_path):
    """Issue 23: a source that passed the gate and lost the benchmark is archived beside the ledger; the next
    session's first message lists it (sha, speedup and interval, why it lost) and shows the best one as a diff
    against the current kernel, so the model builds on it instead of resubmitting it."""
    path = tmp_path / "sandbox" / "ledger.jsonl"
    session(tmp_path, "run1", [GOOD, CHEAT], StagedStub(won=False), keyed(path))
    assert (path.parent / "near-misses" / "rmsnorm" / f"{sha256(GOOD)}.py").read_text() == GOOD
    _, _, model = session(tmp_path, "run2", [], StagedStub(), keyed(path))
    task = model.seen[0][1]["content"]
    assert "Near misses: 1 source(s) passed the whole gate and then lost the benchmark" in task
    assert f'"{sha256(GOOD)[:8]}": speedup 1.000x [0.950, 1.050]; lost: the interval\'s lower bound' in task
    assert "; judged \"20" in task and "\"static.forbidden_import\" (1x)" in task  # when, not the session's dir
    diff = task.split("```diff\n")[1].split("\n```")[0]
    assert "+++ b/kernels/rmsnorm.py (near miss" in diff and any(
        x.startswith("+") and "num_warps=8" in x for x in diff.splitlines())
    (path.parent / "near-misses" / "rmsnorm" / f"{sha256(GOOD)}.py").write_text(GOOD + "# edited\n")
    _, _, model = session(tmp_path, "run3", [], StagedStub(), keyed(path))
    task = model.seen[0][1]["content"]
    assert "Near misses: 1" in task and "```diff" not in task  # an archived file that changed is not shown
