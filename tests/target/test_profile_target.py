"""`autokernel profile --repo` / `autokernel rank --repo` on a target checkout (autokernel/target/profile_target.py,
rank_target.py): a toy checkout (three Triton kernels under the interpreter in the sandbox: one declared op, one
protected, one not declared), its bad input (one line, exit 2, nothing written into the checkout), a forged trace,
and the Liger example end to end (examples/liger/make_checkout.sh + its completed declaration)."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from toy_checkout import write_tree

from autokernel.errors import UserError
from autokernel.policy import for_checkout
from autokernel.target import declaration as decl
from autokernel.target import launches, profile_target, rank_target

ROOT = Path(__file__).resolve().parents[2]
CLI = [str(Path(sys.executable).parent / "autokernel")]

KERNEL = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _{name}_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) {op} tl.load(y_ptr + offs, mask=m), mask=m)


def {name}(x, y, out):
    """Writes x {op} y into `out` (in place) and returns it."""
    _{name}_kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), BLOCK=64)
    return out


def {name}_unused(x, y, out):
    return {name}(x, y, out)
'''
ENGINE = '''
import torch

from toy.ops.add import add
from toy.ops.mul import mul
from toy.ops.sub import sub


class Engine:
    def workload(self):
        x = torch.arange(100, dtype=torch.float32)
        for _ in range(3):
            x = add(x, x, torch.empty_like(x))
        y = mul(x[:10], x[:10], torch.empty(10))
        z = sub(y, y, torch.empty(10))
        assert torch.equal(z, torch.zeros(10)), "the toy kernels are wrong"

    def logits(self, ids):
        return torch.zeros(len(ids), 8)


def build():
    return Engine()


def build_raises():
    raise FileNotFoundError("no weights at /nowhere/model.safetensors")
'''
DECL = '''
[engine]
build = "toy.engine:build"

[ops.add]
file = "toy/ops/add.py"
launchers = ["add"]

[ops.mul]
file = "toy/ops/mul.py"
launchers = ["mul", "mul_unused"]
protected = true
'''


def toy(root: Path, declaration: str = DECL) -> Path:
    files = {"toy/__init__.py": "", "toy/ops/__init__.py": "", "toy/engine.py": ENGINE, decl.NAME: declaration}
    for name, op in (("add", "+"), ("mul", "*"), ("sub", "-")):
        files[f"toy/ops/{name}.py"] = KERNEL.format(name=name, op=op)
    return write_tree(root, files)


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
            for p in sorted(root.rglob("*"))}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the sandbox job's log goes here, never the checkout


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """(checkout, run directory, warnings) of one profile of the toy checkout."""
    root = toy(tmp_path_factory.mktemp("toy"))
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(root.parent / "cache")
    try:
        run_dir, warnings = profile_target.profile(root, for_checkout(root, uses=("sandbox", "ops")))
    finally:
        os.environ.pop("XDG_CACHE_HOME") if old is None else os.environ.__setitem__("XDG_CACHE_HOME", old)
    return root, run_dir, warnings


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_launches_map_to_the_declared_ops_by_kernel_file(profiled):
    root, run_dir, _ = profiled
    assert run_dir.parent == root / "traces"
    t = summary(run_dir)
    assert t["schema"] == 1 and t["target"]["build"] == "toy.engine:build" and t["target"]["interpreted"] is True
    assert t["timing"]["label"] == "CPU / Triton interpreter"
    assert set(t["ops"]) == {"add", "mul"}
    add, mul = t["ops"]["add"], t["ops"]["mul"]
    assert (add["calls"], add["status"], mul["calls"], mul["status"]) == (3, "target", 1, "protected")
    assert [k["kernel"] for k in add["kernels"]] == ["_add_kernel"]
    assert add["sites"]["toy/ops/add.py:add"]["calls"] == 3
    assert [(x["kernel"], x["kernel_file"], x["calls"]) for x in t["not_declared"]] == [("_sub_kernel",
                                                                                          "toy/ops/sub.py", 1)]
    shares = add["share"] + mul["share"] + t["not_declared"][0]["share"]
    assert shares == pytest.approx(1.0)
    assert t["totals"]["calls"] == 5


def test_the_launcher_records_are_in_the_trace_as_plain_json(profiled):
    """What `autokernel verify --trace` builds a target's cases from: discover.LauncherCalls per op."""
    t = summary(profiled[1])
    (rec,) = t["ops"]["add"]["launcher_calls"]
    assert (rec["file"], rec["launcher"], rec["calls"], rec["written"]) == ("toy/ops/add.py", "add", 3, ["out"])
    assert rec["signatures"] == [[["x", ["tensor", "float32", [100], [1]]], ["y", ["tensor", "float32", [100], [1]]],
                                  ["out", ["tensor", "float32", [100], [1]]]]]
    assert rec["signature_calls"] == [3]
    assert rec["returns"] == [["tensor", "float32", [100], [1]]]
    (shape,) = t["ops"]["add"]["shapes"]
    assert shape["sizes"] == {"x": [100], "y": [100], "out": [100]} and shape["calls"] == 3
    assert [r["launcher"] for r in t["ops"]["mul"]["launcher_calls"]] == ["mul"]
    assert t["ops"]["mul"]["shapes"][0]["sizes"]["x"] == [10]


def test_a_protected_ops_uncalled_launcher_is_a_warning(profiled):
    assert profiled[2] == ["[ops.mul] (protected) launcher mul_unused was never called by the workload"]


def test_rank_ranks_the_declared_ops_by_time_share(profiled):
    root = profiled[0]
    env = {**os.environ, "AUTOKERNEL_CONFIG": ""}
    r = subprocess.run(CLI + ["rank", "--repo", str(root), "--json"], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["ranking"] == "time share alone"
    assert [x["op"] for x in doc["targets"]] == ["add"] and [x["op"] for x in doc["excluded"]] == ["mul"]
    assert doc["excluded"][0]["status"] == "protected"
    assert [x["kernel"] for x in doc["not_declared"]] == ["_sub_kernel"]
    run_dir = profiled[1]  # a target's trace passed as TRACE, from elsewhere: ranked the same way
    r = subprocess.run(CLI + ["rank", str(run_dir), "--json"], capture_output=True, text=True, timeout=120, env=env,
                       cwd=ROOT.parent)
    assert r.returncode == 0 and json.loads(r.stdout)["ranking"] == "time share alone", r.stdout + r.stderr
    r = subprocess.run(CLI + ["rank", "--repo", str(root), "--op", "add"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    out = " ".join(r.stdout.split())
    for needle in ("CPU / Triton interpreter", "interpreter ms", "ranked by time share alone", "mul (protected)",
                   "(not declared)", "_sub_kernel", "x float32 (100,) ×3", "add: the layouts"):
        assert needle in out, r.stdout


def test_a_forged_trace_in_the_checkout_is_shown_as_text(profiled, tmp_path):
    """traces/ of an untrusted checkout: a kernel name carrying rich markup is printed literally, not parsed."""
    root = shutil.copytree(profiled[0], tmp_path / "ck", symlinks=True)
    run = next((root / "traces").iterdir())
    t = summary(run)
    t["not_declared"][0]["kernel"] = "[/][bold green]ACCEPTED"
    (run / "summary.json").write_text(json.dumps(t))
    r = subprocess.run(CLI + ["rank", "--repo", str(root)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "AUTOKERNEL_CONFIG": "", "COLUMNS": "400"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[/][bold green]ACCEPTED" in r.stdout
    t["ops"]["add"]["share"] = "most"  # a field of the wrong type: one line, exit 2, no traceback
    (run / "summary.json").write_text(json.dumps(t))
    r = subprocess.run(CLI + ["rank", "--repo", str(root)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "AUTOKERNEL_CONFIG": ""})
    assert r.returncode == 2 and "malformed target trace" in r.stderr, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_trace_symlinked_out_of_the_checkout_is_refused(profiled, tmp_path):
    root = shutil.copytree(profiled[0], tmp_path / "ck", symlinks=True)
    run = next((root / "traces").iterdir())
    outside = tmp_path / "forged.json"
    shutil.move(run / "summary.json", outside)
    (run / "summary.json").symlink_to(outside)
    with pytest.raises(UserError, match="resolves to a file outside the checkout"):
        rank_target.load(root)


def _missing_file(root, tmp_path):
    (root / decl.NAME).write_text(DECL.replace('file = "toy/ops/add.py"', 'file = "toy/ops/gone.py"'))


def _uncalled_launcher(root, tmp_path):
    (root / decl.NAME).write_text(DECL.replace('launchers = ["add"]', 'launchers = ["add", "add_unused"]'))


def _engine_raises(root, tmp_path):
    (root / decl.NAME).write_text(DECL.replace("toy.engine:build", "toy.engine:build_raises"))


def _no_declaration(root, tmp_path):
    (root / decl.NAME).unlink()


def _no_ops(root, tmp_path):
    (root / decl.NAME).write_text('[engine]\nbuild = "toy.engine:build"\n')


def _no_engine(root, tmp_path):
    (root / decl.NAME).write_text(DECL.replace('[engine]\nbuild = "toy.engine:build"\n', ""))


def _one_file_two_ops(root, tmp_path):
    (root / decl.NAME).write_text(DECL + '[ops.add2]\nfile = "toy/ops/add.py"\nlaunchers = ["add_unused"]\n')


def _traces_symlink(root, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (root / "traces").symlink_to(tmp_path / "elsewhere")


BAD = {  # case -> (set-up, what the one-line message must name, whether it ran the engine)
    "op file missing": (_missing_file, r"\[ops.add\] file: .*toy/ops/gone.py: no such file", False),
    "launcher never called": (_uncalled_launcher, r"\[ops.add\] launchers: add_unused \(toy/ops/add.py\) was never "
                                                  r"called by the workload of toy.engine:build; .*drop it from "
                                                  r"launchers", True),
    "engine raises": (_engine_raises, r"engine toy.engine:build_raises\(\) raised: FileNotFoundError: no weights at "
                                      r"/nowhere/model.safetensors \(at toy/engine.py:\d+\); fix the engine", True),
    "no declaration": (_no_declaration, r"no declaration: run `autokernel init --repo .*` first", False),
    "no ops": (_no_ops, r"declares no ops: run `autokernel init --repo", False),
    "no engine": (_no_engine, r"no engine entry: write \[engine\] build", False),
    "two ops, one file": (_one_file_two_ops, r"\[ops.add\] and \[ops.add2\] both declare file = 'toy/ops/add.py'; "
                                             r"one op per kernel file", False),
    "traces/ is a symlink": (_traces_symlink, r"traces: refused: the checkout's traces/ is a symlink", False),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_exit_2_and_nothing_written(case, tmp_path):
    setup, message, ran = BAD[case]
    root = toy(tmp_path / "ck")
    setup(root, tmp_path)
    before = snapshot(root)
    with pytest.raises(UserError, match=message) as e:
        profile_target.profile(root, for_checkout(root, uses=("sandbox", "ops")))
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert snapshot(root) == before
    assert not (tmp_path / "elsewhere").exists() or not any((tmp_path / "elsewhere").iterdir())
    assert (tmp_path / "cache").exists() == ran  # refused before the engine ran, unless the run found it


def test_the_command_line_says_it_in_one_line_and_exits_2(tmp_path):
    """Through the console script: an embedded engine's flag with --repo, and a launcher the workload never calls."""
    root = toy(tmp_path / "ck")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "AUTOKERNEL_CONFIG": ""}
    r = subprocess.run(CLI + ["profile", "--repo", str(root), "--workload", "w.yaml"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 2 and r.stderr.startswith("autokernel: error: --workload applies to the embedded engine")
    r = subprocess.run(CLI + ["rank", "--repo", str(root), "--plot", str(tmp_path / "p.png")], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 2 and "a target's ops have no FLOP/byte counts" in r.stderr, r.stderr
    _uncalled_launcher(root, tmp_path)
    before = snapshot(root)
    r = subprocess.run(CLI + ["profile", "--repo", str(root)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("autokernel: error: ") and "add_unused" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert snapshot(root) == before


def test_the_launch_hook_synchronises_around_a_compiled_launch(tmp_path):
    """Where kernels compile, launches are asynchronous: the hook times each between two device synchronisations,
    so a share is the kernel's time, not the host's enqueue (the sync is a stand-in here: this machine has no GPU)."""
    events = []
    hook = launches.LaunchHook(str(tmp_path))
    hook.sync = lambda: events.append("sync")
    run = hook.wrap(lambda kernel, *args, grid, warmup, **kw: events.append("launch"))
    hook.active = True
    run(object(), grid=(1,), warmup=False)
    assert events == ["sync", "launch", "sync"]
    assert sum(g["calls"] for g in hook.groups.values()) == 1


# --- the Liger example: make_checkout.sh, the completed declaration, then profile and rank -------------------------

HAVE_LIGER = all(importlib.util.find_spec(m) is not None for m in ("liger_kernel", "transformers"))


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_LIGER, reason="liger-kernel and transformers are not installed: "
                                           "pip install --no-deps liger-kernel transformers regex safetensors "
                                           "(pyproject's [liger] extra)")
def test_liger_checkout_profile_and_rank(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    ck = tmp_path / "llama_liger"
    env = {**os.environ, "PYTHON": sys.executable, "XDG_CACHE_HOME": str(tmp_path / "cache"), "AUTOKERNEL_CONFIG": ""}
    r = subprocess.run(["bash", str(ROOT / "examples/liger/make_checkout.sh"), str(ck)], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    shutil.copy(ROOT / "examples/liger/autokernel.toml", ck / decl.NAME)
    r = subprocess.run(CLI + ["profile", "--repo", str(ck)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    for needle in ("rms_norm", "rope", "swiglu", "CPU / Triton interpreter", "ranked by expected end-to-end gain",
                   "headroom"):
        assert needle in r.stdout, r.stdout
    r = subprocess.run(CLI + ["rank", "--repo", str(ck), "--json"], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    ops = {x["op"]: x for x in doc["targets"]}
    assert sorted(ops) == ["rms_norm", "rope", "swiglu"] and doc["excluded"] == [] and doc["not_declared"] == []
    assert sum(x["share"] for x in ops.values()) == pytest.approx(1.0)
    # the declared work counts: every layout counted, so each op has its roofline headroom (interpreter times are
    # far above a CPU's roofline)
    assert all(x["gain"] is not None and 0 < x["headroom"] <= 1 for x in ops.values()), ops
    assert {s["flops"] for s in ops["swiglu"]["shapes"]} == {5 * 172 * m for m in (1, 3, 7)}
    # 2 prompts x 3 forwards (prefill + 2 decode steps) x 2 layers: 5 norms, 2 ropes, 2 swiglus per forward
    assert {k: x["calls"] for k, x in ops.items()} == {"rms_norm": 30, "rope": 12, "swiglu": 12}
    assert ops["rms_norm"]["sites"]["llama_liger/ops/rms_norm.py:rms_norm_forward"]["calls"] == 30
    layouts = {tuple(s["sizes"]["X"]): s["calls"] for s in ops["rms_norm"]["shapes"]}
    assert layouts == {(1, 7, 64): 5, (1, 3, 64): 5, (1, 1, 64): 20}  # the prompts' prefills, then decode
    (rope,) = ops["rope"]["launcher_calls"]
    assert rope["written"] == ["q", "k"] and rope["calls"] == 12  # Liger's rope rotates q and k in place
    (swiglu,) = ops["swiglu"]["launcher_calls"]
    assert sorted(tuple(sig[0][1][2]) for sig in swiglu["signatures"]) == [(1, 1, 172), (1, 3, 172), (1, 7, 172)]
    # what the profile wrote into the checkout: its traces/ only
    status = subprocess.run(["git", "-C", str(ck), "status", "--porcelain"], capture_output=True, text=True).stdout
    assert [line.split()[-1] for line in status.splitlines()] == ["autokernel.toml", "traces/"]


def test_how_kernels_ran_is_the_parents_knowledge_not_the_jobs_claim(tmp_path, monkeypatch):
    """The job's data may be forged by the engine (any object of its process): a job that says its kernels were
    compiled, on a machine where the parent ran them through the interpreter, is labelled as interpreted."""
    from autokernel import sandbox
    from autokernel.target import discover
    real = sandbox.run

    def forged(*a, **k):
        res = real(*a, **k)
        if res.ok and isinstance(res.data, dict):
            res.data["interpreted"] = False
        return res
    monkeypatch.setattr(sandbox, "run", forged)
    root = toy(tmp_path / "toy")
    found = discover.run(root, "toy.engine:build", for_checkout(root, uses=("sandbox", "ops")), tmp_path / "job")
    assert found.interpreted is True
