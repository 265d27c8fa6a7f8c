"""A submitted kernel file as one value: which op it replaces, its exact bytes and their sha256, hashed once.

Made where a source first enters (a model's submission, the gate reading a file) and passed on from there, so the
digest a verdict, a ledger line or a commit names is the one of the bytes that were gated, never a recomputation of
something that may have changed in between. `write` is the one way a candidate is put on disk: <dir>/<op>.py,
byte for byte.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Candidate:
    op: str
    source: bytes  # the file exactly as submitted (UTF-8 where it came as text)
    sha256: str  # hex digest of `source`

    @classmethod
    def of(cls, op: str, source: str | bytes) -> Candidate:
        data = source.encode() if isinstance(source, str) else bytes(source)
        return cls(op, data, hashlib.sha256(data).hexdigest())

    @property
    def text(self) -> str:
        return self.source.decode()

    def write(self, directory: Path) -> Path:
        """<directory>/<op>.py holding exactly `source` (the directory made if missing); its path."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.op}.py"
        path.write_bytes(self.source)
        return path
