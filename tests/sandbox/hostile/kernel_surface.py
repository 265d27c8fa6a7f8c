"""Attack: the kernel's own attack surface: new namespaces, mounts, keyrings, bpf, io_uring, perf events,
userfaultfd, open_by_handle_at, the cgroup filesystem (to leave the job's cgroup), personality."""
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
# x86_64 system call numbers
CALLS = {"unshare": (272, 0x10000000), "setns": (308, 0, 0), "mount": (165, b"none", b"/tmp", b"tmpfs", 0, None),
         "keyctl": (250, 0, 0), "add_key": (248, b"user", b"k", b"v", 1, -2), "bpf": (321, 0, None, 0),
         "io_uring_setup": (425, 8, None), "perf_event_open": (298, None, 0, -1, -1, 0),
         "userfaultfd": (323, 0), "open_by_handle_at": (304, -100, None, 0), "personality": (135, 0x0040000),
         "pivot_root": (155, b"/", b"/tmp"), "chroot": (161, b"/tmp"), "init_module": (175, None, 0, b"")}


def main(ctx):
    out = {}
    for name, (nr, *args) in CALLS.items():
        rc = libc.syscall(nr, *args)
        out[name] = "ok" if rc >= 0 else os.strerror(ctypes.get_errno())
    for p in ("/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/pids/cgroup.procs"):
        try:
            open(p, "w").write(str(os.getpid()))
            out[p] = "ok"
        except OSError as e:
            out[p] = type(e).__name__
    return out
