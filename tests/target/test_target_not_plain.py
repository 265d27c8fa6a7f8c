"""Launch sites the gate cannot call as launchers: a method (`RMSNorm.forward`, which needs the engine's module as
`self`) and a function a decorator replaced in its module (`@torch.library.custom_op`: the module's name is a
CustomOpDef). `init` wrote them into `launchers` and `profile` then refused the first with "... is not a function of
its module; fix the engine". Now init declares only plain functions, writes "TODO" with a comment saying what to
declare where none is left, and profile's refusal names every such launcher and what a launcher is
(autokernel/target/launches.py, NOT_PLAIN)."""
from pathlib import Path

import pytest
from toy_checkout import write_tree

from autokernel.cli.init import init_command
from autokernel.errors import UserError
from autokernel.policy import Policy
from autokernel.target import declaration as decl
from autokernel.target import profile_target

try:
    import tomllib
except ImportError:  # pragma: no cover
    import tomli as tomllib

KERNELS = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)


class Scale(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _scale_kernel[(1,)](x, out, x.numel(), BLOCK=64)
        return out
'''
CUSTOM = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)


@torch.library.custom_op("toyn::double", mutates_args=("out",))
def double(out: torch.Tensor, x: torch.Tensor) -> None:
    _double_kernel[(1,)](x, out, x.numel(), BLOCK=64)
'''
DECORATED = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _triple_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 3, mask=m)


@torch.inference_mode()
def triple(x):
    out = torch.empty_like(x)
    _triple_kernel[(1,)](x, out, x.numel(), BLOCK=64)
    return out
'''
ENGINE = '''
import torch

from toyn.ops.custom import double
from toyn.ops.decorated import triple
from toyn.ops.scale import Scale


class Engine:
    def __init__(self):
        self.scale = Scale()

    def workload(self):
        x = torch.ones(50)
        out = torch.empty_like(x)
        double(out, self.scale(x))
        triple(out)

    def logits(self, ids):
        return torch.zeros(len(ids), 4)


def build():
    return Engine()
'''


def toy(root: Path) -> Path:
    return write_tree(root, {"toyn/__init__.py": "", "toyn/ops/__init__.py": "", "toyn/ops/scale.py": KERNELS,
                            "toyn/ops/custom.py": CUSTOM, "toyn/ops/decorated.py": DECORATED,
                            "toyn/engine.py": ENGINE,
                            decl.NAME: '[engine]\nbuild = "toyn.engine:build"\n'})


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_init_declares_todo_and_says_what_to_declare_and_profile_names_every_one(tmp_path):
    root = toy(tmp_path / "co")
    assert init_command(root, None, False, None) == 0
    text = (root / decl.NAME).read_text()
    data = tomllib.loads(text)
    assert data["ops"]["scale"]["launchers"] == ["TODO"], text  # was ["Scale.forward"]
    assert data["ops"]["custom"]["launchers"] == ["TODO"], text  # was ["double"], a CustomOpDef in its module
    # a function under a wrapping decorator (vLLM's @torch.inference_mode() launchers) is the module's function:
    # declared (it was "TODO", the module's name being the decorator's wrapper)
    assert data["ops"]["decorated"]["launchers"] == ["triple"], text
    assert "# Scale.forward launches here but cannot be a launcher: a launcher is a module-level `def`" in text
    assert "# double launches here but cannot be a launcher" in text and "torch.library.custom_op" in text
    # what init wrote before: profile names both and what a launcher is, in one line, exit 2
    (root / decl.NAME).write_text('[engine]\nbuild = "toyn.engine:build"\n\n'
                                  '[ops.scale]\nfile = "toyn/ops/scale.py"\nlaunchers = ["Scale.forward"]\n\n'
                                  '[ops.custom]\nfile = "toyn/ops/custom.py"\nlaunchers = ["double"]\n')
    with pytest.raises(UserError) as e:
        profile_target.profile(root, Policy())
    msg = str(e.value)
    assert "toyn.ops.custom:double" in msg and "toyn.ops.scale:Scale.forward" in msg, msg
    assert "module-level `def`" in msg and "fix the engine and rerun" not in msg, msg


def test_a_launcher_under_a_wrapping_decorator_is_profiled(tmp_path):
    """`@torch.inference_mode()` keeps the function as __wrapped__: profile records its calls as the launcher's (the
    gate's side of a decorated launcher: tests/target/test_target_launchers.py)."""
    root = toy(tmp_path / "co")
    (root / decl.NAME).write_text('[engine]\nbuild = "toyn.engine:build"\n\n'
                                  '[ops.decorated]\nfile = "toyn/ops/decorated.py"\nlaunchers = ["triple"]\n')
    run_dir, _ = profile_target.profile(root, Policy())
    assert "triple" in (run_dir / "summary.json").read_text()
