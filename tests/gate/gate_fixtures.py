"""Shared helpers for the gate's red-team tests: fixture discovery and a quick case grid.

Each fixture under fixtures/<op>/ states what the gate must say about it in its header:
    # expect: <reason code> | accepted
    # runtime-expect: <reason code>     (optional: what runtime/numeric say when the static stage is skipped)
    # dists: normal, tiny               (optional: the distributions the fixture needs; default QUICK_DISTS)
    # max-rows: 400                     (optional: policy gate.max_rows for its run; default 0, no range sweep)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

FIXTURES = Path(__file__).parent / "fixtures"
QUICK_DTYPES = [torch.float32]
QUICK_DISTS = ["normal"]
# One traced shape per op (as a trace would give); the spec's odd shapes and a larger shape are always added.
QUICK_SHAPES = {"rmsnorm": [{"M": 4, "N": 576}], "silu_mul": [{"M": 4, "N": 1536}], "softmax": [{"M": 2, "V": 4099}],
                "add_rmsnorm": [{"M": 4, "N": 576}], "rope": [{"B": 2, "T": 5, "H": 9, "D": 64}],
                "matmul_q4_1": [{"M": 4, "N": 192, "K": 576}]}


@dataclass(frozen=True)
class Fixture:
    op: str
    path: Path
    expect: str
    runtime_expect: str | None
    dists: list[str]
    max_rows: int = 0

    @property
    def id(self) -> str:
        return f"{self.op}/{self.path.stem}"


def _header(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].partition(":")
        if sep and key.strip() in ("expect", "runtime-expect", "dists", "max-rows"):
            out[key.strip()] = value.strip()
    return out


def fixtures() -> list[Fixture]:
    out = []
    for path in sorted(FIXTURES.glob("*/*.py")):
        h = _header(path)
        assert "expect" in h, f"{path} has no '# expect:' header"
        dists = [d.strip() for d in h["dists"].split(",")] if "dists" in h else QUICK_DISTS
        out.append(Fixture(path.parent.name, path, h["expect"], h.get("runtime-expect"), dists,
                           int(h.get("max-rows", 0))))
    return out
