"""Attack: read host files a kernel has no business with: the repository's .git and policies, $HOME, the parent's
root through /proc, the job evidence directories of other candidates."""
import os


def main(ctx):
    targets = [os.path.join(ctx["project"], p) for p in (".git/config", ".git/HEAD", "policies.yaml", "README.md",
                                                          "sandbox", "pyproject.toml")]
    targets += [os.path.join(ctx["home"], ".bashrc"), os.path.join(ctx["home"], ".ssh"), "/etc/shadow",
                f"/proc/{ctx['host_pid']}/root/etc/hostname", "/proc/1/root/etc/hostname", ctx["evidence"]]
    seen = {}
    for t in targets:
        try:
            seen[t] = "listed" if os.path.isdir(t) and os.listdir(t) else ("read" if open(t, "rb").read(1) else "")
        except OSError as e:
            seen[t] = type(e).__name__
    return {"seen": seen}
