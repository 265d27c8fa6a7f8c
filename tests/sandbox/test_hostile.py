"""Hostile candidates (tests/sandbox/hostile/, one attack per file) against the sandbox and the trusted parent.

Each attack runs the way the gate runs a candidate: imported from the job's read-only input directory by a trusted
entry. Most run through `sandbox.run` directly (the static grammar would reject them before they ever ran, and what
is under test here is the sandbox itself); the kernel-shaped ones run through the real `autokernel.gate.verify`, with
and without its static stage. Every test checks, besides its own attack's outcome:
- nothing leaked: the canary API keys set in this process's environment appear in no result, log or verdict;
- nothing outside the job was written: the sentinel files in the repository, $HOME, the venv and here are unchanged
  or absent, the job's evidence directory holds only regular files the parent wrote, no temp dir is left behind;
- the outcome is a value (a failure reason, or the attack's own report of being refused), never an exception here;
- the loop survives: the last test runs a normal job after all of them.
Probe attacks that end normally share one job (module fixture `probes`): each sandbox job pays a torch import.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest
import sandbox_entries
import torch

from autokernel import sandbox
from autokernel.paths import INSTALLED
from autokernel.policy import Policy, Sandbox
from autokernel.sandbox.channel import LOG_KEEP_BYTES

HERE = Path(__file__).parent
HOSTILE = HERE / "hostile"
PROJECT = INSTALLED
CANARY = f"canary-{secrets.token_hex(8)}"
CANARY_VARS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN")
# memory_mb is RLIMIT_AS: torch + triton take 0.8-1.0 GB of address space on import, so 1 GB left a job that must
# succeed little or no room; the memory bomb allocates without bound and meets 2 GB as surely.
LIMITS = Sandbox(timeout_s=60, memory_mb=2048, cpu_s=60, max_processes=64, disk_mb=64)
PROBES = ("env_secrets.py", "proc_environ.py", "host_files.py", "network_loopback.py", "write_outside.py",
          "overwrite_trusted.py", "symlink_plant.py", "signal_parent.py", "ptrace_parent.py", "tty_inject.py",
          "kernel_surface.py", "fork_bomb.py")


def _full_isolation() -> str:
    try:
        return sandbox.preflight(LIMITS, untrusted_author=True)
    except Exception as e:  # noqa: BLE001 -- the reason to skip
        return str(e)


ISOLATION = _full_isolation()
if os.environ.get("AUTOKERNEL_REQUIRE_ISOLATION") and ISOLATION != "bwrap+cgroup+seccomp":  # CI (.ci/run)
    raise RuntimeError(f"AUTOKERNEL_REQUIRE_ISOLATION is set but jobs would run with: {ISOLATION}")
pytestmark = [pytest.mark.skipif(ISOLATION != "bwrap+cgroup+seccomp",
                                 reason=f"the hostile suite needs bubblewrap, cgroups and seccomp: {ISOLATION}"),
              pytest.mark.xdist_group("hostile")]  # one xdist worker: `world` plants and removes one decoy file


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Canary keys in the environment, a private temp dir for the sandbox's own dirs, and the host sentinels."""
    root = tmp_path_factory.mktemp("hostile")
    mp = pytest.MonkeyPatch()
    for k in CANARY_VARS:
        mp.setenv(k, CANARY)
    tmp = root / "tempdir"
    tmp.mkdir()
    mp.setattr(tempfile, "tempdir", str(tmp))
    decoy = HOSTILE / "_decoy.txt"
    decoy.write_text("decoy: the overwrite attack tries to delete this\n")
    import pyseccomp
    venv_mod = Path(pyseccomp.__file__)
    existing = [PROJECT / "autokernel" / "__init__.py", PROJECT / "kernels" / "rmsnorm.py",
                HOSTILE / "overwrite_trusted.py", venv_mod]
    tag = secrets.token_hex(4)
    new = [PROJECT / f"_hostile_probe_{tag}.txt", PROJECT / "kernels" / f"_hostile_probe_{tag}.txt",
           PROJECT / ".git" / "hooks" / f"_hostile_probe_{tag}", Path.home() / f"_hostile_probe_{tag}.txt",
           Path(sys.prefix) / f"_hostile_probe_{tag}.txt", Path("/tmp") / f"_hostile_probe_{tag}.txt",
           root / "outside.txt", HOSTILE / f"_hostile_probe_{tag}.txt"]
    evidence = root / "evidence.txt"  # stands for another job's evidence: parent-written, never visible to a job
    evidence.write_text("parent's evidence\n")
    w = {"root": root, "tmp": tmp, "evidence": evidence, "decoy": decoy, "existing": existing, "new": new,
         "before": {p: _fingerprint(p) for p in existing + [decoy]}}
    yield w
    mp.undo()
    for p in new + [decoy]:
        p.unlink(missing_ok=True)


def _fingerprint(p: Path) -> tuple:
    st = p.stat()
    return hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mtime_ns, st.st_mode


def ctx(world, **extra) -> dict:
    """What the attacker is assumed to know: our layout, the parent's pid, a listening port."""
    return {"host_pid": os.getpid(), "project": str(PROJECT), "home": str(Path.home()),
            "evidence": str(world["evidence"]), "targets": [str(p) for p in world["new"]],
            "existing": [str(p) for p in world["existing"]], "decoy": str(world["decoy"]),
            "marker": str(world["root"] / "marker"), **extra}


def run_attack(world, names, context: dict, limits: Sandbox = LIMITS, group: bool = False):
    job = world["root"] / f"job-{names[0].removesuffix('.py')}-{secrets.token_hex(2)}"
    res = sandbox.run(sandbox_entries.attack, {"attacks": list(names), "ctx": context, "group": group}, job,
                      limits, inputs={n: (HOSTILE / n).read_bytes() for n in names}, pythonpath=[HERE])
    assert_contained(world, res, job)
    return res


def assert_contained(world, res, job: Path, ran: bool = True) -> None:
    """The invariants every attack must leave intact (see the module docstring)."""
    assert isinstance(res, sandbox.SandboxResult)
    assert CANARY not in repr(res.data) + res.detail, "canary key reached the parent's result"
    for p in job.rglob("*"):
        assert not p.is_symlink() and (p.is_file() or p.is_dir()), f"{p} in the evidence dir is not the parent's"
        if p.is_file():
            assert CANARY.encode() not in p.read_bytes(), f"canary key in {p}"
    if ran:
        assert (job / sandbox.LOG_NAME).is_file() and not (job / sandbox.LOG_NAME).is_symlink()
    for p in world["new"]:
        assert not p.exists(), f"the job wrote {p} outside itself"
    for p, fp in world["before"].items():
        assert p.exists() and _fingerprint(p) == fp, f"the job modified {p}"
    assert not list(world["tmp"].iterdir()), "the sandbox left a temp dir behind"
    own = f"autokernel-{os.getpid()}-"
    left = [d for d in Path("/sys/fs/cgroup").glob(f"*/{own}*")] + list(Path("/sys/fs/cgroup").glob(f"{own}*"))
    assert not left, f"a job's cgroup (and so its processes) outlived it: {left}"


@pytest.fixture(scope="module")
def probes(world):
    """The probe attacks, one job: each reports what it tried and what it got."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.5)
    res = run_attack(world, PROBES, ctx(world, port=server.getsockname()[1]), group=True)
    with pytest.raises(OSError):  # socket.timeout: nothing ever connected
        server.accept()
    server.close()
    assert res.ok and res.isolation == "bwrap+cgroup+seccomp", res
    return {k: v.get("result", v) for k, v in res.data.items()}


def test_env_has_no_secrets(probes):
    r = probes["env_secrets.py"]
    assert r["found"] == {}
    assert not any(k in r["keys"] for k in CANARY_VARS)


def test_proc_shows_no_other_environment(probes):
    r = probes["proc_environ.py"]
    assert r["found"] == []
    assert len(r["pids"]) <= 2, r["pids"]  # bubblewrap's init and the harness: its own pid namespace


def test_host_files_are_invisible(probes):
    seen = probes["host_files.py"]["seen"]
    assert not [t for t, how in seen.items() if how in ("read", "listed")], seen


def test_no_network_not_even_loopback(probes):
    r = probes["network_loopback.py"]
    assert "connected" not in r.values(), r
    assert r["netlink"] == "PermissionError"  # seccomp: only AF_UNIX sockets


def test_writes_outside_land_nowhere(probes):
    # Paths under /tmp are the job's own tmpfs inside the sandbox (the attack "wrote" there); assert_contained checked
    # that none of them landed on the host. Everywhere else even the attempt fails.
    r = probes["write_outside.py"]
    assert not [p for p, how in r.items() if how == "written" and not p.startswith("/tmp/")], r


def test_trusted_files_cannot_be_modified(probes):
    r = probes["overwrite_trusted.py"]
    assert "done" not in r.values(), r


def test_planted_symlinks_are_never_followed(probes):
    # assert_contained already checked that the evidence dir holds no link and that every target is unchanged; no
    # later job can see the links either: they lived in the job's own /tmp, which is gone, and nothing is re-bound
    assert probes["symlink_plant.py"]["made"], "the attack could not even plant its links inside"


def test_no_signals_to_other_processes(probes):
    r = probes["signal_parent.py"]
    assert r.pop("self") == "sent"  # signalling itself is allowed (Python and glibc do it)
    assert set(r.values()) == {"PermissionError"}, r


def test_no_ptrace_or_memory_reading(probes):
    r = probes["ptrace_parent.py"]
    assert "ok" not in r.values(), r


def test_no_terminal_injection(probes):
    r = probes["tty_inject.py"]
    assert "injected" not in r.values(), r


def test_kernel_attack_surface_is_closed(probes):
    r = probes["kernel_surface.py"]
    assert "ok" not in r.values(), r


def test_fork_is_denied_on_cpu(probes):
    r = probes["fork_bomb.py"]
    assert r == {"forked": 0, "refused": 64}, r


def test_fork_bomb_with_fork_allowed_is_contained_by_the_cgroup(world):
    lim = LIMITS.model_copy(update={"fork": "allow", "max_processes": 48})
    res = run_attack(world, ["fork_bomb.py"], ctx(world), lim)
    assert res.ok and res.isolation == "bwrap+cgroup+seccomp+fork", res
    r = res.data["fork_bomb.py"]["result"]
    assert r["refused"] > 0 and r["forked"] < lim.max_processes, r


def test_memory_bomb_is_oom(world):
    res = run_attack(world, ["memory_bomb.py"], ctx(world))
    assert not res.ok and res.reason == "sandbox.oom", res


def test_disk_bomb_is_bounded_by_the_quota_and_vanishes(world):
    res = run_attack(world, ["disk_bomb.py"], ctx(world, try_mb=2 * LIMITS.disk_mb))
    assert res.ok, res
    written = res.data["disk_bomb.py"]["result"]["written"]
    assert sum(written.values()) <= LIMITS.disk_mb << 20, written
    assert written["/"] == written["/dev"] == written["/dev/shm"] == 0, written


def test_daemon_does_not_outlive_the_job(world):
    for lim in (LIMITS, LIMITS.model_copy(update={"fork": "allow"})):
        res = run_attack(world, ["daemon.py"], ctx(world), lim)
        assert res.ok, res
    time.sleep(3)  # the daemon's marker would be written 2 s after its job
    assert not (world["root"] / "marker").exists()


def test_hang_is_a_timeout(world):
    lim = LIMITS.model_copy(update={"timeout_s": 4})
    t0 = time.perf_counter()
    res = run_attack(world, ["hang.py"], ctx(world), lim)
    assert not res.ok and res.reason == "sandbox.timeout", res
    assert time.perf_counter() - t0 < 30  # killed at 4 s (the hang never ends); slack for a loaded machine


def test_huge_output_is_capped(world):
    res = run_attack(world, ["huge_stdout.py"], ctx(world, mb=100))
    assert res.ok, res
    log = next(world["root"].glob("job-huge_stdout-*")) / sandbox.LOG_NAME
    assert log.stat().st_size < LOG_KEEP_BYTES + 4096


def test_terminal_escapes_come_back_as_plain_values(world):
    res = run_attack(world, ["terminal_escapes.py"], ctx(world, **{"raise": True}))
    assert not res.ok and res.reason == "sandbox.error" and res.detail.startswith("ValueError"), res


def test_exec_replacing_the_harness_is_a_failure(world):
    res = run_attack(world, ["exec_replace.py"], ctx(world))
    assert not res.ok and res.reason == "sandbox.error" and "no result" in res.detail, res


def test_fake_frames_without_the_nonce_are_refused(world):
    res = run_attack(world, ["fake_frame.py"], ctx(world))
    assert not res.ok and res.reason == "sandbox.error", res
    assert "tampered" in res.detail or "no result" in res.detail, res


def test_a_forged_frame_cannot_run_code_in_the_parent(world):
    marker = world["root"] / "rce_marker"
    res = run_attack(world, ["pickle_rce.py"], ctx(world, marker=str(marker)))
    assert not res.ok and res.reason == "sandbox.error" and "unreadable frame" in res.detail, res
    assert not marker.exists()


def test_caches_are_not_shared_between_jobs(world):
    first = run_attack(world, ["cache_poison.py"], ctx(world))
    second = run_attack(world, ["cache_poison.py"], ctx(world))
    assert first.ok and second.ok, (first, second)
    assert first.data["cache_poison.py"]["result"]["planted"], first.data
    assert second.data["cache_poison.py"]["result"]["seen"] == [], second.data


# Kernel-shaped attacks through the real gate (autokernel.gate.verify, no end-to-end stage). With the static stage
# bypassed they reach the sandboxed harness and the parent's judgement, which must hold on its own.

KERNELS = ("forge_skip_kernel.py", "forge_clear_failure_kernel.py", "late_repair_kernel.py", "symlink_kernel.py")


def _verify(world, name: str, monkeypatch, *, static: bool):
    from autokernel.gate import pipeline
    from autokernel.gate.verdict import StageResult
    if not static:
        monkeypatch.setattr(pipeline.static, "check_source", lambda *a, **k: StageResult.ok("static", "bypassed"))
    policy = Policy(sandbox=LIMITS)
    run_dir = world["root"] / f"verify-{name.removesuffix('.py')}-{'static' if static else 'nostatic'}"
    v = pipeline.verify("rmsnorm", HOSTILE / name, policy=policy, run_dir=run_dir, stages=[],
                        dtypes=[torch.float32], dists=["normal"], kernels_dir=INSTALLED / "kernels")
    job = Path(v.run_dir)
    assert (job / "verdict.json").is_file() and not (job / "verdict.json").is_symlink()
    assert_contained(world, sandbox.SandboxResult(True, None, v.to_json()), job, ran=False)
    return v


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_attacks_are_rejected_by_the_full_gate(world, name, monkeypatch):
    assert _verify(world, name, monkeypatch, static=True).verdict == "rejected"


@pytest.mark.parametrize("name", KERNELS[:3])
def test_forging_the_channel_cannot_turn_a_wrong_kernel_into_a_pass(world, name, monkeypatch):
    v = _verify(world, name, monkeypatch, static=False)
    assert v.verdict == "rejected", v.to_json()
    failed = next(s for s in v.stages if not s.passed)
    assert failed.reason.startswith(("numeric.", "runtime.", "sandbox.")), failed


def test_symlinks_planted_by_a_correct_kernel_are_never_followed(world, monkeypatch):
    v = _verify(world, "symlink_kernel.py", monkeypatch, static=False)
    assert v.verdict == "accepted", v.to_json()  # a correct kernel; the links stayed in its own vanished /tmp


def test_the_loop_survives(world):
    res = sandbox.run(sandbox_entries.call_candidate, {"candidate": "c.py"}, world["root"] / "last", LIMITS,
                      inputs={"c.py": b"def main(scratch):\n    return 'still here'\n"}, pythonpath=[HERE])
    assert res.ok and res.data == {"result": "still here"}, res
    assert_contained(world, res, world["root"] / "last")
