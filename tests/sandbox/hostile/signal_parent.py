"""Attack: signal the other processes: bubblewrap's init (pid 1), the process group (0), everyone (-1), the host
parent's pid. SIGCONT and signal 0 only, so that a failed defence is detected without freezing or killing anything:
the filter's rule is about the target, not the signal (SIGSTOP on the parent would freeze the timer)."""
import os
import signal
import threading


def main(ctx):
    out = {}
    for target in (1, 0, -1, ctx["host_pid"]):
        for sig in (0, signal.SIGCONT):
            try:
                os.kill(target, sig)
                out[f"kill {target}/{int(sig)}"] = "sent"
            except OSError as e:
                out[f"kill {target}/{int(sig)}"] = type(e).__name__
    try:
        signal.pthread_kill(threading.get_ident(), 0)  # signalling itself stays possible
        os.kill(os.getpid(), 0)
        out["self"] = "sent"
    except OSError as e:
        out["self"] = type(e).__name__
    return out
