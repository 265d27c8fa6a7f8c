"""Through the one orchestration path (run.pipeline -> work_on -> agent.command.start): a candidate the first run
judged is not evaluated by the second run on the same checkout (answered from sandbox/ledger.jsonl), and
`autokernel ledger` lists it."""
import io
import json
import subprocess
import sys
from pathlib import Path

import git
from delivery_doubles import ScriptedModel, StubEvaluator, turn, write_trace
from rich.console import Console

from autokernel import paths, run
from autokernel.policy import Policy

ROOT = Path(__file__).parents[2]


def test_a_second_run_skips_the_already_judged_candidate(tmp_path):
    clone = git.Repo.clone_from(ROOT, tmp_path / "clone")
    wd = Path(clone.working_tree_dir)
    evaluators = []

    def make(op_dir, *a):
        evaluators.append(StubEvaluator(op_dir))
        return evaluators[-1]

    def go(n):
        llm = ScriptedModel([turn("", ("submit_candidate", {"source": "REJECT me"})), turn("", ("finish", {}))])
        ctx = run.Context(paths.Layout(wd), Policy(), Policy().agent, llm, make, Console(file=io.StringIO()),
                          yes=True)
        return run.pipeline(ctx, op="rmsnorm", resume=None, trace=write_trace(tmp_path / f"t{n}"))

    go(1)
    assert evaluators[0].evaluated == ["REJECT me"]
    _, (o,) = go(2)
    assert evaluators[1].evaluated == [] and o.status == "no_improvement"
    r = subprocess.run([str(Path(sys.executable).parent / "autokernel"), "ledger", "--json", "--op", "rmsnorm",
                        "--repo", str(wd)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (entry,) = [json.loads(x) for x in r.stdout.splitlines()]
    assert entry["reason"] == "static.forbidden_call" and "\x1b" not in entry["detail"]
