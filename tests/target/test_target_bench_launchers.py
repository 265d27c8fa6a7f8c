"""`autokernel bench --repo` and `run --repo` on a target op with several launchers (autokernel/target/bench.py,
autokernel/bench/results.py): a candidate replaces the whole file, so the figure that decides a win is the
workload's time in the file over every launcher's calls, each launcher's figure reported beside it.

The toy is tests/target/test_target_launchers.py's two-launcher checkout (`norm` then `scale`, each called at 7, 1
and 3 rows by the workload). The class: the bench timed the first launcher only, where a candidate 4x faster in
`norm` and 16x slower in `scale` won. Real runs time each file in fresh sandboxed processes (CPU interpreter, the
short policy of test_target_bench.py); the planted differences are whole repeated launches, far outside the noise.
"""
import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_target_launchers import BOTH, OPS, checkout

from autokernel.bench.results import decide
from autokernel.cli.bench import bench_command
from autokernel.policy import Bench, Policy
from autokernel.target import bench as target_bench

NORM_LAUNCH = "    _norm_kernel[(rows,)](x, y, eps, x.shape[-1], BLOCK=_block(x.shape[-1]))\n"
SCALE_LAUNCH = "    _scale_kernel[(triton.cdiv(x.numel(), 64),)](x, y, s, x.numel(), BLOCK=64)\n"
assert NORM_LAUNCH in textwrap.dedent(OPS) and SCALE_LAUNCH in textwrap.dedent(OPS)


def _repeat(launch: str, n: int) -> str:
    """The same launch n times: the same outputs, n times the work (a planted slow launcher)."""
    return f"    for _ in range({n}):\n    " + launch


def _source(norm_times: int = 1, scale_times: int = 1) -> str:
    text = textwrap.dedent(OPS)
    if norm_times > 1:
        text = text.replace(NORM_LAUNCH, _repeat(NORM_LAUNCH, norm_times))
    if scale_times > 1:
        text = text.replace(SCALE_LAUNCH, _repeat(SCALE_LAUNCH, scale_times))
    return text


def _policy() -> Policy:
    return Policy.model_validate({"bench": {"max_time_s": 2, "rounds": 6, "job_time_s": 0.2},
                                  "sandbox": {"timeout_s": 120}})


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _bench(root: Path, cands: list[Path], capsys) -> tuple[int, dict]:
    code = bench_command("pair", cands, None, True, policy=_policy(), repo=root)
    return code, json.loads(capsys.readouterr().out)


def test_an_identical_copy_wins_nothing_on_either_launcher(tmp_path, capsys):
    """Both launchers' calls are timed (each case's shape names its launcher), both launchers' figures come back,
    and an identical copy's figures are near 1 (bounded, not decided: whether a near-1 figure is declared a win is
    the stats rule's, tests/bench/test_bench_stats.py, and machine load moves it: tests/bench/test_bench_command.py)."""
    root = checkout(tmp_path / "co", BOTH)
    copy = _write(tmp_path / "copy" / "pair.py", _source())
    code, m = _bench(root, [copy], capsys)
    assert code in (0, 1), m
    inc, cand = m["files"]
    assert inc["status"] == "ok" and cand["status"] == "ok", m["files"]
    assert [(s["shape"], s["calls"]) for s in inc["shapes"]] == [
        ({"M": m_, "layout": 0, "launcher": name}, 1) for name in ("norm", "scale") for m_ in (1, 3, 7)]
    assert [r["launcher"] for r in inc["launchers"]] == ["norm", "scale"]
    assert abs(sum(r["share"] for r in inc["launchers"]) - 1) < 1e-9
    assert [r["launcher"] for r in cand["launchers"]] == ["norm", "scale"]
    sp = cand["speedup"]
    print(f"identical copy: {sp['est']:.3f} [{sp['lo']:.3f}, {sp['hi']:.3f}]; per launcher "
          + ", ".join(f"{r['launcher']} {r['share']:.0%} {r['speedup']['est']:.3f}" for r in cand["launchers"]))
    assert 0.75 < sp["est"] < 1.33, cand  # the same code, each file in its own processes: within a third of 1
    assert all(0.75 < r["speedup"]["est"] < 1.33 for r in cand["launchers"]), cand["launchers"]


def test_a_win_on_one_launcher_does_not_hide_a_loss_on_the_other(tmp_path, capsys):
    """The checkout's file launches `norm` 4 times; the candidate launches it once (4x faster there) and `scale` 16
    times (16x slower there). Timed on `norm` alone, as the bench did, it won; over both launchers' calls the
    workload's time in the file grows, and it is no win."""
    root = checkout(tmp_path / "co", BOTH)
    _write(root / "toyl/ops/pair.py", _source(norm_times=4))
    cand = _write(tmp_path / "cand" / "pair.py", _source(scale_times=16))
    code, m = _bench(root, [cand], capsys)
    inc, c = m["files"]
    assert c["status"] == "ok", c
    print(f"combined {c['speedup']['est']:.3f}; " + ", ".join(
        f"{r['launcher']} {r['share']:.0%} {r['speedup']['est']:.3f}" for r in c["launchers"]))
    assert code == 1 and not c["accepted"] and c["reason"] == "bench.no_win", c
    assert c["speedup"]["hi"] < 1.0, c["speedup"]  # a loss over the workload's calls, not only "no win"
    per = {r["launcher"]: r for r in c["launchers"]}
    assert per["norm"]["speedup"]["lo"] > 1.5 and per["scale"]["speedup"]["hi"] < 0.5, per  # the planted figures
    assert "over every launcher's calls" in c["detail"], c["detail"]


def test_the_decision_is_the_workload_time_not_a_geometric_mean():
    """Synthetic rounds (decide is pure): a launcher holding half of the incumbent's time 4x faster, the other 2x
    slower. A geometric mean over the shapes would say 1.41x and accept; the workload's time in the file is 1/(0.5/4 +
    0.5*2) = 0.89x of the incumbent's speed: no win."""
    rounds = 8
    inc = [10.0 + 0.01 * k for k in range(rounds)]
    cases = [{"shape": {"M": 1, "layout": 0, "launcher": name}, "dtype": "float32", "reps": rounds,
              "times_ms": [inc, [t / f for t in inc]], "wall_ms": [inc, [t / f for t in inc]]}
             for name, f in (("fwd", 4.0), ("bwd", 0.5))]
    raw = {"device": "cpu", "files": [{"path": "inc", "status": "ok"}, {"path": "cand", "status": "ok"}],
           "cases": cases}
    spec = SimpleNamespace(flops=lambda s: 0, bytes_moved=lambda s, d: 0, extra={})
    bench = Bench()
    r = decide("pair", raw, [1, 1], bench, None, ["incumbent", "candidate"], spec)[1]
    assert [(x.launcher, round(x.share, 3)) for x in r.launchers] == [("fwd", 0.5), ("bwd", 0.5)]
    assert np.isclose(r.speedup.est, 1 / (0.5 / 4 + 0.5 * 2)), r.speedup
    assert not r.accepted and r.reason == "bench.no_win", r
    one = dict(raw, cases=[{**c, "shape": {"M": 1, "layout": 0}} for c in cases])  # the same shapes, one launcher
    g = decide("pair", one, [1, 1], bench, None, ["incumbent", "candidate"], spec)[1]
    # a one-launcher op's shapes combine the same way (stats.weighted_speedup): no win either, where the weighted
    # geometric mean it used before said 1.41x
    assert np.isclose(g.speedup.est, 1 / (0.5 / 4 + 0.5 * 2)) and g.launchers == [] and not g.accepted, g


def test_run_works_on_a_several_launcher_op(tmp_path, monkeypatch):
    """`run --repo` no longer skips (or, with --op, refuses) an op with several launchers: it reaches its session."""
    from autokernel.target import profile_target, rank_target
    from autokernel.target import run as target_run
    root = checkout(tmp_path / "co", BOTH)
    monkeypatch.setattr(profile_target, "profile", lambda *a, **k: (tmp_path / "trace", None))
    monkeypatch.setattr(rank_target, "load", lambda *a, **k: {})
    monkeypatch.setattr(rank_target, "rank", lambda *a, **k: [{"op": "pair", "share": 1.0, "status": "target"}])
    monkeypatch.setattr(rank_target, "print_rank", lambda *a, **k: None)
    reached = []
    monkeypatch.setattr(target_run, "work_on", lambda root, n, *a: reached.append(n) or n)
    printed = []

    class Console:
        def status(self, *a):
            import contextlib
            return contextlib.nullcontext()

        def print(self, *a, **k):
            printed.append(" ".join(map(str, a)))
    # git.commit off: this checkout is no git repository (a committing run first checks the declaration is HEAD's)
    ctx = SimpleNamespace(console=Console(), profile_policy=Policy(), policy=Policy(git={"commit": False}))
    assert target_run.pipeline(ctx, root, None) == ["pair"]
    assert target_run.pipeline(ctx, root, "pair") == ["pair"]
    assert reached == ["pair", "pair"] and not any("skipping" in p for p in printed), printed


def test_launcher_cases_keep_one_launcher_as_it_was(monkeypatch):
    """One launcher: the spec and cases `cases` makes, no launcher named in the shapes (the bench of a one-launcher
    op is unchanged)."""
    spec = SimpleNamespace(extra={"target": {"launcher": "norm"}})
    seen = []
    monkeypatch.setattr(target_bench, "cases", lambda sp, calls: seen.append(calls) or [{"shape": {"M": 1}}])
    assert target_bench.launcher_cases([spec], {"norm": "calls"}) == (spec, [{"shape": {"M": 1}}])
    assert seen == ["calls"]


def test_the_prompt_shows_every_launchers_reference(tmp_path):
    """`run`'s model is shown each launcher's reference (it was shown the first launcher's only), since every
    launcher is judged and timed."""
    from autokernel.target import declaration as decl
    from autokernel.target import run as target_run
    root = checkout(tmp_path / "co", BOTH)
    task = target_run.prompt(root, decl.load(root).ops["pair"], {}).task
    assert "def norm(x, eps):" in task and "def scale(x, s):" in task and "what each launcher must compute" in task
