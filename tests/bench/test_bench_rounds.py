"""The rounds' plumbing and the parent's judgement, with sandbox.run stubbed by a fake job (fast): one file per job,
the incumbent's jobs get only the incumbent, A/B order alternates, and a job's word is never taken for its outputs."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from autokernel import sandbox
from autokernel.bench import job, lockstep, rounds
from autokernel.bench import measure as measure_mod
from autokernel.bench.watch import Watch
from autokernel.ops import get
from autokernel.paths import INSTALLED_LAYOUT
from autokernel.policy import Policy

INCUMBENT = INSTALLED_LAYOUT.kernels / "rmsnorm.py"
CASES = [{"shape": {"M": 2, "N": 64}, "calls": 1, "dtype": "float32"},
         {"shape": {"M": 1, "N": 32}, "calls": 2, "dtype": "float32"}]


def fake_child(source: bytes, payload: dict, ms: float, tweak=None, wall: float | None = None) -> dict:
    """What an honest job returns for a file that takes `ms` of CPU time a call (and `wall` ms of wall time, `ms` by
    default): outputs computed from the payload's seed. `tweak(data)` lets a test forge what a hostile file would."""
    spec = get(payload["op"])
    cases = []
    for ci, c in enumerate(payload["cases"]):
        sets = job.pool(spec, c, payload["seed"], ci)
        kept = [{"case": ci, "rep": r, "outputs": [spec.reference(**job.values(sets, payload["seed"], ci, r))]}
                for r in range(min(payload["reps"], job.KEEP))]
        cases.append({"cpu_ms": [ms] * payload["reps"], "wall_ms": [ms if wall is None else wall] * payload["reps"],
                      "kept": kept})
    data = {"device": "cpu", "failure": None, "cases": cases}
    return tweak(data) if tweak else data


def stub(monkeypatch, speed: dict, tweak: dict | None = None, wall: dict | None = None) -> list:
    """sandbox.run replaced: records (source, payload) per job; speed (CPU ms a call), wall (wall ms a call, the CPU
    time by default) and tweak keyed by a marker in the file's bytes."""
    calls = []

    def run(entry, payload, job_dir, limits, *, inputs=None, **kw):
        assert entry == rounds.ENTRY and list(inputs) == [f"{payload['op']}.py"]  # one file, under its op's name
        src = inputs[f"{payload['op']}.py"]
        calls.append((src, payload, Path(job_dir).name))
        key = next((k for k in speed if k.encode() in src), "incumbent")
        data = fake_child(src, payload, speed.get(key, 1.0), (tweak or {}).get(key), (wall or {}).get(key))
        return sandbox.SandboxResult(True, None, "", data, Path(job_dir), 0.01, "bwrap+cgroup+seccomp")

    monkeypatch.setattr(sandbox, "run", run)
    return calls


def _cand(tmp_path: Path, marker: str) -> Path:
    p = tmp_path / f"{marker}.py"
    p.write_bytes(INCUMBENT.read_bytes() + f"\n# {marker}\n".encode())
    return p


def test_each_job_loads_one_file_and_the_incumbent_never_sees_a_candidate(tmp_path, monkeypatch):
    calls = stub(monkeypatch, {"fast": 0.5})
    m = measure_mod.measure("rmsnorm", [_cand(tmp_path, "fast")], CASES, Policy(), tmp_path, INCUMBENT)
    inc = INCUMBENT.read_bytes()
    calls.sort(key=lambda c: c[2])  # roundNN-K-...: the round, then the place in its order (lockstep: turn order)
    roles = ["I" if src == inc else "C" for src, _, _ in calls]
    assert all(src == inc or b"# fast" in src for src, _, _ in calls)
    assert "".join(roles[:8]) == "ICCICIIC"  # who goes first: I C C I over rounds (ABBA), equally often
    seeds = [p["seed"] for _, p, _ in calls]
    assert all(seeds[k] == seeds[k + 1] for k in range(0, len(seeds), 2))  # a round shares its inputs
    assert len(set(seeds)) == m.rounds
    c = m.files[1]
    assert c.accepted and abs(c.speedup.est - 2.0) < 1e-6 and m.rounds >= 6


def test_on_cpu_the_verdict_is_the_process_cpu_time_not_the_wall_clock(tmp_path, monkeypatch):
    # The jobs report both clocks and they disagree: the candidate uses 0.8x the incumbent's CPU time per call, but
    # its calls took 2x the incumbent's wall time (the machine was busy during its jobs; 2.5x the incumbent's wall
    # per CPU second stays under bench.max_wait_ratio). The verdict follows the CPU time: 1.25x, accepted; judged by
    # the wall clock it would be 0.5x. And every reading of the machine's load is out of the verdict.
    stub(monkeypatch, {"incumbent": 1.0, "cand": 0.8}, wall={"incumbent": 1.0, "cand": 2.0})
    m = measure_mod.measure("rmsnorm", [_cand(tmp_path, "cand")], CASES, Policy(), tmp_path, INCUMBENT)
    c = m.files[1]
    assert c.accepted and abs(c.speedup.est - 1.25) < 1e-6, c
    assert all(abs(s.median_ms.est - 0.8) < 1e-9 for s in c.shapes)
    assert m.label == "CPU / Triton-interpreter CPU time" and "CPU time" in m.clock
    # More waiting than that (work done outside the process while the call waits) is implausible, never a win.
    stub(monkeypatch, {"incumbent": 1.0, "cand": 0.8}, wall={"incumbent": 1.0, "cand": 8.0})
    c = measure_mod.measure("rmsnorm", [_cand(tmp_path, "cand")], CASES, Policy(), tmp_path, INCUMBENT).files[1]
    assert not c.accepted and c.reason == "bench.implausible" and "wall time per CPU second" in c.detail
    # An incumbent whose calls kept two threads busy (wall half its CPU time) is no base for a one-thread candidate
    # (1.9 s of wall per CPU second under the lockstep turns): not waiting, not implausible.
    stub(monkeypatch, {"incumbent": 1.0, "cand": 0.8}, wall={"incumbent": 0.5, "cand": 1.5})
    c = measure_mod.measure("rmsnorm", [_cand(tmp_path, "cand")], CASES, Policy(), tmp_path, INCUMBENT).files[1]
    assert c.accepted and abs(c.speedup.est - 1.25) < 1e-6, c


def test_the_job_clock_counts_every_thread_and_not_sleep():
    # The harness's CPU timer (job._time_cpu, the clock the parent judges CPU runs by): a call that pushes its work
    # to another thread and waits for it is charged for that work; a call that sleeps is charged nothing for it.
    import threading

    def on_a_thread():
        t = threading.Thread(target=lambda: sum(i * i for i in range(1_500_000)))
        t.start()
        t.join()
        return 1

    def sleeps():
        time.sleep(0.2)
        return 2

    t0 = time.thread_time()
    out, ms = job._time_cpu(on_a_thread, {})
    mine = (time.thread_time() - t0) * 1e3  # this thread only: what a per-thread clock would have charged
    assert out == 1 and ms["cpu_ms"] > 50 and ms["cpu_ms"] > 5 * mine, (ms, mine)
    assert ms["wall_ms"] >= ms["cpu_ms"] * 0.9
    out, ms = job._time_cpu(sleeps, {})
    assert out == 2 and ms["wall_ms"] >= 200 and ms["cpu_ms"] < 50, ms


def test_a_jobs_ok_is_not_trusted(tmp_path, monkeypatch):
    # The job says "ok" but the outputs it returns are not those of the inputs the parent's seed makes.
    def garbage(data):
        for c in data["cases"]:
            for k in c["kept"]:
                k["outputs"] = [torch.zeros_like(k["outputs"][0])]
        return data

    def too_few(data):
        data["cases"][0]["kept"] = data["cases"][0]["kept"][:1]
        return data

    def shape_lie(data):
        for c in data["cases"]:
            for k in c["kept"]:
                k["outputs"] = [k["outputs"][0][:1]]
        return data

    def bad_times(data):
        data["cases"][1]["cpu_ms"] = data["cases"][1]["cpu_ms"][:-1]
        return data

    stub(monkeypatch, {"garbage": 0.1, "too_few": 0.1, "shape_lie": 0.1, "bad_times": 0.1},
         {"garbage": garbage, "too_few": too_few, "shape_lie": shape_lie, "bad_times": bad_times})
    cands = [_cand(tmp_path, k) for k in ("garbage", "too_few", "shape_lie", "bad_times")]
    m = measure_mod.measure("rmsnorm", cands, CASES, Policy(), tmp_path, INCUMBENT)
    got = {Path(f.path).stem: (f.reason, f.detail) for f in m.files[1:]}
    assert got["garbage"][0] == "bench.mismatch" and "differs from the reference" in got["garbage"][1]
    assert got["too_few"][0] == "bench.mismatch" and "expected 3" in got["too_few"][1]
    assert got["shape_lie"][0] == "bench.mismatch"
    assert got["bad_times"][0] == "bench.error"
    assert m.files[0].status == "ok" and not m.accepted


def test_only_the_incumbents_own_job_can_fail_the_incumbent(tmp_path, monkeypatch):
    def broken(data):
        data["failure"] = {"reason": "bench.error", "detail": "RuntimeError: boom", "case": None}
        return data
    stub(monkeypatch, {"cand": 1.0}, {"incumbent": broken})
    with pytest.raises(measure_mod.IncumbentFailed, match="boom"):
        measure_mod.measure("rmsnorm", [_cand(tmp_path, "cand")], CASES, Policy(), tmp_path, INCUMBENT)


def test_implausible_speed_is_judged_in_the_parent(tmp_path, monkeypatch):
    stub(monkeypatch, {"magic": 0.05})  # 20x the incumbent
    m = measure_mod.measure("rmsnorm", [_cand(tmp_path, "magic")], CASES, Policy(), tmp_path, INCUMBENT)
    c = m.files[1]
    assert not c.accepted and c.reason == "bench.implausible" and "limit 10x" in c.detail


def test_the_watcher_names_a_process_the_job_started(tmp_path):
    # A job whose root process forks a busy child: the parent sees it from outside (/proc), whatever the job says.
    # The child burns a fixed 0.3 s of CPU (process_time: the same amount whatever the machine's load, where a wall
    # time's share of CPU is not: ~1/3 on a loaded 2-core machine), says so, then idles until killed: the samples
    # taken while it idles (0.5 s, every ~20 ms) read all of it.
    busy = "import time\nwhile time.process_time() < 0.3: pass\nprint(flush=True)\ntime.sleep(60)"
    code = f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {busy!r}], " \
           "stdout=subprocess.PIPE); p.stdout.readline(); time.sleep(0.5); p.kill(); p.wait()"
    with Watch(interval_s=0.02) as w:
        subprocess.run([sys.executable, "-c", code], check=True)
    assert w.stats.extra and w.stats.max_processes == 2, w.stats
    assert w.stats.cpu_s > 0.25, w.stats  # the busy child's CPU time is the job's
    with Watch(interval_s=0.02) as w:
        subprocess.run([sys.executable, "-c", "import time; time.sleep(0.3)"], check=True)
    assert w.stats.extra == [] and w.stats.max_processes == 1 and w.stats.samples > 3


def test_a_job_with_another_process_rejects_its_file(tmp_path, monkeypatch):
    real = stub(monkeypatch, {"hog": 0.5})
    fake_run = sandbox.run

    def run(entry, payload, job_dir, limits, *, inputs=None, **kw):
        if b"# hog" in inputs["rmsnorm.py"]:  # this "job" starts a helper process while it runs
            subprocess.run([sys.executable, "-c", "import subprocess, sys, time; "
                            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(5)']); "
                            "time.sleep(0.3); p.kill()"], check=True)
        return fake_run(entry, payload, job_dir, limits, inputs=inputs, **kw)

    monkeypatch.setattr(sandbox, "run", run)
    t0 = time.monotonic()
    m = measure_mod.measure("rmsnorm", [_cand(tmp_path, "hog")], CASES, Policy(), tmp_path, INCUMBENT)
    c = m.files[1]
    assert c.reason == "bench.tampered" and "other processes" in c.detail, c
    assert real and time.monotonic() - t0 < 30


def test_lockstep_jobs_never_run_at_the_same_moment():
    # Two "jobs" that each burn 0.5 s of CPU and note the (system-wide monotonic) time every ~1 ms while they run.
    # In lockstep their notes come in alternating blocks, one per turn; running freely on two cores they would
    # interleave hundreds of times. A job that is stopped cannot do anything during the other's turn.
    code = ("import json, time\nts = []\nlast = 0.0\nwhile time.process_time() < 0.5:\n"
            "    t = time.monotonic()\n    if t - last > 0.001:\n        ts.append(t)\n        last = t\n"
            "print(json.dumps(ts))")

    def job():
        return json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                         check=True).stdout)

    jobs = [lockstep.Job(job), lockstep.Job(job)]
    lockstep.run_lockstep(jobs, slice_s=0.1)
    assert all(j.error is None for j in jobs), [j.error for j in jobs]
    notes = sorted([(t, 0) for t in jobs[0].result] + [(t, 1) for t in jobs[1].result])
    switches = sum(a[1] != b[1] for a, b in zip(notes, notes[1:]))
    assert switches >= 4, switches  # ~0.5 s of CPU each in 0.1 s turns; no upper bound: load adds turns
    assert all(j.stopped_s > 0.2 and 0 < j.running_share < 1 for j in jobs), [(j.stopped_s, j.stats) for j in jobs]
