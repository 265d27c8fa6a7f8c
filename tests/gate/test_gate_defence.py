"""The second line of defence on its own: each fixture with a `# runtime-expect:` header goes through the runtime and
numeric stages with the static stage skipped (as if the grammar had missed the cheat) and must be rejected there.
Fixtures and job runner: gate_fixtures.py; the whole gate on the same fixtures: test_gate_cheats.py and
test_gate_static.py.
"""
from __future__ import annotations

import pytest
from gate_fixtures import QUICK_DTYPES, QUICK_SHAPES, fixtures, module_jobs, params, runtime_only

from autokernel.gate import verify
from autokernel.policy import Policy

DEFENCE = [f for f in fixtures() if f.runtime_expect]


@pytest.fixture(scope="module")
def jobs(request, tmp_path_factory):
    yield from module_jobs(request, tmp_path_factory, lambda fx, run_dir: (runtime_only, fx, run_dir))


@pytest.mark.parametrize("fx", params(DEFENCE))
def test_runtime_catches_without_static(fx, jobs):
    r = jobs[("test_runtime_catches_without_static", fx.id)].result()
    assert not r.passed and r.reason in fx.runtime_expect.split(" | "), f"{fx.id}: {r.reason}: {r.detail}"


def test_nondeterminism_is_a_policy_switch(tmp_path):
    """Float atomics across programs: rejected by default, accepted when the policy allows run-to-run variation.
    Without the production-range sweep (max_rows 0, as the fixture's rejection in test_gate_cheats.py runs: the sweep
    took 100 s of interpreter time for this two-kernel candidate); the switch is what is under test."""
    from autokernel.policy import Gate
    fx = next(f for f in fixtures() if f.path.stem == "num_atomic_sum")
    policy = Policy(gate=Gate(require_bitwise_determinism=False, max_rows=0))
    v = verify(fx.op, fx.path, run_dir=tmp_path, shapes=QUICK_SHAPES[fx.op], dtypes=QUICK_DTYPES, dists=fx.dists,
               stages=[], policy=policy)
    assert v.accepted, v.detail
    assert "nondeterminism allowed by policy" in v.stages[2].detail
