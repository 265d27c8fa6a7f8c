"""Attack: leave something running after the job: a double-forked, setsid'd daemon that writes a marker on the host
later, and a non-daemon thread (os._exit of the harness must still end the process)."""
import os
import threading
import time


def _later(path):
    time.sleep(2)
    try:
        open(path, "w").write("daemon survived the job")
    except OSError:
        pass


def main(ctx):
    out = {}
    try:
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                _later(ctx["marker"])
            os._exit(0)
        out["fork"] = "forked"
    except OSError as e:
        out["fork"] = type(e).__name__
    threading.Thread(target=_later, args=(ctx["marker"],)).start()
    return out
