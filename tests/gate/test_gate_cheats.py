"""The red team, cheats and wrong kernels through the whole gate: each fixture the static stage lets through (its
`# expect:` header is a runtime., numeric. or other non-static code) goes through the sandboxed runtime and numeric
stages on a quick case grid and must be rejected with its reason code and a one-line detail. Legitimate rewrites:
test_gate_redteam.py; the static stage's own fixtures: test_gate_static.py; fixtures and job runner: gate_fixtures.py.
"""
from __future__ import annotations

import pytest
from gate_fixtures import fixtures, full, module_jobs, params

CHEATS = [f for f in fixtures() if f.expect != "accepted" and not f.expect.startswith("static.")]


@pytest.fixture(scope="module")
def jobs(request, tmp_path_factory):
    yield from module_jobs(request, tmp_path_factory, lambda fx, run_dir: (full, fx, run_dir / "full"))


@pytest.mark.parametrize("fx", params(CHEATS))
def test_cheat_is_rejected_with_its_reason(fx, jobs):
    v = jobs[("test_cheat_is_rejected_with_its_reason", fx.id)].result()
    assert not v.accepted and v.reason in fx.expect.split(" | "), f"{fx.id}: {v.reason}: {v.detail}"
    assert v.detail and "\n" not in v.detail
