"""Attack: terminal control sequences and rich markup in everything that reaches the parent: the log, the exception
text the parent quotes, the returned data (clear the screen, fake a green ACCEPTED, set the window title)."""
import sys

EVIL = "\x1b[2J\x1b[H\x1b]0;owned\x07\x1b[32mACCEPTED\x1b[0m [/] [bold red]x[/] \r\x1b[1A\x9b31m\x00"


def main(ctx):
    print(EVIL * 100)
    sys.stderr.write(EVIL * 100)
    if ctx.get("raise"):
        raise ValueError(EVIL)
    return {"text": EVIL, EVIL: EVIL}
