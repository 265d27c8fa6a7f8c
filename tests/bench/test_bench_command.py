"""`autokernel bench`: bad input is exit 2 with a message; real runs go through the sandbox."""
import json
import textwrap
from pathlib import Path

import pytest

from autokernel.bench.command import _cases, bench_command
from autokernel.bench.trace import shapes_from_trace
from autokernel.errors import UserError
from autokernel.ops import get
from autokernel.policy import Policy
from autokernel.sandbox import bwrap

INCUMBENT = bwrap.PROJECT / "kernels" / "rmsnorm.py"


def test_unknown_op_is_bad_input(capsys, tmp_path):
    assert bench_command("no_such_op", [], None, False, job_root=tmp_path) == 2
    assert "unknown op 'no_such_op'" in capsys.readouterr().err


def test_missing_candidate_is_bad_input(capsys, tmp_path):
    assert bench_command("rmsnorm", [tmp_path / "nope.py"], None, False, job_root=tmp_path) == 2
    assert "nope.py: no such candidate file" in capsys.readouterr().err


def test_bad_trace_is_bad_input(capsys, tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"ops": {"matmul": {"shapes": []}}}))
    assert bench_command("rmsnorm", [], tmp_path, False, job_root=tmp_path) == 2
    assert "no shapes recorded for op 'rmsnorm'" in capsys.readouterr().err


def test_trace_reader(tmp_path):
    f = tmp_path / "summary.json"
    f.write_text(json.dumps({"ops": {"rmsnorm": {"shapes": [{"shape": {"M": 4, "N": 576}, "calls": 60},
                                                            {"shape": {"M": 1, "N": 576}}]}}}))
    assert shapes_from_trace(tmp_path, "rmsnorm") == [{"shape": {"M": 4, "N": 576}, "calls": 60, "dtype": None},
                                                      {"shape": {"M": 1, "N": 576}, "calls": 1, "dtype": None}]
    f.write_text(json.dumps({"ops": {"rmsnorm": {"shapes": [{"shape": {"M": "4"}, "calls": 1}]}}}))
    with pytest.raises(UserError, match=r"shapes\[0\]\.shape"):
        shapes_from_trace(f, "rmsnorm")
    f.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        shapes_from_trace(f, "rmsnorm")


def _policy(**bench) -> Policy:
    return Policy.model_validate({"bench": bench, "sandbox": {"timeout_s": 120}})


def test_without_a_trace_the_model_shapes_count_alike():
    cases = _cases("rmsnorm", None)
    assert [c["shape"] for c in cases] == [dict(s) for s in get("rmsnorm").model_shapes]
    assert {c["calls"] for c in cases} == {1} and {c["dtype"] for c in cases} == {"float32"}


def test_rmsnorm_against_itself_is_no_win(tmp_path, capsys):
    # The real thing: the incumbent against a copy of itself, through the sandbox, at the model's decode shapes
    # (M=96 costs ~0.2 s a call in the interpreter; the suite has a time budget).
    cand = tmp_path / "rmsnorm_copy.py"
    cand.write_text(INCUMBENT.read_text())
    trace = tmp_path / "summary.json"
    trace.write_text(json.dumps({"ops": {"rmsnorm": {"shapes": [{"shape": {"M": 1, "N": 576}, "calls": 300},
                                                                {"shape": {"M": 4, "N": 576}, "calls": 30}]}}}))
    rc = bench_command("rmsnorm", [cand], trace, True, policy=_policy(max_time_s=4, confidence=0.99),
                       job_root=tmp_path / "jobs")
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert out["label"] == "CPU / Triton interpreter"
    inc, c = out["files"]
    assert inc["role"] == "incumbent" and c["role"] == "candidate" and c["status"] == "ok", c
    sp = c["speedup"]
    print(f"rmsnorm vs itself: weighted speedup {sp['est']:.3f} [{sp['lo']:.3f}, {sp['hi']:.3f}] (99% CI); "
          + "; ".join(f"M={s['shape']['M']}: {s['speedup']['est']:.3f} [{s['speedup']['lo']:.3f}, "
                      f"{s['speedup']['hi']:.3f}] n={s['reps']}" for s in c["shapes"]))
    assert sp["lo"] <= 1.0 <= sp["hi"]
    assert not c["accepted"] and c["reason"] == "bench.no_win"
    assert all(s["reps"] >= 10 and s["reps"] % 2 == 0 for s in c["shapes"])
    assert all(s["gbps"] > 0 and 0 < s["fraction_of_peak"] < 1 for s in inc["shapes"])


CHEATERS = {
    # SHORTCUTS.md #4: replay the first result for the same input pointer
    "replay": """
        from kernels.rmsnorm import rmsnorm as _real
        _cache = {}
        def rmsnorm(x, weight, eps):
            key = (x.data_ptr(), tuple(x.shape))
            if key not in _cache:
                _cache[key] = _real(x, weight, eps)
            return _cache[key]
    """,
    # #15: return at once and finish the work on a thread the timer does not wait for
    "side_thread": """
        import threading, time, torch
        from kernels.rmsnorm import rmsnorm as _real
        def _later(y, x, weight, eps):
            time.sleep(0.05)  # after the timer stopped
            y.copy_(_real(x, weight, eps))
        def rmsnorm(x, weight, eps):
            y = torch.empty_like(x)
            threading.Thread(target=_later, args=(y, x, weight, eps)).start()
            return y
    """,
    # #17: patch the clocks at import (the harness bound its own references first, and notices the patch)
    "patch_timer": """
        import time, torch
        time.perf_counter_ns = lambda: 0
        time.monotonic = lambda: 0.0
        torch.cuda.Event.elapsed_time = lambda self, end: 0.0
        from kernels.rmsnorm import rmsnorm
    """,
    # #17/#18: patch the harness's own clock binding and the trusted reference it checks against
    "patch_harness": """
        import autokernel.bench.child as harness
        from autokernel.ops import get
        harness._perf_ns = lambda: 0
        object.__setattr__(get("rmsnorm"), "reference", lambda x, weight, eps: x)
        def rmsnorm(x, weight, eps):
            return x
    """,
    "wrong": """
        def rmsnorm(x, weight, eps):
            return x * weight
    """,
    "raises": """
        def rmsnorm(x, weight, eps):
            raise RuntimeError("kernel launch failed")
    """,
    "no_launcher": "def something_else():\n    pass\n",
}
EXPECTED = {"replay": "bench.mismatch", "side_thread": "bench.tampered", "patch_timer": "bench.tampered",
            "patch_harness": "bench.tampered",
            "wrong": "bench.mismatch", "raises": "bench.error", "no_launcher": "bench.error"}


def test_cheating_candidates_are_rejected(tmp_path, capsys):
    trace = tmp_path / "summary.json"
    trace.write_text(json.dumps({"ops": {"rmsnorm": {"shapes": [{"shape": {"M": 4, "N": 576}, "calls": 1}]}}}))
    cands = []
    for name, src in CHEATERS.items():
        cands.append(tmp_path / f"{name}.py")
        cands[-1].write_text(textwrap.dedent(src))
    rc = bench_command("rmsnorm", cands, trace, True, policy=_policy(max_time_s=1.0), job_root=tmp_path / "jobs")
    out = json.loads(capsys.readouterr().out)
    got = {Path(f["path"]).stem: f for f in out["files"] if f["role"] == "candidate"}
    assert {k: got[k]["reason"] for k in EXPECTED} == EXPECTED, got
    assert len(out["job_dirs"]) == 1  # no candidate brought the shared job down
    assert rc == 1
    got = {k: (v["reason"], v["detail"]) for k, v in got.items()}
    assert "thread" in got["side_thread"][1]
    assert "time.perf_counter_ns" in got["patch_timer"][1]
    assert "_perf_ns" in got["patch_harness"][1] and "reference" in got["patch_harness"][1]
    assert "RuntimeError: kernel launch failed" in got["raises"][1]


def test_sabotaging_the_incumbent_is_caught(tmp_path, capsys):
    # #17/#19 the other way round: slow down what the incumbent calls (torch.empty), after a few calls so that the
    # import-time and warm-up checks pass; the periodic snapshot comparison must still name the candidate.
    cand = tmp_path / "saboteur.py"
    cand.write_text(textwrap.dedent("""
        import time, torch
        from kernels.rmsnorm import rmsnorm as _real
        _empty, _calls = torch.empty, [0]
        def _slow_empty(*a, **k):
            time.sleep(0.005)
            return _empty(*a, **k)
        def rmsnorm(x, weight, eps):
            _calls[0] += 1
            if _calls[0] == 3:
                torch.empty = _slow_empty
            return _real(x, weight, eps)
    """))
    trace = tmp_path / "summary.json"
    trace.write_text(json.dumps({"ops": {"rmsnorm": {"shapes": [{"shape": {"M": 1, "N": 576}, "calls": 1}]}}}))
    rc = bench_command("rmsnorm", [cand], trace, True, policy=_policy(max_time_s=1.0), job_root=tmp_path / "jobs")
    out = json.loads(capsys.readouterr().out)
    c = out["files"][-1]
    assert rc == 1 and c["reason"] == "bench.tampered" and "torch.empty" in c["detail"], c


def test_a_dead_shared_job_is_retimed_one_candidate_at_a_time(tmp_path, monkeypatch):
    # The shared job dies (a crash, or shared state changed by an unknown file): each candidate gets its own job.
    from autokernel import sandbox
    from autokernel.bench import measure as measure_mod
    calls = []

    def fake_run(entry, payload, job_dir, limits):
        files = payload["files"]
        calls.append(len(files))
        if len(files) > 2:
            return sandbox.SandboxResult(False, "sandbox.error", "autokernel.bench.child.JobContaminated: replaced "
                                         "torch.empty (shape {}, repetitions up to 8); more than one file", {})
        if "bad" in files[1]:
            return sandbox.SandboxResult(False, "sandbox.crash", "killed by SIGSEGV", {})
        t = [1.0, 1.1] * 6
        return sandbox.SandboxResult(True, None, "", {
            "files": [{"path": f, "status": "ok"} for f in files],
            "cases": [{"shape": {"M": 1, "N": 576}, "dtype": "float32", "reps": 12, "times_ms": [t, t]}]})

    monkeypatch.setattr(sandbox, "run", fake_run)
    for name in ("good", "bad"):
        (tmp_path / f"{name}.py").write_text("")
    m = measure_mod.measure("rmsnorm", [tmp_path / "good.py", tmp_path / "bad.py"],
                            [{"shape": {"M": 1, "N": 576}, "calls": 1, "dtype": "float32"}], Policy(), tmp_path)
    assert calls == [3, 2, 2]
    assert [(f.role, f.status) for f in m.files] == [("incumbent", "ok"), ("candidate", "ok"),
                                                     ("candidate", "sandbox.crash")]
    assert m.files[1].speedup.contains(1.0) and not m.files[1].accepted
