"""Attack: a fork bomb (each child forks again). Bounded so that a broken sandbox fails the test instead of the
machine: at most 64 forks at the top and 4 per child, every child exits within 20 s."""
import os
import time


def main(ctx):
    forked = refused = 0
    root = os.getpid()
    for _ in range(64):
        try:
            pid = os.fork()
        except OSError:
            refused += 1
            continue
        if pid == 0:
            for _ in range(4):
                try:
                    os.fork()
                except OSError:
                    pass
            time.sleep(20)
            os._exit(0)
        forked += 1
    assert os.getpid() == root
    return {"forked": forked, "refused": refused}
