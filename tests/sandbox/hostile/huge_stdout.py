"""Attack: flood stdout and stderr (hundreds of MB) to exhaust the parent's memory or disk."""
import os
import sys


def main(ctx):
    line = b"x" * 1023 + b"\n"
    block = line * 1024
    for _ in range(ctx["mb"]):
        os.write(1, block)
        os.write(2, block)
    sys.stdout.write("done\n")
    return {"flooded_mb": 2 * ctx["mb"]}
