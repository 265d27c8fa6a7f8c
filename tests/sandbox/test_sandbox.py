"""Containment that really tries: each test writes a hostile candidate, runs it through the sandbox, and checks both
the reported outcome and that the host saw nothing; after each, the next candidate must still run."""
import os
import socket
import textwrap
from pathlib import Path

import pytest

from autokernel import sandbox
from autokernel.policy import Sandbox
from autokernel.sandbox import bwrap, limits

HERE = Path(__file__).parent
LIMITS = Sandbox(timeout_s=10, memory_mb=1024, cpu_s=30, max_processes=32)
needs_bwrap = pytest.mark.skipif(bwrap.usable() is not None, reason=f"needs bubblewrap: {bwrap.usable()}")


def run_candidate(tmp_path: Path, source: str, limits: Sandbox = LIMITS, name: str = "job"):
    job = tmp_path / name
    job.mkdir(parents=True, exist_ok=True)
    cand = job / "candidate.py"
    cand.write_text(textwrap.dedent(source))
    return sandbox.run("sandbox_entries:call_candidate", {"candidate": str(cand)}, job, limits, pythonpath=[HERE])


def assert_next_runs(tmp_path: Path, limits: Sandbox = LIMITS):
    r = run_candidate(tmp_path, "def main(job_dir):\n    return 'still here'\n", limits, name="next")
    assert r.ok and r.data == {"result": "still here"}, r


@needs_bwrap
def test_result_comes_back(tmp_path):
    r = run_candidate(tmp_path, """
        def main(job_dir):
            (job_dir / "out.txt").write_text("written")
            print("noise on stdout that is not a result")
            return {"answer": 42}
    """)
    assert r.ok, r
    assert r.data == {"result": {"answer": 42}}
    assert r.isolation.startswith("bwrap+")
    assert (r.job_dir / "out.txt").read_text() == "written"
    assert r.wall_s > 0


@needs_bwrap
def test_no_secrets_visible(tmp_path, monkeypatch):
    secret = "sk-test-do-not-leak-7f3a"
    for k in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, secret)
    r = run_candidate(tmp_path, f"""
        import os, glob
        def main(job_dir):
            hits = [k for k, v in os.environ.items() if "KEY" in k or "TOKEN" in k or "SECRET" in k or {secret!r} in v]
            for f in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline"):
                try:
                    if {secret!r}.encode() in open(f, "rb").read():
                        hits.append(f)
                except OSError:
                    pass
            return {{"hits": hits, "env": sorted(os.environ), "pids": sorted(glob.glob("/proc/[0-9]*"))}}
    """)
    assert r.ok, r
    assert r.data["result"]["hits"] == []
    assert set(r.data["result"]["env"]) <= set(bwrap.ENV_PASSTHROUGH) | {
        "PATH", "HOME", "PWD", "TMPDIR", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE", "TRITON_CACHE_DIR"}
    assert len(r.data["result"]["pids"]) <= 4  # its own pid namespace: bwrap's init, the harness, nothing of ours
    assert_next_runs(tmp_path)


@needs_bwrap
def test_no_network(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    r = run_candidate(tmp_path, f"""
        import socket
        def main(job_dir):
            out = {{}}
            for host in ("127.0.0.1", "1.1.1.1"):
                try:
                    socket.create_connection((host, {port}), timeout=2).close()
                    out[host] = "connected"
                except OSError as e:
                    out[host] = type(e).__name__
            return out
    """)
    assert r.ok, r
    assert "connected" not in r.data["result"].values(), r.data
    with pytest.raises(socket.timeout):
        server.accept()
    server.close()
    assert_next_runs(tmp_path)


@needs_bwrap
def test_writes_only_inside_its_dir(tmp_path):
    outside = tmp_path / "outside.txt"
    project_probe = bwrap.PROJECT / "kernels" / "_sandbox_escape_probe.py"
    venv_probe = Path(os.__file__).parent / "_sandbox_escape_probe"
    targets = [outside, project_probe, venv_probe, Path.home() / "_sandbox_escape_probe", bwrap.PROJECT / "x.py"]
    try:
        r = run_candidate(tmp_path, f"""
            def main(job_dir):
                out = {{}}
                for p in {[str(t) for t in targets]!r} + [str(job_dir / "inside.txt")]:
                    try:
                        open(p, "w").write("escaped")
                        out[p] = "written"
                    except OSError as e:
                        out[p] = type(e).__name__
                return out
        """)
        assert r.ok, r
        assert r.data["result"][str(r.job_dir / "inside.txt")] == "written"
        for t in targets:  # whatever the candidate believed, nothing landed on the host
            assert not t.exists(), f"sandbox wrote {t}"
        assert r.data["result"][str(project_probe)] != "written"  # read-only, not merely hidden
    finally:
        for t in targets:
            t.unlink(missing_ok=True)
    assert_next_runs(tmp_path)


def test_timeout_kills_the_job(tmp_path):
    lim = LIMITS.model_copy(update={"timeout_s": 2})
    r = run_candidate(tmp_path, """
        import time
        def main(job_dir):
            while True:
                time.sleep(1)
    """, lim)
    assert not r.ok and r.reason == "sandbox.timeout", r
    assert r.wall_s < 6
    assert_next_runs(tmp_path)


def test_unbounded_allocation_is_oom(tmp_path):
    r = run_candidate(tmp_path, """
        def main(job_dir):
            hog = []
            while True:
                hog.append(bytearray(64 << 20))
    """)
    assert not r.ok and r.reason == "sandbox.oom", r
    assert_next_runs(tmp_path)


def _process_limit() -> str:
    cg = limits.Cgroup.create(8, None)
    try:
        return limits.process_limit(cg)
    finally:
        if cg is not None:
            cg.remove()


@pytest.mark.skipif(_process_limit() == "none",
                    reason="no pids cgroup and running as root: RLIMIT_NPROC does not bind uid 0")
def test_fork_bomb_is_contained(tmp_path):
    # Bounded even if containment failed (<= 1 + 150 * 6 processes, all exiting within 20 s), so a broken sandbox
    # fails this test instead of taking the machine down.
    r = run_candidate(tmp_path, """
        import os, time
        def main(job_dir):
            root, forked, refused, depth = os.getpid(), 0, 0, 0
            for _ in range(150 if depth == 0 else 5):
                try:
                    pid = os.fork()
                except OSError:
                    refused += 1
                    continue
                if pid == 0:
                    depth += 1
                    if depth > 1:
                        break
                else:
                    forked += 1
            if os.getpid() != root:
                time.sleep(20)
                os._exit(0)
            return {"forked": forked, "refused": refused}
    """)
    assert r.ok, r
    res = r.data["result"]
    assert res["refused"] > 0 and res["forked"] < LIMITS.max_processes, res
    assert_next_runs(tmp_path)


@pytest.mark.parametrize("how", ["os.kill", "ctypes"])
def test_segfault_is_a_crash(tmp_path, how):
    body = ("os.kill(os.getpid(), signal.SIGSEGV)" if how == "os.kill" else "ctypes.string_at(0)")
    r = run_candidate(tmp_path, f"""
        import ctypes, os, signal
        def main(job_dir):
            {body}
    """)
    assert not r.ok and r.reason == "sandbox.crash", r
    assert "SIGSEGV" in r.detail
    assert_next_runs(tmp_path)


def test_exception_is_an_error_with_its_last_line(tmp_path):
    r = run_candidate(tmp_path, """
        def main(job_dir):
            raise ValueError("boom at shape (3, 431)")
    """)
    assert not r.ok and r.reason == "sandbox.error"
    assert r.detail == "ValueError: boom at shape (3, 431)"
    assert_next_runs(tmp_path)


def test_forged_result_is_refused(tmp_path):
    r = run_candidate(tmp_path, """
        import json, os, sys
        def main(job_dir):
            fake = b"0" * 32 + b"\\n" + json.dumps({"ok": True, "data": {"result": "accepted"}}).encode()
            print(fake.decode())
            for fd in map(int, os.listdir("/proc/self/fd")):
                if fd > 2:
                    try:
                        os.write(fd, fake)
                    except OSError:
                        pass
            os._exit(0)
    """)
    assert not r.ok and r.reason == "sandbox.error", r
    assert "tampered" in r.detail or "no result" in r.detail
    assert_next_runs(tmp_path)


def test_sys_exit_in_candidate_is_an_error(tmp_path):
    r = run_candidate(tmp_path, "import sys\ndef main(job_dir):\n    sys.exit(0)\n")
    assert not r.ok and r.reason == "sandbox.error" and "SystemExit" in r.detail, r


def test_required_isolation_refuses_without_bwrap(tmp_path, monkeypatch):
    monkeypatch.setattr(bwrap, "usable", lambda: "bubblewrap (bwrap) is not installed")
    marker = tmp_path / "ran"
    r = run_candidate(tmp_path, f"def main(job_dir):\n    open({str(marker)!r}, 'w')\n",
                      LIMITS.model_copy(update={"isolation": "required"}))
    assert not r.ok and r.reason == "sandbox.no_isolation"
    assert not marker.exists()


def test_fallback_subprocess_still_scrubs_and_limits(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-fallback")
    monkeypatch.setattr(bwrap, "usable", lambda: "bubblewrap (bwrap) is not installed")
    monkeypatch.setattr(sandbox, "_warned", False)
    r = run_candidate(tmp_path, "import os\ndef main(job_dir):\n    return 'ANTHROPIC_API_KEY' in os.environ\n")
    assert r.ok and r.data == {"result": False}
    assert r.isolation.startswith("subprocess+")
    assert "WITHOUT isolation" in capsys.readouterr().err
    lim = LIMITS.model_copy(update={"timeout_s": 1.5})
    r = run_candidate(tmp_path, "import time\ndef main(job_dir):\n    time.sleep(60)\n", lim)
    assert r.reason == "sandbox.timeout"


def test_run_many_uses_every_slot(tmp_path):
    jobs = []
    for i in range(4):
        job = tmp_path / f"j{i}"
        job.mkdir()
        (job / "candidate.py").write_text("import os\ndef main(job_dir):\n"
                                          "    return [os.environ.get('OMP_NUM_THREADS'), os.environ['TRITON_CACHE_DIR']]\n")
        jobs.append(("sandbox_entries:call_candidate", {"candidate": str(job / "candidate.py")}, job))
    slots = [sandbox.slots.Slot(0, {"OMP_NUM_THREADS": "1"}), sandbox.slots.Slot(1, {"OMP_NUM_THREADS": "1"})]
    rs = sandbox.run_many(jobs, LIMITS, slots=slots, pythonpath=[HERE])
    assert all(r.ok for r in rs), rs
    assert [r.data["result"][1] for r in rs] == [str((tmp_path / f"j{i}" / ".triton").resolve()) for i in range(4)]
    assert {r.data["result"][0] for r in rs} == {"1"}


def test_files_left_in_the_job_dir_do_not_shadow_the_harness(tmp_path):
    # A candidate plants json.py / faulthandler.py in its (writable, reused) job dir; the next job there must not
    # import them: the harness runs with `python -I`, so the working directory is not on sys.path.
    r = run_candidate(tmp_path, """
        def main(job_dir):
            for m in ("json", "faulthandler", "traceback", "runpy"):
                (job_dir / f"{m}.py").write_text("raise SystemExit('planted module imported')")
            return "planted"
    """)
    assert r.ok, r
    assert_next_runs(tmp_path)
    r = run_candidate(tmp_path, "def main(job_dir):\n    return 'clean'\n")  # the same job dir as the planter
    assert r.ok and r.data == {"result": "clean"}, r


def _has_memory_cgroup() -> bool:
    cg = limits.Cgroup.create(8, 1 << 30)
    if cg is None:
        return False
    try:
        return any("memory" in str(d) for d in cg.dirs) or (cg.version == 2 and (cg.dirs[0] / "memory.max").exists())
    finally:
        cg.remove()


@pytest.mark.skipif(not _has_memory_cgroup(), reason="no memory cgroup can be made here")
def test_oom_kill_by_the_memory_cgroup_is_oom(tmp_path, monkeypatch):
    # As on a GPU machine, where RLIMIT_AS is off (CUDA reserves far more address space than it uses): the memory
    # cgroup's OOM killer ends the job with SIGKILL, and that is still reported as sandbox.oom.
    real = sandbox.preexec
    monkeypatch.setattr(sandbox, "preexec", lambda lim, cg, rlimit_as: real(lim, cg, rlimit_as=False))
    lim = LIMITS.model_copy(update={"memory_mb": 512})
    r = run_candidate(tmp_path, """
        def main(job_dir):
            hog = []
            while True:
                hog.append(bytearray(32 << 20))
    """, lim)
    assert not r.ok and r.reason == "sandbox.oom", r
    assert_next_runs(tmp_path)


def test_patching_the_harness_libraries_does_not_forge_a_result(tmp_path):
    # No introspection needed for these: json.dumps and os.write are module attributes anyone can replace. The
    # harness bound its own encoder and writer before the entry ran, so the failure still comes back as a failure.
    r = run_candidate(tmp_path, """
        import json, os, sys
        FORGED = '{"ok": true, "data": {"result": "forged"}}'
        def main(job_dir):
            json.dumps = lambda *a, **k: FORGED
            json._default_encoder.encode = lambda o: FORGED
            json.encoder.c_make_encoder = None
            harness = sys.modules["__main__"]
            harness._call = lambda *a: {"ok": True, "data": {"result": "forged"}}
            raise ValueError("the real outcome")
    """)
    assert not r.ok and r.reason == "sandbox.error" and r.detail == "ValueError: the real outcome", r
