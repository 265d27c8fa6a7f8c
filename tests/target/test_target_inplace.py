"""Launchers that write a preallocated output and return None, as vLLM's are (`silu_and_mul(out, x) -> None`,
`fused_add_rms_norm(x, residual, weight, eps) -> None`): the inputs such a launcher writes are its outputs
(autokernel/target/launches.py records them, contract.inplace names them), judged against a reference that writes the
same buffers in place or returns their values (autokernel/target/refjob.py). Before, every such honest incumbent was
rejected numeric.input_mutated. A candidate that writes an input the incumbent does not, or leaves the output
unwritten, is still rejected.
"""
import textwrap
from pathlib import Path

import pytest
import torch
from toy_checkout import write_tree

from autokernel.policy import Policy
from autokernel.target import declaration as decl
from autokernel.target import gate as target_gate
from autokernel.target.launches import LauncherRecorder

NORM = '''
import triton
import triton.language as tl


@triton.jit
def _norm_kernel(out_ptr, x_ptr, eps, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
    tl.store(out_ptr + row * n + offs, (x * r).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _add_norm_kernel(x_ptr, res_ptr, eps, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0).to(tl.float32)
    x += tl.load(res_ptr + row * n + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(res_ptr + row * n + offs, x.to(res_ptr.dtype.element_ty), mask=m)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
    tl.store(x_ptr + row * n + offs, (x * r).to(x_ptr.dtype.element_ty), mask=m)


def norm(out, x, eps):
    rows = x.numel() // x.shape[-1]
    _norm_kernel[(rows,)](out, x, eps, x.shape[-1], BLOCK=triton.next_power_of_2(x.shape[-1]))


def add_norm(x, residual, eps):
    rows = x.numel() // x.shape[-1]
    _add_norm_kernel[(rows,)](x, residual, eps, x.shape[-1], BLOCK=triton.next_power_of_2(x.shape[-1]))
'''
REFERENCE = '''
import torch


def norm(out, x, eps):  # in place, returning None (vLLM's forward_native style)
    out.copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def add_norm(x, residual, eps):  # returning the values of the written buffers, in parameter order
    s = x + residual
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps), s
'''
ENGINE = '''
import torch

from toyi.ops.norm import add_norm, norm

VOCAB, DIM = 16, 32


class Engine:
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.emb = torch.randn(VOCAB, DIM, generator=g)
        self.out = torch.randn(DIM, VOCAB, generator=g)

    def workload(self):
        for ids in ([1, 2, 3, 4, 5, 6, 7], [3], [2, 4, 6]):
            self.logits([ids])

    def logits(self, ids):
        rows = []
        for row in ids:
            x = self.emb[torch.tensor(row)].contiguous()
            y = torch.empty_like(x)
            norm(y, x, 1e-5)
            h, res = y.clone(), x.clone()
            add_norm(h, res, 1e-5)
            rows.append(h[-1] @ self.out)
        return torch.stack(rows)


def build():
    return Engine()
'''
DECLARATION = '''
[engine]
build = "toyi.engine:build"

[ops.norm]
file = "toyi/ops/norm.py"
launchers = ["norm", "add_norm"]
reference = { norm = "toyi.reference:norm", add_norm = "toyi.reference:add_norm" }
'''


def checkout(root: Path) -> Path:
    return write_tree(root, {"toyi/__init__.py": "", "toyi/ops/__init__.py": "", "toyi/ops/norm.py": NORM,
                            "toyi/reference.py": REFERENCE, "toyi/engine.py": ENGINE, decl.NAME: DECLARATION})


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return checkout(tmp_path_factory.mktemp("toyi"))


def candidate(tmp_path: Path, old: str, new: str) -> Path:
    assert old in NORM
    path = tmp_path / "norm.py"
    path.write_text(textwrap.dedent(NORM.replace(old, new)))
    return path


def gate(root: Path, path: Path, e2e: bool = False):
    return target_gate.verify(root, "norm", path, policy=Policy(), seed=99, stages=None if e2e else [])


def test_the_recorder_counts_what_a_launcher_returning_none_writes_as_its_outputs():
    def out_param(out, x):
        out.copy_(x * 2)

    def scratch_beside_a_return(x, scratch):
        scratch.fill_(1.0)
        return x * 2

    rec = LauncherRecorder()
    fns = [rec.wrap(out_param, "f.py", "out_param"), rec.wrap(scratch_beside_a_return, "f.py", "scratch")]
    rec.active = True
    fns[0](torch.zeros(3), torch.ones(3))
    fns[1](torch.ones(3), torch.zeros(3))
    got = {g["launcher"]: g for g in rec.result()}
    assert got["out_param"]["written"] == ["out"] and got["out_param"]["returns"] == [("NoneType", None)]
    assert got["scratch"]["written"] == []  # written beside returned outputs: held unchanged, as before


def test_the_honest_in_place_incumbent_is_accepted_end_to_end(root, tmp_path):
    path = tmp_path / "norm.py"
    path.write_text((root / "toyi/ops/norm.py").read_text())
    v = gate(root, path, e2e=True)
    assert v.accepted, [(s.name, s.reason, s.detail) for s in v.stages]
    assert [s.name for s in v.stages] == ["static", "runtime", "numeric"] * 2 + ["e2e"]
    assert v.stages[-1].metrics["calls_judged"] >= 2 and v.stages[-1].metrics["kl_max"] == 0.0


def test_a_candidate_writing_an_input_the_incumbent_does_not_is_rejected(root, tmp_path):
    v = gate(root, candidate(tmp_path, "tl.store(out_ptr + row * n + offs, (x * r)",
                             "tl.store(x_ptr + row * n + offs, x * 2, mask=m)\n"
                             "    tl.store(out_ptr + row * n + offs, (x * r)"))
    assert not v.accepted and v.failure.reason == "numeric.input_mutated", v.failure.detail
    assert "input x" in v.failure.detail
    runtime = next(s for s in v.stages if s.name == "runtime")
    assert "0 calls" not in runtime.detail and "no call completed" in runtime.detail  # was "0 calls, each launched"


@pytest.mark.parametrize("old,new", [
    ("    tl.store(out_ptr + row * n + offs, (x * r).to(out_ptr.dtype.element_ty), mask=m)", "    pass"),  # norm's out
    ("    tl.store(x_ptr + row * n + offs, (x * r)", "    tl.store(res_ptr + row * n + offs, (x * r)")])  # add_norm's x
def test_a_candidate_leaving_an_output_unwritten_is_rejected(root, tmp_path, old, new):
    v = gate(root, candidate(tmp_path, old, new))
    assert not v.accepted and v.failure.reason == "numeric.mismatch", (v.failure.reason, v.failure.detail)


def test_the_bench_checks_the_written_outputs(root, tmp_path, capsys):
    """Every kept output of a timed call is checked against the reference: for these launchers the arguments they
    wrote (was: '0 outputs, the reference has 2', exit 2). An identical copy is timed, and is no win (exit 1)."""
    from test_target_bench import _policy

    from autokernel.cli.bench import bench_command
    path = tmp_path / "cand" / "norm.py"
    path.parent.mkdir()
    path.write_text((root / "toyi/ops/norm.py").read_text())
    assert bench_command("norm", [path], None, False, policy=_policy(), repo=root) == 1, capsys.readouterr().err
    assert "bench.no_win" in capsys.readouterr().out
