"""Attack: push characters into the controlling terminal's input queue (TIOCSTI), so that the user's shell runs them
after autokernel exits."""
import fcntl
import os
import termios


def main(ctx):
    out = {}
    for name, open_fd in (("stdin", lambda: 0), ("stdout", lambda: 1), ("stderr", lambda: 2),
                          ("/dev/tty", lambda: os.open("/dev/tty", os.O_RDWR))):
        try:
            fd = open_fd()
            for ch in "#autokernel-hostile-probe":  # no newline: nothing would run even if it landed
                fcntl.ioctl(fd, termios.TIOCSTI, ch.encode())
            out[name] = "injected"
        except OSError as e:
            out[name] = type(e).__name__
    return out
