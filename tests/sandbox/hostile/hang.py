"""Attack: never return, ignoring the polite signals."""
import signal
import time


def main(ctx):
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    while True:
        time.sleep(0.1)
