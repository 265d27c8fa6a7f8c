"""A declared op's work counts (autokernel/target/work.py): FLOP/byte expressions over the launcher's recorded
arguments, evaluated by walking a checked tree (the declaration is untrusted text), and the roofline ranking they
give a target's ops (autokernel/target/rank_target.py, autokernel/profile/rank.py's rule)."""
import json

import pytest
from test_profile_target import DECL, toy

from autokernel.errors import UserError
from autokernel.policy import for_checkout
from autokernel.target import declaration as decl
from autokernel.target import profile_target, rank_target, work

SIG = [("x", ("tensor", "float32", (4, 576), (576, 1))), ("w", ("tensor", "bfloat16", (576,), (1,))),
       ("eps", ("float", 1e-5)), ("n", ("int", 576))]


@pytest.mark.parametrize("expr,value", [
    ("4 * x.numel", 4 * 4 * 576), ("2 * x.nbytes + w.nbytes", 2 * 4 * 576 * 4 + 576 * 2),
    ("x.shape[0] * x.shape[-1] * n", 4 * 576 * 576), ("max(x.ndim, 3) ** 2 // 2", 4), ("-(-n) % 7", 576 % 7),
    ("min(n, 10) / 4", 2.5),
])
def test_expressions_over_the_recorded_arguments(expr, value):
    assert work.evaluate(work.parse(expr, "t"), SIG) == value


@pytest.mark.parametrize("expr,why", [
    ("__import__('os').system('id')", "a call other than min"), ("x.__class__", "the attribute .__class__"),
    ("(n ** 4) ** 4", "a power of a power"), ("n ** n", "an exponent other than"), ("'a' * 3", "the constant 'a'"),
    ("(lambda: 1)()", "a call other than"), ("[n][0]", "a subscript other than"), ("n if n else 0", "IfExp"),
    ("x.shape[0:1]", "a subscript other than"), ("", "an arithmetic expression"), ("n +", "does not parse"),
    ("+".join(["1"] * 150), "more than"),
])
def test_anything_else_is_refused_naming_it(expr, why):
    with pytest.raises(UserError, match="docs/targets.md") as e:
        work.parse(expr, "[ops.x] work flops")
    assert why in str(e.value), str(e.value)


def test_an_expression_that_does_not_fit_a_call_counts_nothing():
    """A name the call lacks, a negative or infinite result, a division by zero: no counts for that layout (the
    op then ranks by time share), never an exception out of the profile."""
    for expr in ("y.numel", "eps.numel", "x.shape[2]", "-n", "n / (n - 576)", "10.0 ** 4 ** 1 * 1e300"):
        assert work.counts({"flops": expr, "bytes": "n"}, SIG) is None, expr
    assert work.counts({"flops": "n", "bytes": "x.nbytes"}, SIG) == {"flops": 576.0, "bytes": 4 * 576 * 4.0}


def test_a_declared_work_table_is_checked_at_load(tmp_path):
    bad = DECL.replace('launchers = ["add"]', 'launchers = ["add"]\nwork = { flops = "x.numel" }')
    with pytest.raises(UserError, match=r"\[ops.add\] work: \{ flops"):
        decl.load(toy(tmp_path / "a", bad))
    bad = DECL.replace('launchers = ["add"]', 'launchers = ["add"]\nwork = { flops = "open(1)", bytes = "1" }')
    with pytest.raises(UserError, match="work flops: a call other than"):
        decl.load(toy(tmp_path / "b", bad))


def test_the_profile_counts_each_layout_and_rank_gives_headroom(tmp_path):
    """The toy's add (x + y into out, 100 float32): 100 FLOPs and 1200 bytes a call; under the interpreter a launch
    takes far longer than the CPU roofline's microsecond, so nearly all of its time is headroom."""
    root = toy(tmp_path / "co", DECL.replace(
        'launchers = ["add"]', 'launchers = ["add"]\nwork = { flops = "x.numel", bytes = "3 * x.nbytes" }'))
    run_dir, _ = profile_target.profile(root, for_checkout(root, uses=("sandbox", "ops")))
    t = json.loads((run_dir / "summary.json").read_text())
    (shape,) = t["ops"]["add"]["shapes"]
    assert (shape["flops"], shape["bytes"], shape["dtype"]) == (100.0, 1200.0, "float32")
    assert "flops" not in t["ops"]["mul"]["shapes"][0]  # mul declares no work
    assert t["roofline"]["gbps"] > 0 and t["timing"]["ranking"].startswith("expected end-to-end gain")
    t["_path"] = str(run_dir / "summary.json")
    add = next(r for r in rank_target.rank(t) if r["op"] == "add")
    assert add["headroom"] > 0.9 and add["gain"] == pytest.approx(add["e2e_share"] * add["headroom"])
    assert add["bound"] in ("memory", "compute")


def _op(share: float, total_ms: float, flops: float, nbytes: float, calls: int = 10) -> dict:
    return {"file": "f.py", "calls": calls, "total_ms": total_ms, "share": share, "e2e_share": share,
            "shapes": [{"launcher": "f", "calls": calls, "flops": flops, "bytes": nbytes, "dtype": "float32"}]}


def test_roofline_headroom_reorders_the_ops_as_for_the_embedded_engine():
    """At 100 GB/s: `big` (60 % of the time) is already at 90 % of its roofline, `small` (40 %) at 10 %: the
    gain (share x headroom) puts `small` first; an op without counts (or with forged ones) keeps its share."""
    peaks = {"gbps": 100.0, "gflops": {"float32": 1000.0}, "source": "test peaks"}
    t = {"roofline": peaks, "ops": {
        "big": _op(0.6, 10.0, 0, 0.9 * 10.0 / 10 * 1e-3 * 100e9),  # 10 calls at 0.9 ms of bytes each: 9 of 10 ms
        "small": _op(0.4, 10.0, 0, 0.1 * 10.0 / 10 * 1e-3 * 100e9),
        "plain": {**_op(0.05, 1.0, 0, 0), "shapes": [{"launcher": "f", "calls": 1}]},
        "forged": {**_op(0.3, 5.0, 0, 0), "shapes": [{"launcher": "f", "calls": 1, "flops": "1e999", "bytes": 1,
                                                      "dtype": "float32"}]}}}
    ranked = rank_target.rank(t)
    assert [r["op"] for r in ranked] == ["small", "forged", "big", "plain"]
    by = {r["op"]: r for r in ranked}
    assert by["big"]["headroom"] == pytest.approx(0.1) and by["small"]["headroom"] == pytest.approx(0.9)
    assert by["small"]["gain"] == pytest.approx(0.36) and by["big"]["gain"] == pytest.approx(0.06)
    assert by["plain"]["gain"] is None and by["forged"]["gain"] is None


def test_the_printed_rank_shows_headroom_and_gain(capsys):
    t = {"roofline": {"gbps": 100.0, "gflops": {}, "source": "test peaks"}, "run_id": "r",
         "target": {"build": "m:b", "root": "/c", "interpreted": False},
         "timing": {"label": "synced", "note": "n", "ranking": "expected end-to-end gain"},
         "totals": {"calls": 10, "workload_ms": 20.0, "launch_ms": 10.0},
         "ops": {"small": _op(0.4, 10.0, 0, 0.1 * 1e-3 * 100e9)}}
    rank_target.print_rank(t, rank_target.rank(t))
    out = " ".join(capsys.readouterr().out.split())
    for needle in ("ranked by expected end-to-end gain", "test peaks", "headroom", "gain", "90.0%", "36.0%"):
        assert needle in out, out


def test_the_timing_label_follows_the_device_not_the_files_words(capsys):
    """Red-team: the engine rewrote the job's `interpreted` flag (ctypes), and the trace then called CPU interpreter
    times 'CUDA: synchronized launch time'. The parent sets how kernels run (discover.run) and the rank shows the
    label of the device the trace was taken on."""
    t = {"roofline": {}, "run_id": "r", "device": {"kind": "cpu-interpreter"},
         "target": {"build": "m:b", "root": "/c", "interpreted": False},
         "timing": {"label": "CUDA: synchronized launch time", "note": "the kernel's device time"},
         "totals": {"calls": 10, "workload_ms": 20.0, "launch_ms": 10.0},
         "ops": {"small": _op(0.4, 10.0, 0, 0)}}
    rank_target.print_rank(t, rank_target.rank(t))
    out = " ".join(capsys.readouterr().out.split())
    assert "CPU / Triton interpreter" in out and "interpreter ms" in out and "CUDA" not in out, out


def test_the_declarations_names_are_inert_in_the_commit_message(monkeypatch):
    """Red team (helper-40): an op named `Fixes` in `GH-12/norm.py` (both admitted by the name rules) made a live
    "Fixes GH-12" in the commit's title, body and Reproduce line, and so in the PR GitHub would act on."""
    from types import SimpleNamespace as NS

    from autokernel.agent.evaluate import Feedback
    from autokernel.git import report
    from autokernel.target import declaration as decl
    from autokernel.target import run as target_run
    monkeypatch.setattr(report, "perf_table", lambda m, op: ["| table |"])
    op = decl.Op("Fixes", "GH-12/norm.py", ["norm"], {"norm": "GH-12.ref:norm"})
    m = NS(files=[NS(speedup=NS(est=1.5), launchers=[])])
    fb = Feedback(op="Fixes", sha256="0" * 64, verdict="accepted", stages=[{"name": "static", "passed": True}])
    text = target_run.message(op, m, fb, "a" * 40, 0.5)
    assert "GH-12" not in text and "GH- 12" in text, text


def test_a_run_refuses_an_op_file_that_is_not_heads(tmp_path):
    """Red team (helper-40): the work tree's norm.py (slow) differed from HEAD's (fast), hidden by
    `git update-index --assume-unchanged`; the run measured a '1.77x' win against the work tree and committed it
    over HEAD, where it was 0.61x. The op's file must be HEAD's blob before anything is measured."""
    import subprocess

    from autokernel.errors import UserError
    from autokernel.target.run import same_as_head

    def git(*a):
        subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True,
                       env={"GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@x", "GIT_COMMITTER_NAME": "u",
                            "GIT_COMMITTER_EMAIL": "u@x", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    (tmp_path / "ops").mkdir()
    f = tmp_path / "ops" / "norm.py"
    f.write_text("BLOCK = 32\n")
    git("init", "-q")
    git("add", "ops/norm.py")
    git("commit", "-qm", "init")
    same_as_head(tmp_path, "ops/norm.py")  # clean: no error
    f.write_text("BLOCK = 8\n")
    git("update-index", "--assume-unchanged", "ops/norm.py")
    with pytest.raises(UserError, match="differs from HEAD's copy"):
        same_as_head(tmp_path, "ops/norm.py")
    (tmp_path / "ops" / "new.py").write_text("x = 1\n")
    with pytest.raises(UserError, match="not in HEAD"):
        same_as_head(tmp_path, "ops/new.py")
