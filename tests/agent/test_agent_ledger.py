"""The ledger of tried candidates (autokernel/agent/ledger.py): a source judged in an earlier run on this device is
answered from the ledger and never evaluated again (not counted); a past win is evaluated again (the ledger is never
evidence); the first user message shows the earlier runs; `autokernel ledger` prints it."""
import json

import typer
from agent_helpers import CHEAT, GOOD, ScriptedModel, StubEvaluator, turn
from typer.testing import CliRunner

from autokernel.agent.ledger import Ledger
from autokernel.agent.loop import Session
from autokernel.agent.prompt import build
from autokernel.policy import Agent


def session(tmp_path, name, sources, evaluator, ledger):
    p = Agent()
    model = ScriptedModel([turn("", ("submit_candidate", {"source": s})) for s in sources]
                          + [turn("", ("finish", {"summary": "done"}))])
    s = Session("rmsnorm", model, evaluator, build("rmsnorm", p), p, tmp_path / name, ledger=ledger)
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
    from autokernel.agent import ledger as ledger_mod
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "rmsnorm.py").write_text(GOOD)
    led = Ledger(tmp_path / "sandbox" / "ledger.jsonl")
    session(tmp_path, "run1", [CHEAT, GOOD], StubEvaluator(), led)
    app = typer.Typer()
    ledger_mod.register(app)
    app.command("noop")(lambda: None)  # two commands: typer then takes the command name
    r = CliRunner().invoke(app, ["ledger", "--repo", str(tmp_path), "--op", "rmsnorm", "--json"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.output.splitlines()]
    assert [x["verdict"] for x in rows] == ["rejected", "accepted"] and rows[1]["speedup"] == 1.25
    r = CliRunner().invoke(app, ["ledger", "--repo", str(tmp_path), "--op", "silu_mul"])
    assert r.exit_code == 0 and "no candidates for silu_mul" in r.output
