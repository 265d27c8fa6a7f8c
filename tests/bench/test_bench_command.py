"""`autokernel bench`: bad input is exit 2 with a message; the static stage refuses first; real runs time each file in
fresh sandboxed processes of its own (autokernel.bench.rounds)."""
import json
import textwrap
from pathlib import Path

import pytest

from autokernel.bench import measure as measure_mod
from autokernel.cli.bench import _cases, bench_command
from autokernel.errors import UserError
from autokernel.ops import get
from autokernel.paths import INSTALLED_LAYOUT
from autokernel.policy import Policy

INCUMBENT = INSTALLED_LAYOUT.kernels / "rmsnorm.py"
TINY = [{"shape": {"M": 1, "N": 64}, "calls": 3, "dtype": "float32"},
        {"shape": {"M": 3, "N": 576}, "calls": 1, "dtype": "float32"}]


def _policy(**bench) -> Policy:
    return Policy.model_validate({"bench": bench, "sandbox": {"timeout_s": 120}})


def _write(tmp_path: Path, name: str, src: str) -> Path:
    p = tmp_path / f"{name}.py"
    p.write_text(textwrap.dedent(src))
    return p


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


def test_trace_cases(tmp_path):
    """The bench reads a trace through the one reader (autokernel.profile.trace): calls weight, dtype defaults."""
    f = tmp_path / "summary.json"
    f.write_text(json.dumps({"ops": {"rmsnorm": {"shapes": [{"shape": {"M": 4, "N": 576}, "calls": 60},
                                                            {"shape": {"M": 1, "N": 576}}]}}}))
    assert _cases("rmsnorm", tmp_path) == [{"shape": {"M": 4, "N": 576}, "calls": 60, "dtype": "float32"},
                                           {"shape": {"M": 1, "N": 576}, "calls": 1, "dtype": "float32"}]
    f.write_text(json.dumps({"ops": {"rmsnorm": {"shapes": [{"shape": {"M": "4"}, "calls": 1}]}}}))
    with pytest.raises(UserError, match=r"shapes\[0\]\.shape"):
        _cases("rmsnorm", f)
    f.write_text("{not json")
    with pytest.raises(UserError, match="not JSON"):
        _cases("rmsnorm", f)


def test_without_a_trace_the_model_shapes_count_alike():
    cases = _cases("rmsnorm", None)
    assert [c["shape"] for c in cases] == [dict(s) for s in get("rmsnorm").model_shapes]
    assert {c["calls"] for c in cases} == {1} and {c["dtype"] for c in cases} == {"float32"}


def test_the_static_stage_refuses_before_anything_is_timed(tmp_path, capsys, monkeypatch):
    # issue 10.5: what the gate refuses is never timed (timing runs the file's code); exit 1, a clean negative.
    def no_timing(*a, **k):
        raise AssertionError("a refused candidate reached the benchmark")
    monkeypatch.setattr(measure_mod, "measure", no_timing)
    monkeypatch.setattr("autokernel.cli.bench.measure", no_timing)
    good = tmp_path / "good.py"
    good.write_text(INCUMBENT.read_text())
    bad = _write(tmp_path, "bad", INCUMBENT.read_text() + "\nimport os\nos.system('true')\n")
    assert bench_command("rmsnorm", [good, bad], None, True, job_root=tmp_path / "jobs") == 1
    out = json.loads(capsys.readouterr().out)
    assert [Path(r["path"]).name for r in out["refused"]] == ["bad.py"]
    assert out["refused"][0]["reason"].startswith("static.")
    assert bench_command("rmsnorm", [bad], None, False, job_root=tmp_path / "jobs") == 1
    assert "refused by the gate's static stage" in capsys.readouterr().out


def test_an_identical_copy_and_an_incumbent_tamperer_measure_near_one(tmp_path, capsys):
    # Real timing under the Triton interpreter, tiny shapes. Two candidates:
    # - an identical copy of the incumbent: its speedup over rounds comes out near 1;
    # - a copy that, on import, slows down every OTHER rmsnorm module it finds in its process (through that module's
    #   globals, which the old shared-process harness never snapshotted): in a shared process the incumbent slows
    #   by 20 ms a call and this candidate "wins" by several x; in a process of its own there is nothing to slow.
    copy = tmp_path / "rmsnorm_copy.py"
    copy.write_text(INCUMBENT.read_text())
    tamper = _write(tmp_path, "tamperer", INCUMBENT.read_text() + textwrap.dedent("""
        import sys as _sys, time as _time
        class _SlowTorch:
            def __getattr__(self, name):
                if name == "empty":
                    def empty(*a, **k):
                        _time.sleep(0.02)
                        return torch.empty(*a, **k)
                    return empty
                return getattr(torch, name)
        for _m in list(_sys.modules.values()):
            if _m is not None and getattr(_m, "rmsnorm_kernel", None) is not None and _m.__dict__ is not globals():
                _m.torch = _SlowTorch()
    """))
    trace = tmp_path / "summary.json"
    trace.write_text(json.dumps({"ops": {"rmsnorm": {"shapes": [{"shape": c["shape"], "calls": c["calls"]}
                                                                for c in TINY]}}}))
    # What does not depend on the machine's load: each file's figure is its own process's, so the tamperer's is
    # the copy's (both near 1), never the several x a shared process gave. Whether a near-1 figure is declared a
    # win is a statistical decision (tests/bench/test_bench_stats.py checks the rule on fixed timings) whose
    # false-win rate contention raises: under CI's load (the other worker's interpreter jobs) an identical copy's
    # interval came out [1.024, 1.151], [1.030, 1.177] and once more with 10 rounds, on 2026-12-05, and 0.959-1.040
    # in 14 reruns here; so this test bounds the estimate, and leaves the decision to the stats tests.
    m = measure_mod.measure("rmsnorm", [copy, tamper], TINY, _policy(max_time_s=2, rounds=10, job_time_s=0.2),
                            tmp_path / "jobs", INCUMBENT)
    inc, c_copy, c_tamper = m.files
    for c in (c_copy, c_tamper):
        sp = c.speedup
        print(f"{Path(c.path).name}: weighted speedup {sp.est:.3f} [{sp.lo:.3f}, {sp.hi:.3f}] (95% CI, "
              f"{m.rounds} rounds, {m.clock})")
        assert c.status == "ok" and 0.75 < sp.est < 1.33, c  # the same code: within a third of 1, under any load
    assert c_tamper.speedup.est < 1.5  # the shared-process harness measured it several x "faster"
    assert m.label == "CPU / Triton-interpreter CPU time" and m.rounds >= 6 and m.rounds % 2 == 0
    assert m.clock.startswith("Triton-interpreter CPU time")
    assert all(s.reps == m.rounds for s in c_copy.shapes)
    assert all(j["extra_processes"] == [] and j["processes_seen"] == 1 for j in m.jobs)


CHEATERS = {
    # docs/shortcuts.md #4: replay the first result for the same input pointer
    "replay": """
        import importlib.util
        _s = importlib.util.spec_from_file_location("_inc", "{inc}")
        _inc = importlib.util.module_from_spec(_s); _s.loader.exec_module(_inc)
        _cache = {{}}
        def rmsnorm(x, weight, eps):
            key = (x.data_ptr(), tuple(x.shape))
            if key not in _cache:
                _cache[key] = _inc.rmsnorm(x, weight, eps)
            return _cache[key]
    """,
    # #15: return at once and finish the work on a thread the timer does not wait for
    "side_thread": """
        import importlib.util, threading, time, torch
        _s = importlib.util.spec_from_file_location("_inc", "{inc}")
        _inc = importlib.util.module_from_spec(_s); _s.loader.exec_module(_inc)
        def _later(y, x, weight, eps):
            time.sleep(0.05)  # after the timer stopped
            y.copy_(_inc.rmsnorm(x, weight, eps))
        def rmsnorm(x, weight, eps):
            y = torch.empty_like(x)
            threading.Thread(target=_later, args=(y, x, weight, eps)).start()
            return y
    """,
    # #17: patch the clocks at import (the harness bound its own references first, and notices the patch)
    "patch_timer": """
        import time, torch
        time.perf_counter_ns = lambda: 0
        torch.cuda.Event.elapsed_time = lambda self, end: 0.0
        def rmsnorm(x, weight, eps):
            return x
    """,
    # #17/#18: patch the harness's own clock binding and the trusted reference
    "patch_harness": """
        import autokernel.bench.job as harness
        from autokernel.ops import get
        harness._perf_ns = lambda: 0
        object.__setattr__(get("rmsnorm"), "reference", lambda x, weight, eps: x)
        def rmsnorm(x, weight, eps):
            return x
    """,
    # correct on some calls only: fast garbage on every third call (the parent checks the timed outputs)
    "sometimes_wrong": """
        import importlib.util, torch
        _s = importlib.util.spec_from_file_location("_inc", "{inc}")
        _inc = importlib.util.module_from_spec(_s); _s.loader.exec_module(_inc)
        _n = [0]
        def rmsnorm(x, weight, eps):
            _n[0] += 1
            return torch.zeros_like(x) if _n[0] % 3 == 0 else _inc.rmsnorm(x, weight, eps)
    """,
    # starts a hog process (blocked by seccomp on CPU; seen by the parent's watcher where it is not)
    "hog": """
        import os, time
        if os.fork() == 0:
            while True:
                pass
        def rmsnorm(x, weight, eps):
            return x
    """,
    # 4c: damage the incumbent's outputs in a shared process (its launcher allocates NaNs and launches nothing), so a
    # harness that shares the process blames the incumbent (exit 2, the agent session ends); itself wrong too
    "saboteur": """
        import sys, torch
        class _Nan:
            def __getattr__(self, name):
                if name == "empty":
                    return lambda *a, **k: torch.full(a[0], float("nan"), dtype=k.get("dtype"), device=k.get("device"))
                return getattr(torch, name)
        class _NoLaunch:
            def __getitem__(self, grid):
                return lambda *a, **k: None
        for _m in list(sys.modules.values()):
            if _m is not None and getattr(_m, "rmsnorm_kernel", None) is not None:
                _m.torch, _m.rmsnorm_kernel = _Nan(), _NoLaunch()
        def rmsnorm(x, weight, eps):
            return x * weight
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
            "patch_harness": "bench.tampered", "sometimes_wrong": "bench.mismatch",
            "hog": ("bench.error", "bench.tampered"),  # EPERM from seccomp at import, or the watcher
            "saboteur": "bench.mismatch",
            "wrong": "bench.mismatch", "raises": "bench.error", "no_launcher": "bench.error"}


def test_cheating_candidates_are_rejected_and_the_incumbent_is_untouched(tmp_path):
    # Harness level (measure() directly: the static stage would refuse every one of these before timing). Each file
    # fails in its own jobs; the incumbent's jobs never see them and its figures stand.
    cands = [_write(tmp_path, name, src.format(inc=INCUMBENT)) for name, src in CHEATERS.items()]
    m = measure_mod.measure("rmsnorm", cands, TINY[:1], _policy(max_time_s=1.0), tmp_path / "jobs", INCUMBENT)
    got = {Path(f.path).stem: f for f in m.files if f.role == "candidate"}
    for name, want in EXPECTED.items():
        assert got[name].reason in (want if isinstance(want, tuple) else (want,)), (name, got[name])
    assert m.files[0].role == "incumbent" and m.files[0].status == "ok" and m.files[0].shapes
    details = {k: v.detail for k, v in got.items()}
    assert "thread" in details["side_thread"]
    assert "time.perf_counter_ns" in details["patch_timer"]
    assert "_perf_ns" in details["patch_harness"] and "reference" in details["patch_harness"]
    assert "RuntimeError: kernel launch failed" in details["raises"]
    assert "differs from the reference" in details["sometimes_wrong"]
    assert m.rounds == 1  # every candidate failed in round 0: nothing left to compare
    inc_jobs = [j for j in m.jobs if j["role"] == "incumbent"]
    assert len(inc_jobs) == 1 and all(j["extra_processes"] == [] for j in inc_jobs)
