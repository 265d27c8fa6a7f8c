"""`autokernel init`: discovery on a toy checkout (two Triton kernels written here, run under the interpreter in the
sandbox), the declaration it writes, bad input (exit 2, one line, nothing written), and the Liger example end to end
(examples/liger/make_checkout.sh, then init on it)."""
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from toy_checkout import write_tree

from autokernel.cli.init import init_command
from autokernel.errors import UserError
from autokernel.target import declaration as decl
from autokernel.target import discover

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
CLI = [str(Path(sys.executable).parent / "autokernel")]

ADD = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


def add(x, y):
    out = torch.empty_like(x)
    _add_kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), BLOCK=64)
    return out
'''
# What autokernel.interp makes run on CPU, as Liger's kernels need it: a float scalar used as compiled Triton
# gives it (alpha.to fails on the bare interpreter), libdevice (a stub returning None there), two autotune configs
# (benchmarking needs a GPU); and bf16 arithmetic (the engine's bf16 add: garbage on the bare interpreter).
SCALE = '''
import torch
import triton
import triton.language as tl
from triton.language.extra.libdevice import rsqrt


@triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 128})], key=["n"])
@triton.jit
def _scale_kernel(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    s = alpha.to(tl.float32)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * (s * s * rsqrt(s * s)), mask=m)


def scale(x, alpha):
    out = torch.empty_like(x)
    _scale_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, float(alpha), x.numel())
    return out
'''
ENGINE = '''
import torch

from toy.ops.add import add
from toy.ops.scale import scale


class Engine:
    def workload(self):
        x = torch.arange(100, dtype=torch.float32)
        for _ in range(2):
            x = add(x, x)
        y = scale(x, 0.5)
        assert torch.equal(y, torch.arange(100, dtype=torch.float32) * 2), "the toy kernels are wrong"
        xb = torch.tensor([1.5, -2.0, 0.25, 3.0], dtype=torch.bfloat16)
        assert torch.equal(add(xb, xb), xb * 2), "bf16 arithmetic is wrong"

    def logits(self, ids):
        return torch.zeros(len(ids), 8)


class Idle(Engine):
    def workload(self):
        pass


def build():
    return Engine()


def build_raises():
    raise FileNotFoundError("no weights at /nowhere/model.safetensors")


def build_from_config():
    with open("toy/config.txt") as f:  # relative to the checkout's root, as when the user runs the engine there
        assert f.read().strip() == "hidden = 100"
    return Engine()


def build_writes():
    open("weights.cache", "w").write("x")


def build_online():
    import socket
    socket.getaddrinfo("huggingface.co", 443)


def build_idle():
    return Idle()


def build_none():
    return None
'''


def toy(root: Path) -> Path:
    return write_tree(root, {"toy/__init__.py": "", "toy/ops/__init__.py": "", "toy/ops/add.py": ADD,
                            "toy/ops/scale.py": SCALE, "toy/engine.py": ENGINE})


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
            for p in sorted(root.rglob("*"))}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # discovery records go here, never the checkout


@pytest.fixture(scope="module")
def discovered(tmp_path_factory):
    """init on the toy checkout whose autokernel.toml names only the engine (with a comment of the user's)."""
    root = toy(tmp_path_factory.mktemp("toy"))
    (root / decl.NAME).write_text('# my engine\n[engine]\nbuild = "toy.engine:build"\n')
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(root.parent / "cache")
    try:
        assert init_command(root, None, False, None) == 0
    finally:
        os.environ.pop("XDG_CACHE_HOME") if old is None else os.environ.__setitem__("XDG_CACHE_HOME", old)
    return root


def test_discovery_finds_each_kernel_and_its_launcher(discovered):
    data = tomllib.loads((discovered / decl.NAME).read_text())
    assert data["engine"] == {"build": "toy.engine:build"}
    assert data["ops"] == {
        "add": {"file": "toy/ops/add.py", "launchers": ["add"], "reference": "TODO", "protected": False},
        "scale": {"file": "toy/ops/scale.py", "launchers": ["scale"], "reference": "TODO", "protected": False}}


def test_the_declaration_keeps_the_users_lines_and_says_what_was_seen(discovered):
    text = (discovered / decl.NAME).read_text()
    assert text.startswith('# my engine\n[engine]\nbuild = "toy.engine:build"\n\n[ops.')
    assert "# _add_kernel (line 7): 3 launches from toy/ops/add.py:add, line 16" in text
    assert "# _scale_kernel (line 8): 1 launch from toy/ops/scale.py:scale, line 19" in text
    assert "x_ptr float32 (100,) · y_ptr float32 (100,) · out_ptr float32 (100,) · n=100 · BLOCK=64" in text
    assert "with the signature add(x, y)" in text and "with the signature scale(x, alpha)" in text
    assert "alpha=0.5" in text and "BLOCK=32" in text  # the float argument as passed; autotune pinned to config 1
    assert "production runs besides the workload's (bfloat16, float32)" in text  # add: the engine's bf16 call too
    assert "production runs besides the workload's (float32)" in text  # scale
    d = decl.load(discovered)  # what init wrote reads back as a declaration
    assert sorted(d.ops) == ["add", "scale"]
    assert all(op.reference == decl.TODO for op in d.ops.values())


def test_a_second_init_refuses_to_overwrite_the_ops(discovered):
    before = snapshot(discovered)
    with pytest.raises(UserError, match=r"already declares 2 op\(s\) \(.*\).*rerun with --force"):
        init_command(discovered, None, False, None)
    assert snapshot(discovered) == before


def write_decl(root: Path, text: str) -> None:
    (root / decl.NAME).write_text(textwrap.dedent(text))


def _no_engine(root):
    pass


def _bad_entry(root):
    write_decl(root, '[engine]\nbuild = "toy.engine.build"\n')


def _outside(root):
    write_decl(root, '[engine]\nbuild = "json.decoder:JSONDecoder"\n')


def _symlinked_engine(root, tmp_path):
    outside = tmp_path / "elsewhere.py"
    outside.write_text("def build(): pass\n")
    (root / "toy" / "linked.py").symlink_to(outside)
    write_decl(root, '[engine]\nbuild = "toy.linked:build"\n')


def _symlinked_declaration(root, tmp_path):
    (tmp_path / "secret.toml").write_text('[engine]\nbuild = "toy.engine:build"\n')
    (root / decl.NAME).symlink_to(tmp_path / "secret.toml")


def _op_file_outside(root):
    write_decl(root, '[engine]\nbuild = "toy.engine:build"\n[ops.add]\nfile = "../add.py"\nlaunchers = ["add"]\n')


def _not_toml(root):
    write_decl(root, "[engine\nbuild = 1\n")


BAD = {  # case -> (set-up, what the one-line message must name)
    "no engine entry": (_no_engine, r"no engine entry: write \[engine\] build = .* or pass --engine"),
    "entry without a function": (_bad_entry, r'\[engine\] build: expected "package.module:function"'),
    "engine outside the checkout": (_outside, r"module 'json.decoder' is not a file of the checkout"),
    "engine module is a symlink": (_symlinked_engine, r"toy/linked.py is a symlink"),
    "declaration is a symlink": (_symlinked_declaration, r"autokernel.toml is a symlink"),
    "op file outside the checkout": (_op_file_outside, r"\[ops.add\] file: .*outside the checkout"),
    "not TOML": (_not_toml, r"autokernel.toml: not valid TOML"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_exit_2_and_nothing_written(case, tmp_path):
    setup, message = BAD[case]
    root = toy(tmp_path / "ck")
    setup(*(root, tmp_path)[:setup.__code__.co_argcount])
    before = snapshot(root)
    with pytest.raises(UserError, match=message) as e:
        init_command(root, None, False, None)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert snapshot(root) == before
    assert not (tmp_path / "cache").exists()  # refused before anything ran


def test_engine_flag_conflicting_with_the_declaration(tmp_path):
    root = toy(tmp_path / "ck")
    write_decl(root, '[engine]\nbuild = "toy.engine:build"\n')
    with pytest.raises(UserError, match=r'set \[engine\] build = "toy.engine:build_idle" there'):
        init_command(root, "toy.engine:build_idle", False, None)


def test_a_kernel_launched_only_from_another_file_is_named_in_a_warning(tmp_path, capsys):
    """vLLM style, the kernel in one file and its launcher in another: init wrote `launchers = ["TODO"]` and said
    only "next: set each reference"; why is now a warning line, naming where the kernel is launched from."""
    root = toy(tmp_path / "ck")
    (root / "toy/api.py").write_text("import torch\nimport triton\nfrom toy.ops.add import _add_kernel\n\n\n"
                                     "def add(x, y):\n    out = torch.empty_like(x)\n"
                                     "    _add_kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), BLOCK=64)\n"
                                     "    return out\n")
    engine = root / "toy/engine.py"
    engine.write_text(engine.read_text().replace("from toy.ops.add import add", "from toy.api import add"))
    assert init_command(root, "toy.engine:build", False, None) == 0
    err = capsys.readouterr().err
    assert "warning: [ops.add] has no launcher in toy/ops/add.py (its kernels are launched from toy/api.py:add)" \
        in err, err
    assert 'launchers = ["TODO"]' in (root / decl.NAME).read_text()


def test_the_engine_runs_from_the_checkouts_root_and_the_sandbox_is_named_in_its_errors(tmp_path):
    """A user's engine reading its config by a path relative to the repository root got a bare FileNotFoundError
    (the sandbox's scratch directory was its working directory); one writing there, or reaching the network, got an
    error that did not say the sandbox was why."""
    root = toy(tmp_path / "ck")
    (root / "toy" / "config.txt").write_text("hidden = 100\n")
    assert init_command(root, "toy.engine:build_from_config", False, None) == 0
    (root / decl.NAME).unlink()
    for entry, hint in (("build_writes", "the checkout is read-only in the sandbox"),
                        ("build_online", "the sandbox has no network")):
        with pytest.raises(UserError, match=hint):
            init_command(root, f"toy.engine:{entry}", False, None)


@pytest.mark.parametrize("entry, message", [
    ("toy.engine:build_raises", r"engine toy.engine:build_raises\(\) raised: FileNotFoundError: no weights at "
                                r"/nowhere/model.safetensors \(at toy/engine.py:\d+\); fix the engine and rerun"),
    ("toy.engine:build_none", r"engine toy.engine:build_none\(\): returned a NoneType without a workload\(\) "
                              r"method"),
    ("toy.engine:build_idle", r"its workload\(\) launched no Triton kernel"),
])
def test_an_engine_that_raises_or_launches_nothing(entry, message, tmp_path):
    root = toy(tmp_path / "ck")
    before = snapshot(root)
    with pytest.raises(UserError, match=message) as e:
        init_command(root, entry, False, None)
    assert "\n" not in str(e.value)
    assert snapshot(root) == before


def test_the_command_line_says_it_in_one_line_and_exits_2(tmp_path):
    """Through the installed console script: exit 2, one line on stderr, nothing written."""
    root = toy(tmp_path / "ck")
    before = snapshot(root)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "AUTOKERNEL_CONFIG": ""}
    r = subprocess.run(CLI + ["init", "--repo", str(root), "--engine", "toy.engine:build_raises"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("autokernel: error: engine toy.engine:build_raises() raised: FileNotFoundError")
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert snapshot(root) == before


def test_forged_launch_records_are_dropped(tmp_path):
    """The records come from the engine's process: a file outside the checkout, a path that climbs out, a name that
    is not an identifier or a missing count never reach the declaration."""
    root = toy(tmp_path / "ck")
    site = {"file": "toy/ops/add.py", "function": "add", "def_line": 14, "line": 16, "params": ["x", "y"]}
    good = {"kernel": "_add_kernel", "kernel_file": "toy/ops/add.py", "kernel_in_checkout": True, "kernel_line": 7,
            "site": site, "calls": 3, "seconds": 0.5, "grids": [[2]], "lines": [16],
            "signatures": [[["x_ptr", ["tensor", "float32", [100], [1]]], ["n", ["int", 100]]]],
            "signature_calls": [3]}
    assert discover._launch(good, root).in_checkout
    for forged in ({"kernel_file": "/etc/passwd.py"}, {"kernel_file": "../outside.py"},
                   {"kernel_file": "toy/ops/missing.py"}):
        x = discover._launch({**good, **forged}, root)
        assert x is not None and not x.in_checkout  # shown as "not in the checkout", never declared
        assert discover.group([x]) == []
    for broken in ({"kernel": "a\nb"}, {"kernel": "x; rm -rf"}, {"calls": 0}, {"calls": "3"}):
        assert discover._launch({**good, **broken}, root) is None
    x = discover._launch({**good, "site": {**site, "file": "../../x.py"}}, root)
    assert x.site is None  # a site outside the checkout is no launcher
    x = discover._launch({**good, "signatures": [[["x\n", ["tensor", "float32", [1], [1]]]]]}, root)
    assert x.signatures == []
    x = discover._launch({**good, "grids": {"a": 1}, "signatures": 7, "signature_calls": "3"}, root)
    assert x.grids == [] and x.signatures == []  # a field of another type is no field, never a traceback


def test_a_job_result_of_the_wrong_shape_is_one_line(tmp_path, monkeypatch):
    """The engine can rewrite any object of its job (here autokernel.interp.pinned, to return a list): discovery
    failed on `.items()` with a traceback. Every field of the job's result is checked for its type."""
    from autokernel import sandbox
    from autokernel.errors import UserError
    from autokernel.policy import Policy
    root = toy(tmp_path / "ck")
    site = {"file": "toy/ops/add.py", "function": "add", "def_line": 14, "line": 16, "params": ["x", "y"]}
    launch = {"kernel": "_add_kernel", "kernel_file": "toy/ops/add.py", "kernel_in_checkout": True, "kernel_line": 7,
              "site": site, "calls": 3, "seconds": 0.5, "grids": [[2]], "lines": [16]}
    data = {"logits_shape": [len(discover.PROBE_IDS), 8], "launches": [launch], "pinned": ["x"],
            "launcher_calls": {"a": 1}, "build_s": "1"}
    monkeypatch.setattr(sandbox, "run", lambda *a, **k: sandbox.SandboxResult(True, None, "", data))
    found = discover.run(root, "toy.engine:build", Policy(), tmp_path / "job")
    assert found.pinned == {} and found.launcher_calls == [] and len(found.launches) == 1
    monkeypatch.setattr(sandbox, "run", lambda *a, **k: sandbox.SandboxResult(True, None, "", ["not", "a", "dict"]))
    with pytest.raises(UserError, match="logits"):
        discover.run(root, "toy.engine:build", Policy(), tmp_path / "job2")


# --- the Liger example: examples/liger/make_checkout.sh, then `autokernel init` on it -------------------------------

HAVE_LIGER = all(importlib.util.find_spec(m) is not None for m in ("liger_kernel", "transformers"))


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_LIGER, reason="liger-kernel and transformers are not installed: "
                                           "pip install --no-deps liger-kernel transformers regex safetensors "
                                           "(pyproject's [liger] extra)")
def test_liger_checkout_init_finds_rms_norm_rope_swiglu(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    ck = tmp_path / "llama_liger"
    env = {**os.environ, "PYTHON": sys.executable, "XDG_CACHE_HOME": str(tmp_path / "cache"), "AUTOKERNEL_CONFIG": ""}
    r = subprocess.run(["bash", str(ROOT / "examples/liger/make_checkout.sh"), str(ck)], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(CLI + ["init", "--repo", str(ck)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    data = tomllib.loads((ck / decl.NAME).read_text())
    ops = {name: (spec["file"], spec["launchers"]) for name, spec in data["ops"].items()}
    assert ops == {"rms_norm": ("llama_liger/ops/rms_norm.py", ["rms_norm_forward"]),
                   "rope": ("llama_liger/ops/rope.py", ["rope_forward"]),
                   "swiglu": ("llama_liger/ops/swiglu.py", ["swiglu_forward"])}
    # 2 prompts x 3 forwards (prefill + 2 decode steps) x 2 layers: 5 norms, 2 ropes, 2 swiglus per forward
    text = (ck / decl.NAME).read_text()
    for needle in ("_rms_norm_forward_kernel (line 67): 30 launches", "_triton_rope (line 6): 12 launches",
                   "_swiglu_forward_kernel (line 57): 12 launches",
                   "rms_norm_forward(X, W, eps, offset, casting_mode, row_mode)"):
        assert needle in text, text
    # The completed example declaration names the same files and launchers init found
    done = tomllib.loads((ROOT / "examples/liger/autokernel.toml").read_text())
    assert {n: (s["file"], s["launchers"]) for n, s in done["ops"].items()} == ops
    # ... and its references agree with Liger's launchers (under the interpreter, in a process of their own)
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("liger_references.py")), str(ck)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "references agree" in r.stdout, r.stdout + r.stderr
