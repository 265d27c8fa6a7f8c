"""Attack: replace the harness process with another program (which would print a fake result and exit 0)."""
import os


def main(ctx):
    os.execv("/bin/sh", ["/bin/sh", "-c", "echo '{\"ok\": true}'; exit 0"])
