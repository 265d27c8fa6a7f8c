"""A GGUF file's metadata and tensor views, parsed straight from the bytes (GGUF v2/v3, little-endian).

The gguf package's GGUFReader makes a numpy view per array element: the embedded SmolLM2's 49,152 tokens and 48,900
merges cost it ~7 s on an idle 2-core CPU (17 s loaded) per model open, and every engine open (the end-to-end stage's
baseline and sandboxed job, profiling, generation) starts with one. Here the key/value section is read with struct
and the tensors are views of one read-only memmap; the gguf package still supplies the type table
(GGML_QUANT_SIZES) and the dequantizers. tests/engine/test_gguf.py checks every field and tensor against GGUFReader.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF value types: struct format of the scalars; 8 is a string, 9 an array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class Tensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # as GGUF lists it: ne0 (the fastest-varying) first
    data: np.ndarray  # the raw bytes (uint8), a read-only view of the file


@dataclass(frozen=True)
class GGUFFile:
    fields: dict[str, Any]  # key -> int | float | bool | str | list
    tensors: list[Tensor]


class _Cursor:
    def __init__(self, buf: memoryview):
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str):
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.scalar("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"a string of {n} bytes runs past the end of the file")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, n = self.scalar("<I"), self.scalar("<Q")
            if itype in _NUMPY:  # numbers: one frombuffer, not n unpacks
                size = np.dtype(_NUMPY[itype]).itemsize * n
                if self.pos + size > len(self.buf):
                    raise ValueError(f"an array of {n} values runs past the end of the file")
                arr: np.ndarray = np.frombuffer(self.buf, dtype=_NUMPY[itype], count=n, offset=self.pos)
                self.pos += size
                return arr.tolist()
            return [self.value(itype) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {vtype}")


def read(path: str | Path) -> GGUFFile:
    """Parse `path`. ValueError (or struct.error) for a file that is not GGUF v2/v3 or is cut short."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    c = _Cursor(mm.data)  # a memoryview of the mapping
    if bytes(c.buf[:4]) != MAGIC:
        raise ValueError("no GGUF magic")
    c.pos = 4
    version = c.scalar("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (2 and 3 are read)")
    n_tensors, n_kv = c.scalar("<Q"), c.scalar("<Q")
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        fields[key] = c.value(c.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = tuple(c.scalar("<Q") for _ in range(c.scalar("<I")))
        infos.append((name, GGMLQuantizationType(c.scalar("<I")), dims, c.scalar("<Q")))
    align = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-c.pos // align) * align
    tensors = []
    for name, ttype, dims, offset in infos:
        block, size = GGML_QUANT_SIZES[ttype]
        n = int(np.prod(dims, dtype=np.int64)) if dims else 1
        nbytes = n // block * size
        lo = start + offset
        if lo + nbytes > len(mm):
            raise ValueError(f"tensor {name} runs past the end of the file")
        tensors.append(Tensor(name, ttype, dims, mm[lo:lo + nbytes]))
    return GGUFFile(fields, tensors)
