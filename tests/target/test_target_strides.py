"""Recorded layouts with gaps (autokernel/target/contract.py, `_strides`): engines pass views into larger buffers
(vLLM's and SGLang's q and k are slices of one fused qkv projection; a padded row pitch), so a launcher's rows are
not always `n_cols` apart. The gate makes its inputs in the recorded layout, gaps included: a kernel that assumes
dense rows is exact on dense inputs and wrong on production's, and is rejected by the numeric stage itself."""
import textwrap

import pytest
import torch
from test_target_gate import ENGINE, NORM, checkout

from autokernel.policy import Policy
from autokernel.target import contract
from autokernel.target import gate as target_gate

# the toy engine, with its rows read through a 48-wide pitch: norm gets x[:, :32] of a (T, 48) buffer
GAPPED = ENGINE.replace("self.emb = torch.randn(VOCAB, DIM, generator=g)",
                        "self.emb = torch.randn(VOCAB, DIM + 16, generator=g)").replace(
    "norm(self.emb[torch.tensor(row)], 1e-5)", "norm(self.emb[torch.tensor(row)][:, :DIM], 1e-5)")
DENSE_ONLY = ("    x = x.contiguous()\n", "")  # the incumbent copies to dense rows; without it, rows are n apart


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _gapped(root):
    root = checkout(root)
    (root / "toyt/engine.py").write_text(textwrap.dedent(GAPPED))
    return root


def _verify(root, tmp_path, source):
    path = tmp_path / "cand" / "norm.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return target_gate.verify(root, "norm", path, policy=Policy(), seed=5, stages=[])


def test_a_kernel_that_assumes_dense_rows_is_rejected_where_production_sends_gapped_ones(tmp_path):
    assert GAPPED != ENGINE and DENSE_ONLY[0] in NORM
    cheat = NORM.replace(*DENSE_ONLY)
    v = _verify(_gapped(tmp_path / "gapped"), tmp_path, cheat)
    assert not v.accepted and v.failure.reason == "numeric.mismatch", [(s.name, s.reason) for s in v.stages]
    assert _verify(checkout(tmp_path / "dense"), tmp_path, cheat).accepted  # exact wherever rows are dense
    assert _verify(_gapped(tmp_path / "gapped"), tmp_path, NORM).accepted  # the incumbent, on the gapped layout


def test_strides_keep_the_recorded_gaps_at_other_sizes():
    # q (B, T, H, D) = (1, 7, 9, 64) sliced from a fused qkv of (9 + 3 + 3) heads: rows 960 apart, not 576
    recorded, strides = (1, 7, 9, 64), (6720, 960, 64, 1)
    order = contract._order(strides)
    assert contract._strides(recorded, order, recorded, strides) == (7 * 960 - 384, 960, 64, 1)  # size 1: any
    assert contract._strides((1, 37, 9, 64), order, recorded, strides) == (37 * 960 - 384, 960, 64, 1)
    assert contract._strides((1, 3, 9, 128), order, recorded, strides)[1] == 9 * 128 + 384  # the gap stays
    dense = (7, 9, 64)
    assert contract._strides((5, 9, 64), contract._order((576, 64, 1)), dense, (576, 64, 1)) == (576, 64, 1)
    permuted = (64, 1, 9 * 64)  # a transposed view: dims 2, 0, 1 outermost first
    assert contract._strides((7, 64, 9), contract._order(permuted), (7, 64, 9), permuted) == permuted
    bcast = (0, 1)  # cos expanded over rows: made dense, as before (the gate writes inputs elementwise)
    assert contract._strides((5, 32), contract._order(bcast), (7, 32), bcast) == \
        contract._dense((5, 32), contract._order(bcast))


def test_gapped_inputs_hold_values_in_the_gaps():
    recorded, strides = (7, 32), (48, 1)
    t = contract._tensor((7, 32), contract._order(strides), "float32", torch.float32, torch.float32, "cpu",
                         torch.Generator().manual_seed(0), "normal", 7, {}, recorded, strides)
    assert t.stride() == (48, 1) and not t.is_contiguous()
    whole = torch.as_strided(t, (6, 48), (48, 1))  # the storage ends at the last row's 32nd value
    assert torch.isfinite(whole).all() and whole[:, 32:].abs().sum() > 0  # a kernel reading them reads noise
