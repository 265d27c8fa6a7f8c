"""What a reviewer reads first in a delivered win (issue 23 item 4): the kernel speedup beside the op's share of
profiled time and Amdahl's end-to-end bound, repro commands on the profiled shapes, and a no-win nightly's account of
what was tried. The commit's author is tested in tests/git/test_git.py."""
import io
from pathlib import Path

from delivery_doubles import ScriptedModel, StubEvaluator, measurement, turn, write_trace
from rich.console import Console

from autokernel import paths, run
from autokernel.bench.stats import Interval
from autokernel.git import report
from autokernel.policy import Policy

GATE = {"seed": 7, "isolation": "bwrap", "sha256": "ab" * 32, "stages": []}


def win(**kw) -> report.Win:
    return report.Win("rmsnorm", measurement(speedup=5.1), GATE, evidence_path="traces/autokernel/run-1/rmsnorm.json",
                      **kw)


def test_a_fast_kernel_for_a_negligible_op_says_it_moves_nothing_end_to_end():
    w = win(share=0.0004, profile_path="traces/autokernel/run-1/profile/summary.json")
    body = report.body(w, "0" * 40)
    assert body.startswith("**5.10x faster rmsnorm; rmsnorm is 0.0% of profiled time: x1.00 end to end at most")
    assert "0.0% of profiled time, <= x1.00 end to end)" in report.title(w)


def test_an_unknown_share_is_said_not_omitted():
    w = win()
    body = report.body(w, "0" * 40)
    assert "rmsnorm's share of profiled time is unknown (no profile): the end-to-end effect is not bounded" in body
    assert "share of profiled time unknown" in report.title(w)
    assert "--trace" not in body and "Profile: none" in body  # nothing to pass: the model's own shapes


def test_a_profile_too_big_to_commit_is_named_and_passed_to_the_repro():
    w = win(share=0.25, trace_dir="traces/20260101-000000-abcdef")
    body = report.body(w, "0" * 40)
    assert "autokernel verify rmsnorm kernels/rmsnorm.py --trace traces/20260101-000000-abcdef --seed 7" in body
    assert "--incumbent /tmp/base_rmsnorm.py --trace traces/20260101-000000-abcdef\n" in body
    assert "Profile: `traces/20260101-000000-abcdef/summary.json` on the machine that ran autokernel" in body
    assert "x1.25 end to end at most" in body  # 1 / (0.75 + 0.25 / 5.1) = 1.2515


def test_a_no_win_nightly_says_what_was_tried():
    tried = {"candidates": 3, "reasons": {"numeric.mismatch": 2, "bench.no_win": 1}, "best_speedup": 1.013}
    outcomes = [run.OpOutcome("rmsnorm", "no_improvement", "finished: done; 3 candidate(s), none won", tried=tried),
                run.OpOutcome("silu_mul", "no_improvement", "finished: done; 0 candidate(s), none won",
                              tried={"candidates": 0, "reasons": {}, "best_speedup": None})]
    text = run.nightly_report(None, outcomes)
    assert text.startswith("# autokernel nightly: no improvement")
    assert "- rmsnorm: 3 candidate(s) judged: numeric.mismatch x2, bench.no_win x1; best speedup seen 1.013x" in text
    assert "- silu_mul: 0 candidate(s) judged; best speedup seen: none" in text


def _rmsnorm_session(tmp_path, sources: list[str], evaluator):
    """A run on a checkout with the shipped rmsnorm whose scripted model submits `sources`, then finishes; no commit."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "rmsnorm.py").write_text((Path(__file__).parents[2] / "kernels" / "rmsnorm.py")
                                                     .read_text())
    llm = ScriptedModel([turn("", ("submit_candidate", {"source": src})) for src in sources]
                        + [turn("", ("finish", {"summary": "done"}))])
    pol = Policy()
    pol.git.commit = False
    ctx = run.Context(paths.Layout(tmp_path), pol, pol.agent, llm, lambda op_dir, *a: evaluator(op_dir),
                      Console(file=io.StringIO()), yes=True)
    return run.pipeline(ctx, op="rmsnorm", resume=None, trace=write_trace(tmp_path / "trace-1"))


def test_a_session_that_won_nothing_reports_its_verdicts(tmp_path):
    state, (o,) = _rmsnorm_session(tmp_path, ["# REJECT one\n", "# REJECT two\n"], StubEvaluator)
    assert o.status == "no_improvement", o
    assert o.tried == {"candidates": 2, "reasons": {"static.forbidden_call": 2}, "best_speedup": None}
    assert "- rmsnorm: 2 candidate(s) judged: static.forbidden_call x2; best speedup seen: none" in \
        run.nightly_report(state, [o])


def test_a_win_with_no_engine_ab_says_it_was_not_measured():
    """Issue 23 asked for an engine tokens/s A/B where it fits the budget (autokernel/bench/engine_ab.py; its figures
    and reasons in the body: tests/run/test_engine_ab_run.py); a Win without one says so rather than leave the
    reviewer to assume one was run."""
    body = report.body(win(share=0.25), "0" * 40)
    assert ("End-to-end tokens/s (the engine with vs without this kernel): **not measured**: this run did not "
            "measure it.") in body


def test_an_out_of_time_nightly_also_says_what_was_judged():
    """The first real CPU nightly of the offline search judged one candidate (0.872x, no win) and kept a second
    unbenched; its pr.md named only the second."""
    state = run.RunState(Path("/r/sandbox/run-1"))
    o = run.OpOutcome("attention_decode", "out_of_time", "1 candidate(s) passed the gate and were not benchmarked",
                      unbenched=[{"sha256": "ab" * 32}],
                      tried={"candidates": 2, "reasons": {"bench.no_win": 1, "bench.not_run": 1},
                             "best_speedup": 0.872})
    text = run.nightly_report(state, [o])
    assert text.startswith("# autokernel nightly: out of time")
    assert ("- attention_decode: out_of_time: 1 candidate(s) passed the gate and were not benchmarked; in all 2 "
            "candidate(s) judged: bench.no_win x1, bench.not_run x1; best speedup seen 0.872x") in text


def test_a_win_the_confirming_benchmark_lost_says_its_figure_and_what_was_tried(tmp_path):
    """The second real CPU nightly (offline search, attention_decode): its session's 1.091x winner lost the
    confirming benchmark, and pr.md said only '... but not in the confirming benchmark (bench.no_win): not
    committed': no figure, and none of the session's other candidates."""
    class LostOnConfirm(StubEvaluator):
        def confirm(self, candidate):
            m = measurement(candidate.op, speedup=1.01)
            c = m.files[-1]
            c.accepted, c.reason = False, "bench.no_win"
            c.speedup = Interval(1.01, 0.98, 1.04)
            c.detail = "the weighted speedup's lower 95% bound 0.980 is not above 1.02"
            return m
    state, (o,) = _rmsnorm_session(tmp_path, ["# REJECT one\n", "# faster\n"], LostOnConfirm)
    assert o.status == "no_improvement" and o.tried == {"candidates": 2, "reasons": {
        "static.forbidden_call": 1, "bench.won": 1}, "best_speedup": 2.0}, o
    assert ("- rmsnorm: 2 candidate(s) judged: static.forbidden_call x1, bench.won x1; best speedup seen 2.000x; "
            "then candidate ") in run.nightly_report(state, [o])
    assert ("but not in the confirming benchmark (1.010x [0.980, 1.040]; bench.no_win: the weighted speedup's lower "
            "95% bound 0.980 is not above 1.02): not committed") in run.nightly_report(state, [o])
