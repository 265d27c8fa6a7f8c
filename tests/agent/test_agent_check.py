"""check_candidate (autokernel/agent/check.py): a free quick check that uses no submission, budgeted apart (count
and seconds), with every static finding; and the real sandboxed check on a wrong kernel (numeric findings)."""
import json

from agent_helpers import CHEAT, GOOD, INCUMBENT, KERNEL_FILE, ScriptedModel, StubEvaluator, turn

from autokernel.agent.evaluate import SandboxEvaluator
from autokernel.agent.loop import Session
from autokernel.agent.prompt import build
from autokernel.candidate import Candidate
from autokernel.deadline import Deadline
from autokernel.paths import INSTALLED_LAYOUT
from autokernel.policy import Agent, Policy


class Checking(StubEvaluator):
    """The stub evaluator plus a .check that reports what it got and advances a fake clock by 10 s."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.checked = clock, []

    def check(self, candidate, deadline=None):
        self.checked.append(deadline.left())
        self.clock.t += 10.0
        bad = "torch.nn.functional" in candidate.text
        return {"passed": not bad, "findings": [{"stage": "static", "code": "static.forbidden_import"}] if bad else [],
                "checked": "static"}


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def session(tmp_path, replies, evaluator, **policy):
    p = Agent(**policy)
    clock = getattr(evaluator, "clock", Clock())
    model = ScriptedModel(replies)
    prompt = build("rmsnorm", p, kernel_file=KERNEL_FILE)
    return Session("rmsnorm", model, evaluator, prompt, p, tmp_path, clock=clock), model


def tool_replies(s):
    return [json.loads(m["content"]) if m["content"].startswith("{") else m["content"]
            for m in s.messages if m["role"] == "tool"]


def test_checks_use_no_submission_and_have_their_own_budget(tmp_path):
    ev = Checking(Clock())
    chk = [turn("", ("check_candidate", {"source": src})) for src in (CHEAT, GOOD, GOOD, GOOD + "\n", GOOD + "\n\n")]
    s, _ = session(tmp_path, chk + [turn("", ("submit_candidate", {"source": GOOD})), turn("", ("finish", {}))], ev,
                   max_checks=3, max_iterations=1)
    r = s.run()
    assert r.submitted == 1 and ev.calls == [GOOD]  # five checks later, the one submission was still there
    assert r.status == "limit" and r.detail.startswith("submissions budget spent: 1")
    first, second, dup, third, over, submitted = tool_replies(s)
    assert first["passed"] is False and first["findings"][0]["code"] == "static.forbidden_import"
    assert second["passed"] is True and second["checks_left"] == 1 and second["check_seconds_left"] == 100.0
    assert dup["duplicate"] is True and dup["checks_left"] == 1  # the same draft again: answered, not counted
    assert third["checks_left"] == 0 and over.startswith("error: the check budget (3 checks")
    assert len(ev.checked) == 3 and ev.checked[0] == 120.0  # each check gets min(check seconds left, time left)


def test_the_check_time_budget_and_the_session_deadline(tmp_path):
    ev = Checking(Clock())
    s, _ = session(tmp_path, [turn("", ("check_candidate", {"source": GOOD + "\n" * i})) for i in range(4)]
                   + [turn("", ("finish", {}))], ev, max_check_s=25.0, max_checks=10, max_wall_s=1000.0)
    s.run()
    replies = tool_replies(s)
    assert ev.checked == [25.0, 15.0, 5.0] and replies[3].startswith("error: the check budget")
    ev2 = Checking(Clock())
    s2, _ = session(tmp_path / "2", [turn("", ("check_candidate", {"source": GOOD}))] * 3, ev2, max_wall_s=8.0)
    r = s2.run()
    assert ev2.checked == [8.0]  # capped at the session's time left, and the session then ended on its clock
    assert r.status == "limit" and "wall_s" in r.detail


def test_an_evaluator_without_check_says_so(tmp_path):
    s, _ = session(tmp_path, [turn("", ("check_candidate", {"source": GOOD})), turn("", ("finish", {}))],
                   StubEvaluator())
    s.run()
    assert tool_replies(s)[0].startswith("error: check_candidate is not available")


def test_static_findings_are_all_listed_without_running_the_file(tmp_path):
    bad = CHEAT + "import os\nos.system('true')\n"
    ev = SandboxEvaluator(tmp_path, Policy(), layout=INSTALLED_LAYOUT)
    report = ev.check(Candidate.of("rmsnorm", bad))
    codes = [f["code"] for f in report["findings"]]
    assert report["passed"] is False and len(codes) >= 2 and all(c.startswith("static.") for c in codes)
    assert "runtime" not in report["checked"]  # a file that fails the static stage never runs


def test_a_wrong_kernel_fails_the_quick_numeric_check(tmp_path):
    """The real sandboxed check (seconds): a kernel that forgets the weight passes the static stage and fails on
    numbers; the incumbent passes."""
    wrong = INCUMBENT.replace("y = x * rstd * w", "y = x * rstd")
    assert wrong and wrong != INCUMBENT
    ev = SandboxEvaluator(tmp_path, Policy(), layout=INSTALLED_LAYOUT)
    bad = ev.check(Candidate.of("rmsnorm", wrong), Deadline.after(120.0))
    assert bad["passed"] is False and bad["findings"][0]["code"].startswith("numeric."), bad
    ok = ev.check(Candidate.of("rmsnorm", INCUMBENT), Deadline.after(120.0))
    assert ok["passed"] is True and "numeric: passed" in ok["checked"], ok
