"""Candidate (autokernel/candidate.py): hashed once, from text or bytes alike; written bytewise as <dir>/<op>.py."""
import dataclasses
import hashlib

import pytest

from autokernel.candidate import Candidate

SOURCE = "import triton\n# ünïcode and a CRLF\r\n"


def test_text_and_bytes_make_the_same_candidate():
    c = Candidate.of("rmsnorm", SOURCE)
    assert c == Candidate.of("rmsnorm", SOURCE.encode())
    assert c.sha256 == hashlib.sha256(SOURCE.encode()).hexdigest()
    assert c.text == SOURCE
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.sha256 = "0" * 64  # type: ignore[misc]


def test_write_puts_exactly_the_hashed_bytes_at_dir_op_py(tmp_path):
    c = Candidate.of("rmsnorm", SOURCE)
    path = c.write(tmp_path / "new" / "dir")
    assert path == tmp_path / "new" / "dir" / "rmsnorm.py"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == c.sha256
