"""The seccomp filter bubblewrap installs on the harness just before it executes it (`bwrap --seccomp FD`).

A deny list over a default of ALLOW (the way Flatpak filters its sandboxes): torch, Triton and CUDA use a wide and
changing set of system calls, the namespaces already take away the network, the other processes and the host's files,
and what remains to take away is the handful of calls that reach *across* those walls or open kernel attack surface.
Every denied call fails with EPERM (clone3 with ENOSYS, so that glibc falls back to clone, whose flags a filter can
read); the candidate sees an OSError, never a dead harness.

Denied, and why:
- other processes: ptrace, process_vm_readv/writev, kcmp, pidfd_open/pidfd_getfd/pidfd_send_signal, and every
  signal whose target is not the harness itself (kill, tkill, tgkill, rt_(tg)sigqueueinfo with a pid other than
  SANDBOX_PID; kill(0) and kill(-1) included). The harness is pid 2 in its pid namespace: bubblewrap's init is pid 1.
- process creation (unless `allow_fork`): fork, vfork, and clone without CLONE_THREAD. Threads (clone with
  CLONE_THREAD), which torch and Triton start, stay allowed. With no process creation a candidate can only replace
  its own process (execve), which ends the job without a result: a failure. CPU jobs always run like this; CUDA jobs
  need it relaxed (Triton runs `ptxas` as a subprocess to compile), see `Sandbox.fork` in autokernel/policy.py.
- namespaces and mounts: unshare, setns, mount, umount2, pivot_root, chroot and the new mount API.
- kernel attack surface with no use in a kernel benchmark: keyctl/add_key/request_key, bpf, perf_event_open,
  userfaultfd, io_uring_*, open_by_handle_at (a classic container escape), personality (other than the query),
  module loading, kexec, reboot, swap, clock setting, acct, quotactl, syslog, iopl/ioperm.
- sockets other than AF_UNIX (the network namespace is empty anyway; netlink sockets still reach the kernel), and
  the terminal-injection ioctls TIOCSTI and TIOCLINUX.

Other architectures' system calls (int 0x80, x32) are killed by libseccomp's default bad-architecture action.
"""
from __future__ import annotations

import errno
import functools
import os

SANDBOX_PID = 2  # the harness's pid inside bubblewrap's pid namespace (bubblewrap's own init is pid 1)
CLONE_THREAD = 0x00010000
AF_UNIX = 1
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
PERSONALITY_QUERY = 0xFFFFFFFF

ALWAYS_DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsmount", "fsconfig", "fspick", "mount_setattr",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at", "name_to_handle_at",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "acct", "quotactl", "syslog", "iopl", "ioperm",
    "lookup_dcookie", "vhangup", "uselib", "nfsservctl", "migrate_pages", "move_pages",
)
FORK_CALLS = ("fork", "vfork")
SIGNAL_CALLS = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # arg 0 is the target pid/tgid


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """None if a filter can be built here, else why not (pyseccomp or the system's libseccomp is missing)."""
    try:
        import pyseccomp  # noqa: F401  -- ctypes binding; raises RuntimeError without libseccomp.so
    except (ImportError, RuntimeError, OSError) as e:
        return f"seccomp unavailable ({type(e).__name__}: {e}); install libseccomp2 and the pyseccomp package"
    try:
        bpf(False)
    except (OSError, RuntimeError, ValueError) as e:
        return f"seccomp filter could not be built: {e}"
    return None


@functools.lru_cache(maxsize=2)
def bpf(allow_fork: bool) -> bytes:
    """The compiled BPF program (built once per process and mode)."""
    import pyseccomp as sc
    f = sc.SyscallFilter(sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    for name in ALWAYS_DENIED + (() if allow_fork else FORK_CALLS):
        _rule(f, eperm, name)
    for name in SIGNAL_CALLS:
        _rule(f, eperm, name, sc.Arg(0, sc.NE, SANDBOX_PID))
    if not allow_fork:
        _rule(f, eperm, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    _rule(f, sc.ERRNO(errno.ENOSYS), "clone3")
    _rule(f, eperm, "socket", sc.Arg(0, sc.NE, AF_UNIX))
    _rule(f, eperm, "socketpair", sc.Arg(0, sc.NE, AF_UNIX))
    _rule(f, eperm, "personality", sc.Arg(0, sc.NE, PERSONALITY_QUERY))
    for cmd in (TIOCSTI, TIOCLINUX):
        _rule(f, eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, cmd))
    fd = os.memfd_create("autokernel-seccomp")
    try:
        with os.fdopen(os.dup(fd), "wb", closefd=True) as fobj:
            f.export_bpf(fobj)
        os.lseek(fd, 0, os.SEEK_SET)
        return _read_all(fd)
    finally:
        os.close(fd)


def _rule(f, action: int, name: str, *args) -> None:
    """Add one rule; a call this kernel/libseccomp does not know (an older architecture table) is skipped."""
    import pyseccomp as sc
    try:
        nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
    except (OSError, RuntimeError, ValueError):
        return
    if nr < 0:
        return
    f.add_rule(action, nr, *args)


def _read_all(fd: int) -> bytes:
    out = []
    while b := os.read(fd, 1 << 16):
        out.append(b)
    return b"".join(out)


def program_fd(allow_fork: bool) -> int:
    """A fresh readable fd holding the BPF program, for `bwrap --seccomp FD` (bwrap reads and closes its copy)."""
    fd = os.memfd_create("autokernel-seccomp")
    prog = bpf(allow_fork)
    while prog:
        prog = prog[os.write(fd, prog):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
