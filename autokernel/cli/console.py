"""The commands' console (rich). In a CI log or a pipe rich would wrap every line at 80 columns, cutting paths and
branch names mid-word (a verdict.json path split in two): there lines are never wrapped and tables get at least 200
columns."""
from __future__ import annotations

from rich.console import Console


def make() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 200), soft_wrap=True)
