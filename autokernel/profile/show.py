"""Shared by what `autokernel profile`/`rank` print (autokernel/profile/command.py) and a target's rank table
(autokernel/target/rank_target.py)."""
from __future__ import annotations


def console():
    """Rich's console; piped output gets 150 columns rather than 80, so the rank table is not cut to ellipses."""
    from rich.console import Console
    c = Console()
    return c if c.is_terminal else Console(width=max(c.width, 150))


def pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f}%"
