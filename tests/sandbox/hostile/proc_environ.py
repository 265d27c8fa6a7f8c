"""Attack: read other processes' environments and command lines through /proc (pid 1, the host parent's pid)."""
import glob


def main(ctx):
    found, readable = [], []
    paths = glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline")
    paths += [f"/proc/{ctx['host_pid']}/environ", f"/proc/{ctx['host_pid']}/cmdline", "/proc/1/environ"]
    for p in paths:
        try:
            data = open(p, "rb").read()
        except OSError:
            continue
        readable.append(p)
        if b"canary" in data:
            found.append(p)
    return {"found": found, "readable": readable, "pids": sorted(glob.glob("/proc/[0-9]*"))}
