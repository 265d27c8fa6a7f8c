"""Which processes a CUDA benchmark job may start (autokernel/bench/toolchain.py): Triton's compiler toolchain, by the
real path of its executable as the parent's watcher reads it from /proc, never by name. Real processes, watched."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from autokernel.bench import toolchain
from autokernel.bench.watch import Proc, Watch


def _watched(argv: list[str], seconds: float = 0.4):
    """Runs a "job" that starts argv as a child (stdin held open so it waits) and returns what the watcher saw."""
    code = (f"import subprocess, time; p = subprocess.Popen({argv!r}, stdin=subprocess.PIPE, "
            f"stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); time.sleep({seconds}); p.kill()")
    with Watch(interval_s=0.02) as w:
        subprocess.run([sys.executable, "-c", code], check=True)
    return w.stats


def _assembler() -> str:
    found = [p for p in toolchain.programs() if os.path.basename(p) == "as" or p.endswith("-as")]
    if not found:
        pytest.skip("no C compiler toolchain on this machine")
    return found[0]


def test_the_toolchain_is_the_compiler_and_ptxas_by_real_path():
    progs = toolchain.programs()
    assert all(os.path.isabs(p) and os.path.realpath(p) == p and os.path.isfile(p) for p in progs)
    assert any(os.path.basename(p) == "ptxas" for p in progs)  # Triton's own, shipped in its wheel
    shells = {os.path.realpath(s) for s in map(shutil.which, ("sh", "bash", "dash")) if s}
    assert not progs & shells and os.path.realpath(sys.executable) not in progs


def test_a_real_toolchain_process_is_allowed_where_the_job_may_fork():
    seen = _watched([_assembler(), "-o", os.devnull])  # `as` reading its source from stdin waits, as in a compile
    (proc,) = [p for p in seen.procs if p.exe in toolchain.programs()]
    assert proc.samples > 1, proc
    assert toolchain.untrusted(seen.procs, fork_allowed=True) == []
    assert proc.name in toolchain.untrusted(seen.procs, fork_allowed=False)  # CPU jobs: no process at all


def test_a_program_named_like_the_toolchain_is_tampering(tmp_path):
    # The candidate's only writable place is its /tmp: a binary it puts there and names `ptxas` (or `as`) is seen with
    # that path, and is not trusted, whatever its name.
    for name in ("ptxas", os.path.basename(_assembler())):
        fake = tmp_path / name
        shutil.copy(shutil.which("sleep"), fake)
        seen = _watched([str(fake), "5"])
        bad = toolchain.untrusted(seen.procs, fork_allowed=True)
        assert any(str(fake) in n for n in bad), (bad, seen.procs)


def test_a_python_helper_is_tampering_on_cuda_too():
    # A forked interpreter could do the kernel's work off the clock (another CUDA context); it is never trusted, and
    # a fork that does not exec is seen as a copy of its parent at every sample, not once.
    t0 = time.monotonic()
    seen = _watched([sys.executable, "-c", "import time; time.sleep(5)"])
    assert toolchain.untrusted(seen.procs, fork_allowed=True) != []
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(0.4)\n    os._exit(0)\nos.wait()"
    with Watch(interval_s=0.02) as w:
        subprocess.run([sys.executable, "-c", code], check=True)
    (child,) = w.stats.procs
    assert child.fork_copy and child.samples > 1
    assert toolchain.untrusted(w.stats.procs, fork_allowed=True) == [child.name]
    assert time.monotonic() - t0 < 10


def test_only_a_fork_seen_once_before_its_exec_is_let_pass():
    py = os.path.realpath(sys.executable)
    brief = Proc(f"python3 (R) {py}", py, samples=1, fork_copy=True)  # Popen's child caught between fork and exec
    assert toolchain.untrusted([brief], fork_allowed=True) == []
    assert toolchain.untrusted([brief], fork_allowed=False) == [brief.name]
    for p in (Proc(brief.name, py, samples=2, fork_copy=True), Proc(brief.name, py, samples=1, fork_copy=False)):
        assert toolchain.untrusted([p], fork_allowed=True) == [p.name]


@pytest.mark.parametrize("isolation,cuda,expected", [
    ("bwrap+cgroup+seccomp+fork", True, True),  # CUDA under the full sandbox: the filter allows process creation
    ("bwrap+cgroup+seccomp", True, False),  # sandbox.fork: deny
    ("subprocess+cgroup", True, True),  # a GPU host without bubblewrap: nothing denies it, and Triton must compile
    ("bwrap+cgroup+seccomp", False, False),
    ("subprocess+nproc", False, False),  # CPU: the interpreter starts no process, whatever the isolation
])
def test_the_toolchain_is_trusted_only_where_a_cuda_job_could_fork(isolation, cuda, expected):
    assert toolchain.may_fork(isolation, cuda) is expected
