"""Compiler hints as claims (autokernel/gate/hints.py): each rule on plain arrays, as the interpreter hands them over.
The kernels that make such claims go through the whole gate in tests/gate/fixtures/rmsnorm/hint_* (rejected,
runtime.false_hint) and legit_hints_tutorial_wrap.py / legit_tutorial_style.py (accepted)."""
from __future__ import annotations

import numpy as np

from autokernel.gate.hints import false_claim

DIV, CONTIG, CONST = "tt.divisibility", "tt.contiguity", "tt.constancy"


def test_a_scalar_declared_a_multiple_holds_only_where_it_is_one():
    assert false_claim(DIV, np.array(576, np.int32), [16], 1) is None
    assert "tl.multiple_of(..., 16)" in false_claim(DIV, np.array(431, np.int32), [16], 1)


def test_multiple_of_binds_the_first_value_of_each_run():
    assert false_claim(DIV, np.arange(64, 96), [32], 1) is None  # one aligned run: its other values need not be
    assert false_claim(DIV, np.arange(8, 40), [32], 1) is not None
    assert false_claim(DIV, np.array([0, 1, 2, 3, 64, 65]), [32], 1) is None  # two runs, each start aligned
    assert false_claim(DIV, np.array([0, 1, 2, 3, 40, 41]), [32], 1) is not None


def test_the_tutorial_wrap_is_contiguous_enough_and_a_stride_is_not():
    for pid, m in ((0, 1), (0, 2), (0, 37), (1, 100), (1, 127)):  # the grid is cdiv(M, 64): pid * 64 < M
        rows = (pid * 64 + np.arange(64)) % m
        assert false_claim(CONTIG, rows, [64], 1) is None, m
        assert false_claim(DIV, rows, [64], 1) is None, m
    assert false_claim(CONTIG, np.arange(0, 32, 2), [8], 1) is not None  # every other column


def test_pointers_step_by_their_element_size():
    base = 1 << 20
    ptrs = base + 4 * np.arange(16, dtype=np.int64)  # float32 elements
    assert false_claim(CONTIG, ptrs, [16], 4) is None
    assert false_claim(DIV, ptrs, [16], 4) is None
    assert false_claim(CONTIG, base + 8 * np.arange(16), [16], 4) is not None
    assert false_claim(DIV, ptrs + 4, [16], 4) is not None


def test_constancy_and_two_dimensions():
    assert false_claim(CONST, np.repeat(np.arange(4), 8), [8], 1) is None
    assert false_claim(CONST, np.repeat(np.arange(4), 4), [8], 1) is not None
    tile = np.arange(4)[:, None] * 576 + np.arange(16)[None, :]
    assert false_claim(CONTIG, tile, [1, 16], 1) is None
    assert false_claim(DIV, tile, [1, 16], 1) is None  # every row starts at a multiple of 576
    assert false_claim(DIV, np.arange(4)[:, None] * 431 + np.arange(16)[None, :], [1, 16], 1) is not None
    assert false_claim(DIV, tile, [64, 16], 1) is not None  # along rows, every element: column 1 is not
