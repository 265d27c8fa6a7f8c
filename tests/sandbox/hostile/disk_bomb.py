"""Attack: fill every writable place (the scratch dir, /tmp, /dev/shm, /) until the writes fail; report the bytes
that landed."""
import os

CHUNK = b"\0" * (1 << 20)


def _fill(d):
    n = 0
    try:
        with open(os.path.join(d, "bomb.bin"), "wb") as f:
            for i in range(ctx_limit_mb):
                f.write(CHUNK)
                f.flush()
                n += len(CHUNK)
    except OSError:
        pass
    return n


ctx_limit_mb = 0


def main(ctx):
    global ctx_limit_mb
    ctx_limit_mb = ctx["try_mb"]
    written = {d: _fill(d) for d in (os.getcwd(), "/tmp", "/dev/shm", "/", "/dev")}
    return {"written": written}
