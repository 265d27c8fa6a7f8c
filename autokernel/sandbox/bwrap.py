"""The bubblewrap command line and the scrubbed environment of a sandboxed job.

What the candidate sees: the system's /usr (and /bin, /lib... or their merged-usr symlinks), a handful of /etc files
the loader and compilers need, the Python installation and virtualenv, the project's `autokernel/` and `kernels/`
packages (not the repository: no .git, .env, policies or sandbox/ evidence), the job's input directory, a target
checkout's tree for its engine (its .git covered: _project_binds; its other files, untracked ones included, are
what its own code would see anyway), all read-only; a private, size-limited tmpfs on /tmp (its only writable place:
the job's scratch directory, HOME, TMPDIR and Triton cache live in it, and it vanishes with the job); a minimal,
read-only /dev (plus the NVIDIA device nodes where they exist); its own /proc; a read-only root; no network (a new,
empty network namespace), no other processes (a new pid namespace), no capabilities, a seccomp filter
(autokernel/sandbox/seccomp.py) and an environment built from an allowlist.

Order matters: the private /tmp is mounted FIRST and everything else is bound on top of it. A checkout or venv that
lives under /tmp (CI clones do) is then bound into the new /tmp instead of being hidden by it.
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

from autokernel.paths import INSTALLED

PROJECT_PACKAGES = ("autokernel", "kernels")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "localtime",
             "alternatives", "os-release")
# Passed through from the parent when set. Nothing else is: no *_KEY, *_TOKEN, credentials, proxies or user paths.
ENV_PASSTHROUGH = ("LANG", "LC_ALL", "TZ", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
                   "TRITON_LIBCUDA_PATH", "TRITON_PTXAS_PATH", "CUDA_HOME", "OMP_NUM_THREADS")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
SCRATCH = "/tmp/autokernel-job"  # the job's working directory inside the sandbox (in the size-limited /tmp)


def gpu_nodes() -> list[str]:
    """NVIDIA device nodes to expose (/dev/nvidia0.., nvidiactl, nvidia-uvm, nvidia-caps/...)."""
    return sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*"))


def job_path() -> str:
    """A job's PATH: the interpreter's directory (the virtualenv's scripts), then the system's."""
    return os.pathsep.join(dict.fromkeys([str(Path(sys.executable).parent), DEFAULT_PATH]))


def env(scratch: str, pythonpath: list[Path], overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The child's whole environment: an allowlist, never a copy of ours with secrets removed. Every cache and
    temporary path points into the job's own scratch directory, which no other job sees."""
    out = {k: os.environ[k] for k in ENV_PASSTHROUGH if k in os.environ}
    out.update({
        "PATH": job_path(),
        "HOME": scratch,
        "TMPDIR": scratch,
        "PYTHONPATH": os.pathsep.join(str(p) for p in [INSTALLED, *pythonpath]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "TRITON_CACHE_DIR": f"{scratch}/.triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{scratch}/.inductor",
        "XDG_CACHE_HOME": f"{scratch}/.cache",
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


def argv(inputs: Path | None, ro_paths: list[Path], gpu: bool, disk_bytes: int,
         seccomp_fd: int | None) -> list[str]:
    """bwrap's arguments up to and including `--`; the command follows. `inputs` is bound read-only at its own
    path; nothing of the host is writable."""
    a = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
         "--cap-drop", "ALL",
         "--size", str(disk_bytes), "--tmpfs", "/tmp", "--dir", SCRATCH]  # first: see the module docstring
    a += _host_binds() + _project_binds(inputs, ro_paths) + _device_binds(gpu)
    a += ["--remount-ro", "/dev", "--remount-ro", "/"]  # /dev/shm and the root would be unmetered tmpfs otherwise
    if seccomp_fd is not None:
        a += ["--seccomp", str(seccomp_fd)]
    return a + ["--chdir", SCRATCH, "--"]


def _host_binds() -> list[str]:
    """The system (read-only, merged-usr symlinks kept as symlinks), the loader's /etc files, the Python
    installation and virtualenv, and the LD_LIBRARY_PATH directories outside the system ones."""
    a: list[str] = []
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
        if os.path.isabs(d) and os.path.isdir(d) and not d.startswith(SYSTEM_DIRS):  # "." or "" is the job's cwd
            a += ["--ro-bind", d, d]
    return a


def _project_binds(inputs: Path | None, ro_paths: list[Path]) -> list[str]:
    """The project's packages (not the repository), the caller's trusted read-only paths, the job's inputs. A bound
    directory's git metadata (`.git`) is covered by an empty one: a target checkout is bound whole for its engine,
    and its .git/config holds what CI put there (actions/checkout's `http.extraheader` token), which the checkout's
    own code must not read (it could print it, encoded, in the error a user or a public CI log sees)."""
    a: list[str] = []
    for pkg in PROJECT_PACKAGES:
        a += ["--ro-bind", str(INSTALLED / pkg), str(INSTALLED / pkg)]
    for p in [*ro_paths, *([inputs] if inputs is not None else [])]:
        a += ["--ro-bind", str(p), str(p)] + _git_cover(Path(p))
    return a


def _git_cover(d: Path) -> list[str]:
    """bwrap arguments that hide d/.git: an empty read-only tmpfs over a directory; over a file (a worktree's or a
    submodule's `gitdir:` pointer) or a link, /dev/null, which a bind makes unopenable (bubblewrap binds nodev); []
    where there is none."""
    git = d / ".git"
    if git.is_dir() and not git.is_symlink():
        return ["--tmpfs", str(git), "--remount-ro", str(git)]
    if os.path.lexists(git):
        return ["--ro-bind", "/dev/null", str(git)]
    return []


def _device_binds(gpu: bool) -> list[str]:
    """A minimal /dev and the job's own /proc; on a GPU machine the NVIDIA nodes and /sys too."""
    a = ["--dev", "/dev", "--proc", "/proc"]
    if gpu:
        for n in gpu_nodes():
            a += ["--dev-bind", n, n]
        a += ["--ro-bind", "/sys", "/sys"]  # the CUDA driver reads PCI topology and NUMA nodes here
    return a


@functools.lru_cache(maxsize=1)
def usable() -> str | None:
    """None if bubblewrap can build our sandbox here, else why not (missing, or user namespaces refused). The probe
    uses the real argument list (the same binds, in the same order), so whatever would hide the interpreter or the
    project from a job (a checkout under /tmp, say) fails here too instead of in every job."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    with tempfile.TemporaryDirectory(prefix="autokernel-probe-") as d:
        cmd = argv(Path(d), [], gpu=False, disk_bytes=1 << 20, seccomp_fd=None)
        cmd += [sys.executable, "-I", "-B", "-c", f"import os, sys; sys.path[:0] = [{str(INSTALLED)!r}]; "
                f"import autokernel; assert os.path.isfile({str(INSTALLED / 'kernels' / '__init__.py')!r}) "
                f"and os.path.isdir({d!r})"]
        try:
            p = subprocess.run(cmd, capture_output=True, timeout=30, env=env(SCRATCH, []))
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bwrap failed to start: {e}"
    if p.returncode != 0:
        return f"bwrap cannot create a sandbox here: {p.stderr.decode(errors='replace').strip()[-300:]}"
    return None
