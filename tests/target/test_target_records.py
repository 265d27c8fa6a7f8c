"""The launcher records a target's workload sends back are data from the checkout (trust rule 7): the parent checks
them (autokernel/target/discover.py _signature), rebuilds what it can (a dtype argument, held as recorded) and
refuses what it cannot in one line (contract.spec), and its work on them stays bounded (a secret prime near a forged
size of 2^36 is drawn, not scanned: autokernel/gate/schedule.py secret_prime).

Found by a red team: an engine passing `out_dtype=torch.float32` crashed verify and bench with an IndexError (exit 1:
read as "rejected" / "no win"); a forged record of (2^36, 32) spun the trusted process forever in the sweep's prime
scan; a record of an argument the gate cannot make crashed with a traceback.
"""
import random
import subprocess
import sys

import pytest
import torch
from test_target_gate import DECLARATION, ENGINE, NORM, checkout

from autokernel.cli.verify import verify_command
from autokernel.errors import UserError
from autokernel.gate import schedule
from autokernel.policy import Policy
from autokernel.target import contract, discover
from autokernel.target import declaration as decl
from autokernel.target import gate as target_gate
from autokernel.target.discover import LauncherCalls
from autokernel.target.launches import _describe

T = ("tensor", "float32")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _calls(*sigs) -> LauncherCalls:
    return LauncherCalls("toyt/ops/norm.py", "norm", len(sigs), [list(s) for s in sigs], [1] * len(sigs), [], [])


def test_arguments_are_described_as_data_the_parent_can_check():
    assert _describe(torch.float32) == ("dtype", "float32")
    assert _describe("llama") == ("str", "llama")
    assert _describe("x" * 65) == ("other", "str")  # never a truncated string to replay
    assert _describe(object()) == ("other", "object")
    sig = discover._signature([["out_dtype", ["dtype", "bfloat16"]], ["cfg", ["other", "Config"]],
                               ["junk", ["other"]], ["x", ["tensor", "float32", [2, 3], [3, 1]]]])
    assert sig == [("out_dtype", ("dtype", "bfloat16")), ("cfg", ("other", "Config")), ("junk", ("other", "?")),
                   ("x", ("tensor", "float32", (2, 3), (3, 1)))]


@pytest.mark.parametrize("arg", [["tensor", "float32", [1 << 36, 1 << 36], [1 << 36, 1]],  # 2^72 elements
                                 ["tensor", "float32", [2, 3], [1]],  # strides of another rank
                                 ["tensor", "float32", [-4, 3], [3, 1]],
                                 ["int", 1 << 70]])
def test_a_forged_record_is_dropped(arg):
    assert discover._signature([["x", arg]]) is None


def test_an_argument_the_gate_cannot_make_is_refused_in_one_line(tmp_path):
    root = checkout(tmp_path / "co")
    op = decl.load(root).ops["norm"]
    calls = _calls([("x", (*T, (7, 32), (32, 1))), ("cfg", ("other", "Config"))],
                   [("x", (*T, (3, 32), (32, 1))), ("cfg", ("other", "Config"))])
    table = contract.ReferenceTable(root, op.references["norm"], tmp_path / "ref", Policy().sandbox)
    with pytest.raises(contract.ReferenceError, match="norm's argument cfg was a Config"):
        contract.spec(op, calls, table)
    huge = _calls([("x", (*T, (1 << 24, 64), (64, 1)))], [("x", (*T, (3, 64), (64, 1)))])
    with pytest.raises(contract.ReferenceError, match="more than one case may allocate"):
        contract.spec(op, huge, table)


def test_a_huge_forged_size_is_refused_not_scanned(tmp_path, monkeypatch, capsys):
    """verify on a trace whose records say 2^36 rows: exit 2, one line, in seconds (it hung in the prime scan)."""
    root = checkout(tmp_path / "co")
    d = decl.load(root)
    forged = {"norm": _calls([("x", (*T, (1 << 36, 32), (32, 1))), ("eps", ("float", 1e-5))],
                             [("x", (*T, (3, 32), (32, 1))), ("eps", ("float", 1e-5))])}
    monkeypatch.setattr(target_gate, "record", lambda *a, **k: forged)
    path = tmp_path / "norm.py"
    path.write_text(NORM)
    assert verify_command("norm", path, repo=root) == 2
    err = capsys.readouterr().err
    assert "more than one case may allocate" in err and len(err.strip().splitlines()) == 1, err
    assert d is not None


def test_secret_primes_are_drawn_in_bounded_work():
    """In a subprocess with a deadline: the old scan of range(2^36, 2^37) never returned."""
    code = ("import random; from autokernel.gate import schedule as s; "
            "p = s.secret_prime(random.Random(0), (1 << 36) + 1, (1 << 37) + 1); "
            "assert p and s._is_prime(p) and (1 << 36) < p <= 1 << 37, p; "
            "print(s.sweep_shapes.__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # short ranges: every prime is a candidate, as before (the sweeps' secret sizes are unchanged)
    assert schedule.secret_prime(random.Random(3), 90, 97) is None
    assert {schedule.secret_prime(random.Random(s), 100, 200) for s in range(200)} == \
        {p for p in range(100, 200) if all(p % q for q in range(2, 15))}


OUT_DTYPE_NORM = NORM.replace("def norm(x, eps):\n    x = x.contiguous()\n    y = torch.empty_like(x)",
                              "def norm(x, eps, out_dtype):\n    x = x.contiguous()\n"
                              "    y = torch.empty(x.shape, dtype=out_dtype)")
OUT_DTYPE_REFERENCE = '''
import torch


def norm(x, eps, out_dtype):
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(out_dtype)
'''


def test_a_dtype_argument_is_held_as_recorded_and_the_incumbent_accepted(tmp_path):
    root = checkout(tmp_path / "co", DECLARATION)
    (root / "toyt/ops/norm.py").write_text(OUT_DTYPE_NORM)
    (root / "toyt/reference.py").write_text(OUT_DTYPE_REFERENCE)
    (root / "toyt/engine.py").write_text(ENGINE.replace("norm(self.emb[torch.tensor(row)], 1e-5)",
                                                        "norm(self.emb[torch.tensor(row)], 1e-5, torch.float32)"))
    v = target_gate.verify(root, "norm", root / "toyt/ops/norm.py", policy=Policy(), seed=5, stages=[])
    assert v.accepted, [(s.name, s.reason, s.detail) for s in v.stages]
    with pytest.raises(UserError):  # and a launcher never called stays exit-2 material (the records are checked)
        target_gate.verify(root, "nope", root / "toyt/ops/norm.py", policy=Policy(), seed=5, stages=[])
