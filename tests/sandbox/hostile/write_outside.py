"""Attack: write files outside the job: into the repository, $HOME, the venv, the host's /tmp, the test's dir."""


def main(ctx):
    out = {}
    for p in ctx["targets"]:
        try:
            with open(p, "w") as f:
                f.write("escaped")
            out[p] = "written"
        except OSError as e:
            out[p] = type(e).__name__
    return out
