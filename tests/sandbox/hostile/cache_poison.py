"""Attack: plant entries in every cache a later job could read (Triton's, inductor's, ~/.cache, $TMPDIR, /tmp) -- a
poisoned compiled kernel for the incumbent would otherwise run in the next job; report what an earlier job left."""
import os

PLACES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", "HOME", "TMPDIR")
NAME = "autokernel_poison_marker"


def main(ctx):
    dirs = {var: os.environ[var] for var in PLACES if os.environ.get(var)} | {"/tmp": "/tmp"}
    seen = [var for var, d in dirs.items() if os.path.exists(os.path.join(d, NAME))]
    planted = []
    for var, d in dirs.items():
        try:
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, NAME), "w") as f:
                f.write("poison")
            planted.append(var)
        except OSError:
            pass
    return {"seen": seen, "planted": planted}
