"""Attack: attach to bubblewrap's init with ptrace, read its memory with process_vm_readv, steal fds with
pidfd_getfd."""
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
SYS = {"process_vm_readv": 310, "pidfd_open": 434, "pidfd_getfd": 438, "kcmp": 312}  # x86_64 numbers


def _errno(rc):
    return "ok" if rc >= 0 else os.strerror(ctypes.get_errno())


def main(ctx):
    out = {}
    for pid in (1, ctx["host_pid"]):
        out[f"attach {pid}"] = _errno(libc.ptrace(PTRACE_ATTACH, pid, 0, 0))
        out[f"seize {pid}"] = _errno(libc.ptrace(PTRACE_SEIZE, pid, 0, 0))
        buf = ctypes.create_string_buffer(64)
        local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 64)
        remote = (ctypes.c_void_p * 2)(0x400000, 64)
        out[f"vm_readv {pid}"] = _errno(libc.syscall(SYS["process_vm_readv"], pid, local, 1, remote, 1, 0))
        out[f"pidfd_open {pid}"] = _errno(libc.syscall(SYS["pidfd_open"], pid, 0))
    return out
