"""The bubblewrap command line and the scrubbed environment of a sandboxed job.

What the candidate sees: the system's /usr (and /bin, /lib... or their merged-usr symlinks), a handful of /etc files
the loader and compilers need, the Python installation and virtualenv, the project's `autokernel/` and `kernels/`
packages (not the repository: no .git, .env or policies), all read-only; its own job directory read-write; a private
/tmp; a minimal /dev (plus the NVIDIA device nodes where they exist); its own /proc; no network (a new, empty network
namespace), no other processes (a new pid namespace), no capabilities, and an environment built from an allowlist.
"""
from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = ("autokernel", "kernels")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "localtime",
             "alternatives", "os-release")
# Passed through from the parent when set. Nothing else is: no *_KEY, *_TOKEN, credentials, proxies or user paths.
ENV_PASSTHROUGH = ("LANG", "LC_ALL", "TZ", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
                   "TRITON_LIBCUDA_PATH", "TRITON_PTXAS_PATH", "CUDA_HOME", "OMP_NUM_THREADS")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def gpu_nodes() -> list[str]:
    """NVIDIA device nodes to expose (/dev/nvidia0.., nvidiactl, nvidia-uvm, nvidia-caps/...)."""
    return sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*"))


def env(job_dir: Path, pythonpath: list[Path], overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The child's whole environment: an allowlist, never a copy of ours with secrets removed."""
    out = {k: os.environ[k] for k in ENV_PASSTHROUGH if k in os.environ}
    out.update({
        "PATH": os.pathsep.join(dict.fromkeys([str(Path(sys.executable).parent), DEFAULT_PATH])),
        "HOME": str(job_dir),
        "TMPDIR": "/tmp",
        "PYTHONPATH": os.pathsep.join(str(p) for p in [PROJECT, *pythonpath]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "TRITON_CACHE_DIR": str(job_dir / ".triton"),
    })
    # torch starts one thread per core, and max_processes counts threads: 16 keeps a big host under the limit.
    out.setdefault("OMP_NUM_THREADS", str(min(os.cpu_count() or 1, 16)))
    out.update(overrides or {})
    return out


def _python_dirs() -> list[str]:
    """The interpreter, its standard library and the virtualenv: each root once, outermost first."""
    cands = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             str(Path(sys.executable).resolve().parents[1])}
    roots: list[str] = []
    for c in sorted(cands, key=len):
        if not any(c == r or c.startswith(r.rstrip("/") + "/") for r in roots):
            roots.append(c)
    return roots


def argv(job_dir: Path, ro_paths: list[Path], rw_paths: list[Path], gpu: bool) -> list[str]:
    """bwrap's arguments up to and including `--`; the command follows."""
    a = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
         "--cap-drop", "ALL"]
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            a += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            a += ["--ro-bind", d, d]
    for f in ETC_FILES:
        a += ["--ro-bind-try", f"/etc/{f}", f"/etc/{f}"]
    for d in _python_dirs():
        a += ["--ro-bind", d, d]
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if d and os.path.isdir(d) and not d.startswith(SYSTEM_DIRS):
            a += ["--ro-bind", d, d]
    for pkg in PROJECT_PACKAGES:
        a += ["--ro-bind", str(PROJECT / pkg), str(PROJECT / pkg)]
    for p in ro_paths:
        a += ["--ro-bind", str(p), str(p)]
    a += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    if gpu:
        for n in gpu_nodes():
            a += ["--dev-bind", n, n]
        a += ["--ro-bind", "/sys", "/sys"]  # the CUDA driver reads PCI topology and NUMA nodes here
    for p in [job_dir, *rw_paths]:  # after --tmpfs /tmp, so that a job_dir under /tmp stays the real one
        a += ["--bind", str(p), str(p)]
    return a + ["--chdir", str(job_dir), "--"]


@functools.lru_cache(maxsize=1)
def usable() -> str | None:
    """None if bubblewrap can build our sandbox here, else why not (missing, or user namespaces refused)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    with tempfile.TemporaryDirectory(prefix="autokernel-probe-") as d:
        cmd = argv(Path(d), [], [], gpu=False) + [sys.executable, "-c", "pass"]
        try:
            p = subprocess.run(cmd, capture_output=True, timeout=30, env=env(Path(d), []))
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bwrap failed to start: {e}"
    if p.returncode != 0:
        return f"bwrap cannot create a sandbox here: {p.stderr.decode(errors='replace').strip()[:300]}"
    return None
