"""Shared helpers for the gate's red-team tests: fixture discovery and a quick case grid.

Each fixture under fixtures/<op>/ states what the gate must say about it in its header:
    # expect: <reason code> | accepted
    # runtime-expect: <reason code>     (optional: what runtime/numeric say when the static stage is skipped)
    # dists: normal, tiny               (optional: the distributions the fixture needs; default QUICK_DISTS)
    # max-rows: 400                     (optional: policy gate.max_rows for its run; default 0, no range sweep)
    # dtypes: float32, bfloat16         (optional: the dtypes the fixture needs; default QUICK_DTYPES)
    # shapes: model                     (optional: the op's model shapes as the traced ones, not QUICK_SHAPES: the
                                         sweep's budget is a multiple of the traced cost)
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from autokernel.deadline import Deadline
from autokernel.gate import StageResult, Verdict, numeric, thresholds, verify
from autokernel.ops import get
from autokernel.paths import INSTALLED_LAYOUT
from autokernel.policy import Policy

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
    dtypes: tuple[torch.dtype, ...] = tuple(QUICK_DTYPES)
    model_shapes: bool = False  # `# shapes: model`

    @property
    def id(self) -> str:
        return f"{self.op}/{self.path.stem}"


def _header(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].partition(":")
        if sep and key.strip() in ("expect", "runtime-expect", "dists", "max-rows", "dtypes", "shapes"):
            out[key.strip()] = value.strip()
    return out


def fixtures() -> list[Fixture]:
    out = []
    for path in sorted(FIXTURES.glob("*/*.py")):
        h = _header(path)
        assert "expect" in h, f"{path} has no '# expect:' header"
        dists = [d.strip() for d in h["dists"].split(",")] if "dists" in h else QUICK_DISTS
        dtypes = tuple(getattr(torch, d.strip()) for d in h["dtypes"].split(",")) if "dtypes" in h else QUICK_DTYPES
        out.append(Fixture(path.parent.name, path, h["expect"], h.get("runtime-expect"), dists,
                           int(h.get("max-rows", 0)), tuple(dtypes), h.get("shapes") == "model"))
    return out


# --- whole-gate runs of the fixtures, shared by test_gate_redteam.py, test_gate_cheats.py, test_gate_defence.py -------

def params(fxs) -> list:
    """A fixture whose header says `# slow` (a minute or more under the interpreter) runs only with -m slow."""
    slow = lambda f: "# slow" in f.path.read_text().splitlines()[:8]  # noqa: E731
    return [pytest.param(f, id=f.id, marks=[pytest.mark.slow] if slow(f) else []) for f in fxs]


def e2e_fails(op: str, candidate: Path, policy: Policy, *, kernels_dir: Path | None = None,
              measured: dict | None = None, deadline: Deadline = Deadline.none()) -> StageResult:
    return StageResult.fail("e2e", "e2e.kl_exceeded", f"stub stage saw {candidate.name} for {op}")


def full(fx: Fixture, run_dir: Path, stages=None) -> Verdict:
    """The whole gate on the quick grid (the e2e stage: tests/gate/test_gate_e2e.py)."""
    return verify(fx.op, fx.path, run_dir=run_dir, shapes=None if fx.model_shapes else QUICK_SHAPES.get(fx.op),
                  dtypes=list(fx.dtypes),
                  dists=fx.dists, stages=[] if stages is None else stages, kernels_dir=INSTALLED_LAYOUT.kernels,
                  policy=Policy(gate={"max_rows": fx.max_rows}))


def runtime_only(fx: Fixture, run_dir: Path) -> StageResult:
    """Runtime and numeric with the static stage skipped (as if it had missed the cheat)."""
    spec = get(fx.op)
    job = run_dir / f"defence-{fx.op}-{fx.path.stem}"
    job.mkdir(parents=True)
    copy = job / f"{fx.op}.py"
    copy.write_bytes(fx.path.read_bytes())
    planned = numeric.plan(spec, QUICK_SHAPES.get(fx.op), list(fx.dtypes), fx.dists, 12345, fx.max_rows,
                           thresholds.extract(fx.path.read_bytes()))  # the range sweep as in the full run
    runtime, num = numeric.run(spec, copy, job, Policy().sandbox, 12345, planned)
    return runtime if not runtime.passed else num


def module_jobs(request, tmp_path_factory, plan, named=None):
    """The body of a module-scoped `jobs` fixture: plan(fx, run_dir) -> (fn, *args) for each collected test of the
    requesting module with an `fx` parameter (keyed (test name, fx.id)), and named[test name](run_dir) -> (fn, *args)
    for other collected tests of the module (keyed by test name). The jobs are submitted up front, two at a time
    (each is a chain of sandboxed processes), and each test waits on its own. A module runs whole on one xdist worker
    (--dist loadfile), so the red team is split across modules to spread over the workers."""
    run_dir = tmp_path_factory.mktemp("gate")
    pool = ThreadPoolExecutor(max_workers=2)
    futures = {}
    for item in request.session.items:
        if item.path != request.path:
            continue
        if hasattr(item, "callspec") and "fx" in item.callspec.params:
            fx = item.callspec.params["fx"]
            futures[(item.originalname, fx.id)] = pool.submit(*plan(fx, run_dir))
        elif item.originalname in (named or {}):
            futures[item.originalname] = pool.submit(*named[item.originalname](run_dir))
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)
