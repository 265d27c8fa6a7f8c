"""A launcher that returns None and writes scratch besides its result, as vLLM's and SGLang's split-KV decode
attention does (`decode_attention_fwd(q, k, v, o, ..., attn_logits, num_kv_splits, ...)`: `o` is the result,
`attn_logits` the per-split partials). `outputs = ["out"]` names the written arguments that are the op's result
(autokernel/target/contract.py `inplace`); the others are scratch, never compared. Before, every written argument
was an output, judged against what the reference left in it: such a launcher could not be declared at all (the
user's reference does not reproduce the incumbent's partials), and a rewrite with another split count, writing the
scratch differently, could never pass.
"""
import textwrap
from pathlib import Path

import pytest
from toy_checkout import write_tree

from autokernel.errors import UserError
from autokernel.policy import Policy
from autokernel.target import declaration as decl
from autokernel.target import gate as target_gate

SPLIT_NORM = '''
import triton
import triton.language as tl


@triton.jit
def _partial_kernel(x_ptr, part_ptr, n, chunk, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    s = tl.program_id(1)
    offs = s * chunk + tl.arange(0, BLOCK)
    m = (offs < n) & (offs < (s + 1) * chunk)
    x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(part_ptr + row * 8 + s, tl.sum(x * x, axis=0))


@triton.jit
def _combine_kernel(x_ptr, part_ptr, out_ptr, n, eps, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    k = tl.arange(0, 8)
    p = tl.load(part_ptr + row * 8 + k, mask=k < SPLITS, other=0.0)
    r = 1.0 / tl.sqrt(tl.sum(p, axis=0) / n + eps)
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n + offs, (x * r).to(out_ptr.dtype.element_ty), mask=m)


def split_norm(out, x, partial, eps):
    rows, n = x.numel() // x.shape[-1], x.shape[-1]
    splits = 2
    chunk = triton.cdiv(n, splits)
    _partial_kernel[(rows, splits)](x, partial, n, chunk, SPLITS=splits, BLOCK=triton.next_power_of_2(chunk))
    _combine_kernel[(rows,)](x, partial, out, n, eps, SPLITS=splits, BLOCK=triton.next_power_of_2(n))
'''
REFERENCE = '''
import torch


def split_norm(out, x, partial, eps):  # the result only, in place (vLLM's forward_native style)
    out.copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
'''
ENGINE = '''
import torch

from toys.ops.split_norm import split_norm

VOCAB, DIM = 16, 24


class Engine:
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.emb = torch.randn(VOCAB, DIM, generator=g)
        self.out = torch.randn(DIM, VOCAB, generator=g)

    def workload(self):
        for ids in ([1, 2, 3, 4, 5], [3], [2, 4, 6]):
            self.logits([ids])

    def logits(self, ids):
        rows = []
        for row in ids:
            x = self.emb[torch.tensor(row)].contiguous()
            y = torch.empty_like(x)
            split_norm(y, x, torch.empty(x.shape[0], 8), 1e-5)
            rows.append(y[-1] @ self.out)
        return torch.stack(rows)


def build():
    return Engine()
'''
DECLARATION = '''
[engine]
build = "toys.engine:build"

[ops.split_norm]
file = "toys/ops/split_norm.py"
launchers = ["split_norm"]
reference = "toys.reference:split_norm"
'''


def checkout(root: Path, outputs: str) -> Path:
    return write_tree(root, {"toys/__init__.py": "", "toys/ops/__init__.py": "", "toys/ops/split_norm.py": SPLIT_NORM,
                            "toys/reference.py": REFERENCE, "toys/engine.py": ENGINE,
                            decl.NAME: DECLARATION + (f"outputs = {outputs}\n" if outputs else "")})


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return checkout(tmp_path_factory.mktemp("toys"), '["out"]')


def candidate(tmp_path: Path, old: str, new: str) -> Path:
    assert old in SPLIT_NORM
    path = tmp_path / "split_norm.py"
    path.write_text(textwrap.dedent(SPLIT_NORM.replace(old, new)))
    return path


def gate(root: Path, path: Path, e2e: bool = False):
    return target_gate.verify(root, "split_norm", path, policy=Policy(), seed=7, stages=None if e2e else [])


def test_a_rewrite_with_another_split_count_is_accepted_end_to_end(root, tmp_path):
    """Four partial sums where the incumbent writes two: the scratch differs, the result agrees."""
    v = gate(root, candidate(tmp_path, "    splits = 2\n", "    splits = 4\n"), e2e=True)
    assert v.accepted, [(s.name, s.reason, s.detail) for s in v.stages]
    assert [s.name for s in v.stages] == ["static", "runtime", "numeric", "e2e"]
    assert v.stages[-1].metrics["calls_judged"] >= 1


def test_a_wrong_result_is_still_rejected(root, tmp_path):
    v = gate(root, candidate(tmp_path, "tl.sum(p, axis=0) / n", "tl.sum(p, axis=0) / (n + 1)"))
    assert not v.accepted and v.failure.reason == "numeric.mismatch", (v.failure.reason, v.failure.detail)


@pytest.mark.parametrize("outputs,message", [
    ('["o"]', "never wrote"),  # not an argument it writes
    ("[0]", 'name those that are its result (outputs = ["out"]')])  # indices: it returns nothing to pick
def test_outputs_that_do_not_fit_the_launcher_are_a_clear_error(tmp_path, outputs, message):
    r = checkout(tmp_path / "bad", outputs)
    path = tmp_path / "split_norm.py"
    path.write_text(SPLIT_NORM)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("[", r"\[")):
        gate(r, path)


def test_names_are_read_as_written_arguments_and_indices_as_return_values():
    assert decl.named(["out"]) == ["out"] and decl.indices(["out"]) is None
    assert decl.indices([0, 2]) == [0, 2] and decl.named([0, 2]) is None
    assert decl.named(None) is None and decl.indices(None) is None
