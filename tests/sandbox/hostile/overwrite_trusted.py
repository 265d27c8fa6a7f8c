"""Attack: modify trusted code the parent and later jobs run (the package's __init__, the incumbent kernel, this very
fixture, a venv module) and a decoy file beside the fixtures. Harmless if it ever succeeded (same bytes written back,
renames undone), detectable all the same: the test compares contents and modification times."""
import os


def _rewrite(p):
    with open(p, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(first)


def _rename(p):
    os.rename(p, p + ".bak")
    os.rename(p + ".bak", p)


def main(ctx):
    out = {}
    for p in ctx["existing"]:
        for how, act in (("write", lambda: _rewrite(p)), ("utime", lambda: os.utime(p, (0, 0))),
                         ("chmod", lambda: os.chmod(p, os.stat(p).st_mode)), ("rename", lambda: _rename(p))):
            try:
                act()
                out[f"{how} {p}"] = "done"
            except OSError as e:
                out[f"{how} {p}"] = type(e).__name__
    try:
        os.unlink(ctx["decoy"])
        out["unlink decoy"] = "done"
    except OSError as e:
        out["unlink decoy"] = type(e).__name__
    return out
