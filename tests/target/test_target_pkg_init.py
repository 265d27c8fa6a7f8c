"""An engine whose package `__init__` imports the model, which binds the launcher by `from ... import` (vLLM's
`vllm/__init__.py` exports LLM): the package runs before autokernel wraps the launcher or swaps the candidate in, so
a setattr on the op's module alone left the model holding the original function. Profiling then said the launcher
was never called, and the end-to-end stage either found the candidate unreached or judged the incumbent in its
place. autokernel/target/launches.py (rebind) and capture.py (load_candidate) make every binding see the wrapper
and the candidate.

The toy checkout of tests/target/test_target_gate.py, with `toyt/__init__.py` importing its engine.
"""
import sys
import textwrap

import pytest
from test_target_gate import NORM, checkout

from autokernel.policy import Policy
from autokernel.target import e2e as target_e2e
from autokernel.target import gate as target_gate
from autokernel.target.launches import LauncherRecorder

INIT = "from .engine import Engine  # noqa: F401  (the package exports its engine)\n"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = checkout(tmp_path_factory.mktemp("toyp"))
    (root / "toyt/__init__.py").write_text(INIT)
    return root


def test_the_recorder_wraps_the_launcher_the_model_already_imported(root, monkeypatch):
    monkeypatch.syspath_prepend(str(root))
    for m in [m for m in sys.modules if m == "toyt" or m.startswith("toyt.")]:
        monkeypatch.delitem(sys.modules, m)
    rec = LauncherRecorder()
    assert rec.install("toyt.ops.norm", ["norm"], "toyt/ops/norm.py") == []
    engine = sys.modules["toyt.engine"]  # imported by toyt/__init__.py before the wrapper existed
    assert engine.norm is sys.modules["toyt.ops.norm"].norm and engine.norm.__wrapped__ is not None
    for m in [m for m in sys.modules if m == "toyt" or m.startswith("toyt.")]:
        del sys.modules[m]


def test_the_launchers_calls_are_recorded_and_the_incumbent_accepted(root, tmp_path):
    path = tmp_path / "norm.py"
    path.write_text(NORM)
    v = target_gate.verify(root, "norm", path, policy=Policy(), seed=7, stages=[])  # was: norm never called (exit 2)
    assert v.accepted, [(s.name, s.reason, s.detail) for s in v.stages]


@pytest.mark.parametrize("wrong", [False, True])
def test_the_end_to_end_stage_runs_the_candidate_the_engine_imported(root, tmp_path, wrong):
    """A wrong candidate (every output 1.5x) must be judged as itself: before, the engine kept calling the
    incumbent, so the stage said e2e.unreached (or, had it counted the incumbent's calls, passed it)."""
    path = tmp_path / "norm.py"
    path.write_text(textwrap.dedent(NORM.replace("(x * r).to(", "(x * r * 1.5).to(") if wrong else NORM))
    d, op = target_gate.declared_op(root, "norm")
    r = target_e2e.check(root, d, op, path, Policy())
    if wrong:
        assert not r.passed and r.reason in ("e2e.call_mismatch", "e2e.kl_exceeded"), (r.reason, r.detail)
    else:
        assert r.passed and r.metrics["calls_judged"] >= 1, (r.reason, r.detail)
