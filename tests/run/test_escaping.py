"""Strings from a candidate or a model reach the terminal as plain text: rich markup in them is shown, not parsed
(`[/]` used to crash `verify` and `run` with MarkupError), and ANSI/OSC escapes never reach the output."""
import io

from delivery_doubles import HOSTILE, measurement
from rich.console import Console

from autokernel.agent.command import summary
from autokernel.agent.evaluate import Feedback
from autokernel.agent.loop import Candidate, Result
from autokernel.bench import command as bench_command
from autokernel.gate import command as gate_command
from autokernel.gate.verdict import StageResult, Verdict
from autokernel.run import OpOutcome, RunState, show
from autokernel.untrusted import fenced, line, markup, plain

ESCAPES = ("\x1b", "\x07", "\r", "\x9b")


def clean(text: str) -> bool:
    return not any(e in text for e in ESCAPES)


def test_the_helper():
    assert plain(HOSTILE) == "x[/]y ACCEPTED"
    assert markup(HOSTILE) == "x\\[/]y ACCEPTED"
    assert plain("keep\ttabs\nand lines \u202eevil\u202c \x9b2J") == "keep\ttabs\nand lines evil "
    assert line("a\nb\tc") == "a b c" and line("abcdef", 4) == "abc…"
    assert fenced("```\n[link](http://x)").startswith("````text\n")


def test_verify_printer(capsys, tmp_path):
    v = Verdict("rmsnorm", f"{tmp_path}/evil[/]name\x1b[2J.py", "ab" * 32, "rejected",
                [StageResult.ok("static", "parsed"), StageResult.fail("runtime", "runtime.exception", HOSTILE)],
                seed=1, device={"kind": "cpu-interpreter", "cpu": "x"}, elapsed_s=1.0, run_dir=str(tmp_path))
    gate_command.show(v)
    out = capsys.readouterr().out
    assert "x[/]y" in out and "REJECTED" in out and clean(out)


def test_bench_printer():
    m = measurement()
    m.files[-1].status, m.files[-1].detail, m.files[-1].path = "numeric.mismatch", HOSTILE, "c[/]\x1b[2J.py"
    out = io.StringIO()
    bench_command.render(m, Console(file=out, width=200))
    assert "x[/]y" in out.getvalue() and clean(out.getvalue())


def test_run_report_and_agent_summary(tmp_path):
    out = io.StringIO()
    show(Console(file=out, width=300), RunState(tmp_path / "run-x"),
         [OpOutcome("rmsnorm", "no_improvement", HOSTILE), OpOutcome("silu_mul", "committed", "ok", 2.0, [1.9, 2.1],
                                                                     "autokernel/[/]b", "0" * 40)])
    assert "x[/]y" in out.getvalue() and clean(out.getvalue())
    fb = Feedback("rmsnorm", "ab" * 32, "rejected", reasons=[{"stage": "runtime", "code": "runtime.exception",
                                                              "detail": HOSTILE}])
    r = Result("rmsnorm", "finished", HOSTILE, Candidate("src", fb), tmp_path / "t.json",
               {"input_tokens": 1, "output_tokens": 1, "usd": 0.0}, 1)
    text = summary(r)
    assert "x[/]y" in text and clean(text)
