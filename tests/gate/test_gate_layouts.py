"""Inputs in production's layouts: rope's numeric cases draw x contiguous (as this engine passes its q and k
projections) or as a fused-qkv slice, from the secret seed, so a kernel keyed on the layout is checked in the one
production uses. What the engine alone sends (ranks, index dtypes) is judged in the e2e stage's captured calls
(tests/gate/test_gate_e2e.py)."""
from pathlib import Path

import torch

from autokernel.gate import verify
from autokernel.ops import get
from autokernel.paths import INSTALLED_LAYOUT
from autokernel.policy import Policy

FIXTURE = Path(__file__).parent / "layout_fixtures" / "rope_contiguous_coarse_far.py"


def test_rope_cases_come_in_both_layouts():
    spec, shape = get("rope"), {"B": 2, "T": 5, "H": 9, "D": 64}
    kinds = {spec.make_inputs(shape, torch.float32, "cpu", torch.Generator().manual_seed(s))["x"].is_contiguous()
             for s in range(16)}
    assert kinds == {True, False}


def test_a_rope_kernel_keyed_on_the_engines_layout_is_rejected(tmp_path):
    # a fixed seed, so that the test is deterministic; a fresh secret one catches it unless every far-position case
    # draws the slice (1 in 2^cases)
    v = verify("rope", FIXTURE, seed=7, run_dir=tmp_path, shapes=[{"B": 2, "T": 5, "H": 9, "D": 64}],
               dtypes=[torch.float32], dists=["normal"], stages=[], policy=Policy(gate={"max_rows": 0}),
               kernels_dir=INSTALLED_LAYOUT.kernels)
    assert not v.accepted and v.reason == "numeric.mismatch", (v.reason, v.detail)
