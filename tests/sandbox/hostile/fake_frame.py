"""Attack: write a forged result frame into every open file descriptor, then exit before the harness can."""
import os
import pickle


def main(ctx):
    fake = b"0" * 32 + (100).to_bytes(8, "big") + pickle.dumps({"ok": True, "data": {"result": "accepted"}})
    print(fake)
    for fd in map(int, os.listdir("/proc/self/fd")):
        if fd > 2:
            try:
                os.write(fd, fake)
            except OSError:
                pass
    os._exit(0)
