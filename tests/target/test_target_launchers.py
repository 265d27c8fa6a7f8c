"""A target op whose file has several launchers (autokernel/target/gate.py): a candidate replaces the whole file, so
the gate judges every launcher the engine calls, each against its own reference, and refuses to vouch for a file
whose kernels the workload launches by a way it does not call.

The toy checkout: one file with two launchers the engine calls in turn, `norm` (a row rmsnorm without weight) and
`scale` (y = x * s). A candidate wrong only in `scale` is the class: the gate used to call the first launcher only.
"""
import textwrap
from pathlib import Path

import pytest
from test_target_gate import ENGINE as NORM_ENGINE
from test_target_gate import NORM
from test_target_gate import REFERENCE as NORM_REFERENCE
from toy_checkout import write_tree

from autokernel.cli.verify import verify_command
from autokernel.policy import Policy
from autokernel.target import declaration as decl
from autokernel.target import gate as target_gate

# The norm toy of tests/target/test_target_gate.py (its file, reference and engine), with a second launcher `scale`
SCALE = '''


@triton.jit
def _scale_kernel(x_ptr, y_ptr, s, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < numel
    x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x * s).to(y_ptr.dtype.element_ty), mask=m)


def scale(x, s):
    x = x.contiguous()
    y = torch.empty_like(x)
    _scale_kernel[(triton.cdiv(x.numel(), 64),)](x, y, s, x.numel(), BLOCK=64)
    return y
'''
OPS = NORM + SCALE
REFERENCE = NORM_REFERENCE + '''

def scale(x, s):
    return x * s
'''
LOGITS = ("norm(self.emb[torch.tensor(row)], 1e-5)[-1]", "scale(norm(self.emb[torch.tensor(row)], 1e-5), 0.5)[-1]")
assert "from toyt.ops.norm import norm" in NORM_ENGINE and LOGITS[0] in NORM_ENGINE
ENGINE = NORM_ENGINE.replace("from toyt.ops.norm import norm", "from toyl.ops.pair import norm, scale") \
    .replace(*LOGITS)
BOTH = '''
[engine]
build = "toyl.engine:build"

[ops.pair]
file = "toyl/ops/pair.py"
launchers = ["norm", "scale"]
reference = { norm = "toyl.reference:norm", scale = "toyl.reference:scale" }
'''
FIRST_ONLY = '''
[engine]
build = "toyl.engine:build"

[ops.pair]
file = "toyl/ops/pair.py"
launchers = ["norm"]
reference = "toyl.reference:norm"
'''


def checkout(root: Path, declaration: str) -> Path:
    return write_tree(root, {"toyl/__init__.py": "", "toyl/ops/__init__.py": "", "toyl/ops/pair.py": OPS,
                            "toyl/reference.py": REFERENCE, "toyl/engine.py": ENGINE, decl.NAME: declaration})


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def candidate(tmp_path: Path, old: str, new: str) -> Path:
    assert old in OPS
    path = tmp_path / "pair.py"
    path.write_text(textwrap.dedent(OPS.replace(old, new)))
    return path


WRONG_SCALE = ("tl.store(y_ptr + offs, (x * s)", "tl.store(y_ptr + offs, (x * 0.5)")  # exact at production's s only


def test_every_declared_launcher_is_judged(tmp_path):
    """A candidate wrong only in the second launcher passes the first's stages and is rejected at the second's, its
    stage naming that launcher (without the loop over launchers only `norm` was called, and it was accepted)."""
    root = checkout(tmp_path / "co", BOTH)
    policy = Policy.model_validate({"gate": {"max_rows": 1024}})  # the calls past the CPU cap prove nothing here
    v = target_gate.verify(root, "pair", candidate(tmp_path, *WRONG_SCALE), policy=policy, seed=7, stages=[])
    assert [(s.name, s.metrics.get("launcher"), s.passed) for s in v.stages] == [
        ("static", "norm", True), ("runtime", "norm", True), ("numeric", "norm", True),
        ("static", "scale", True), ("runtime", "scale", True), ("numeric", "scale", False)], \
        [(s.name, s.detail) for s in v.stages]
    assert v.failure.reason == "numeric.mismatch" and v.failure.detail.startswith("scale: "), v.failure.detail


def test_a_file_whose_other_launcher_is_undeclared_is_refused(tmp_path, capsys):
    """Declaring `norm` alone while the workload also runs `scale` from the same file: a candidate's `scale` would go
    unchecked, so verify refuses (exit 2, one line naming the launcher to add) instead of accepting WRONG_SCALE."""
    root = checkout(tmp_path / "co", FIRST_ONLY)
    assert verify_command("pair", candidate(tmp_path, *WRONG_SCALE), repo=root) == 2
    err = capsys.readouterr().err
    assert "add scale to launchers" in err and len(err.strip().splitlines()) == 1, err


def test_a_kernel_of_the_file_launched_from_outside_it_is_refused(tmp_path, capsys):
    """The engine launches the file's _scale_kernel itself: the gate reaches kernels only through the file's
    launchers, so it cannot vouch for that launch."""
    root = checkout(tmp_path / "co", FIRST_ONLY)
    engine = root / "toyl/engine.py"
    engine.write_text(engine.read_text().replace("from toyl.ops.pair import norm, scale", textwrap.dedent('''\
        import triton

        from toyl.ops.pair import _scale_kernel, norm


        def scale(x, s):
            y = torch.empty_like(x)
            _scale_kernel[(triton.cdiv(x.numel(), 64),)](x, y, s, x.numel(), BLOCK=64)
            return y''')))
    assert verify_command("pair", root / "toyl/ops/pair.py", repo=root) == 2
    err = capsys.readouterr().err
    assert "_scale_kernel of toyl/ops/pair.py from toyl/engine.py:scale" in err, err


@pytest.mark.parametrize("declaration,expect", [
    (BOTH.replace('reference = { norm = "toyl.reference:norm", scale = "toyl.reference:scale" }',
                  'reference = "toyl.reference:norm"'), "give one per launcher"),
    (BOTH.replace(', scale = "toyl.reference:scale"', ""), "no entry for the launcher scale"),
    (BOTH.replace('scale = "toyl.reference:scale"', 'other = "toyl.reference:scale"'), "'other' is not one of"),
    (BOTH + 'outputs = { scale = "all" }\n', "outputs scale: a list of indices"),
])
def test_per_launcher_fields_are_checked(tmp_path, declaration, expect):
    root = checkout(tmp_path / "co", declaration)
    with pytest.raises(Exception) as e:
        decl.load(root)
    assert type(e.value).__name__ == "UserError" and expect in str(e.value), str(e.value)


def test_per_launcher_outputs_and_todo(tmp_path):
    root = checkout(tmp_path / "co", BOTH.replace('scale = "toyl.reference:scale"', 'scale = "TODO"')
                    + "outputs = { scale = [0] }\n")
    op = decl.load(root).ops["pair"]
    assert op.outputs == {"scale": [0]} and op.incomplete == ["scale"]
    with pytest.raises(Exception, match='reference of scale is still "TODO"'):
        target_gate.declared_op(root, "pair")


DELEGATING = OPS.replace('''    _scale_kernel[(triton.cdiv(x.numel(), 64),)](x, y, s, x.numel(), BLOCK=64)
    return y
''', '''    _scale_launch(x, y, s)
    return y


def _scale_launch(x, y, s):
    _scale_kernel[(triton.cdiv(x.numel(), 64),)](x, y, s, x.numel(), BLOCK=64)
''')


def test_a_launch_inside_a_declared_launcher_is_reached(tmp_path):
    """`scale` delegates its launch to a helper of the file: the launch happens inside the declared launcher the
    gate calls, so it is reached (recorded `via` it) and nothing is refused; with `scale` undeclared the helper's
    launch is outside every declared launcher and refused, naming the helper."""
    assert DELEGATING != OPS
    root = checkout(tmp_path / "co", BOTH)
    (root / "toyl/ops/pair.py").write_text(textwrap.dedent(DELEGATING))
    d = decl.load(root)
    calls = target_gate.record(root, d, d.ops["pair"], Policy(), tmp_path / "w")
    assert sorted(calls) == ["norm", "scale"] and calls["scale"].calls == 3
    root = checkout(tmp_path / "co1", FIRST_ONLY)
    (root / "toyl/ops/pair.py").write_text(textwrap.dedent(DELEGATING))
    d = decl.load(root)
    with pytest.raises(Exception, match="launches _scale_kernel from _scale_launch") as e:
        target_gate.record(root, d, d.ops["pair"], Policy(), tmp_path / "w1")
    assert type(e.value).__name__ == "UserError"


DECORATED = OPS.replace("\ndef scale(x, s):", "\n@torch.inference_mode()\ndef scale(x, s):")
RETUNED = ("BLOCK=64)", "BLOCK=128)")  # an honest launch-knob change in `scale`


def _static(tmp_path: Path, incumbent: str, cand: str):
    from autokernel.gate import static
    inc = tmp_path / "inc" / "pair.py"
    inc.parent.mkdir(exist_ok=True)
    inc.write_text(textwrap.dedent(incumbent))
    return static.check_source(textwrap.dedent(cand).encode(), "scale", inc, relative=True)


@pytest.mark.parametrize("cand,passes", [
    (DECORATED.replace(*RETUNED), True),  # the incumbent's own decorator, verbatim, on a retuned launcher
    (DECORATED.replace(*RETUNED).replace("@torch.inference_mode()\n", "@torch.inference_mode(False)\n"), False),
    (DECORATED.replace(*RETUNED).replace("@torch.inference_mode()\n", "@torch.no_grad()\n"), False),
    (DECORATED.replace("@torch.inference_mode()\n", "").replace("\ndef norm(", "\n@torch.inference_mode()\ndef norm("),
     False),  # moved to the other launcher
    (DECORATED.replace("@torch.inference_mode()\n", "@torch.inference_mode()\n@torch.inference_mode()\n"), False),
])
def test_a_launchers_decorators_are_the_incumbents_verbatim(tmp_path, cand, passes):
    """vLLM decorates launchers (`@torch.inference_mode()` on its prefix-prefill attention): any rewrite of such a
    file was refused, the whole decorated def being one finding the incumbent excused only unchanged. Each decorator
    is now its own finding, keyed on the launcher and the expression: kept verbatim on the same launcher it is
    excused, and nothing else is (another argument, another decorator, another launcher, one more)."""
    assert cand != DECORATED
    r = _static(tmp_path, DECORATED, cand)
    assert r.passed == passes, r.detail
    if not passes:
        assert r.reason == "static.signature" and "is decorated" in r.detail, r.detail


def test_a_decorated_launcher_is_still_refused_in_autokernels_own_kernels(tmp_path):
    """The embedded ops' grammar is unchanged: a launcher is a plain function (no incumbent to excuse it)."""
    from autokernel.gate import static
    inc = tmp_path / "pair.py"
    inc.write_text(textwrap.dedent(OPS))
    found = static.find(textwrap.dedent(DECORATED).encode(), "scale", inc, relative=False)
    assert "the launcher scale is decorated; it must be a plain function" in [f.detail for f in found], found


def test_a_retuned_decorated_launcher_is_gated_whole(tmp_path):
    """End to end on the toy: the retuned decorated `scale` passes every launcher's stages; the same file wrong in
    `scale` is still judged (and rejected) there: the decorator does not take the launcher out of the gate."""
    root = checkout(tmp_path / "co", BOTH)
    (root / "toyl/ops/pair.py").write_text(textwrap.dedent(DECORATED))
    policy = Policy.model_validate({"gate": {"max_rows": 1024}})
    good = tmp_path / "good.py"
    good.write_text(textwrap.dedent(DECORATED.replace(*RETUNED).replace("x.numel(), 64)", "x.numel(), 128)")))
    v = target_gate.verify(root, "pair", good, policy=policy, seed=7, stages=[])
    assert v.accepted, (v.reason, v.detail)
    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent(DECORATED.replace(*WRONG_SCALE)))
    v = target_gate.verify(root, "pair", bad, policy=policy, seed=7, stages=[])
    assert v.failure.reason == "numeric.mismatch" and v.failure.detail.startswith("scale: "), v.failure.detail
