"""One writer for the toy target checkouts the tests under tests/target build: each file's text dedented, its
folders made. Packages get their empty __init__.py files from the caller's dict (what a test leaves out is part of
what it tests)."""
import textwrap
from pathlib import Path


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write `files` (path relative to root -> text, dedented) under root; return root."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root
