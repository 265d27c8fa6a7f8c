"""A checkout's config files are untrusted input (docs/design.md, trust rule 6), found by the red team:

- B8: autokernel.toml with 100k nested `[` or a policies.yaml 5000 deep crashed the parser with RecursionError (a
  traceback, exit 1): now one line naming the file, exit 2 (autokernel.policy.parse_untrusted);
- B9: `autokernel init` rewrote autokernel.toml with mkstemp's mode 0600: now the replaced file's mode, else 0644;
- B5: an op's `file` reached the commit subject, the PR body and the "Reproduce:" shell line as written
  (`norm Closes #1 cc @torvalds.py`): now its parts are letters, digits, _ . -, shell words are quoted after `--`,
  and the gate's detail is made inert.

Each test fails with its defence removed."""
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from autokernel import policy
from autokernel.errors import UserError
from autokernel.target import declaration as decl
from autokernel.target import init
from autokernel.target.run import message

CLI = [sys.executable, "-c", "from autokernel.cli import main; main()"]


def checkout(root: Path, file: str = "toyt/ops/norm.py", toml: str | None = None) -> Path:
    """A target checkout: an engine module, one op file, and its declaration."""
    (root / "toyt" / "ops").mkdir(parents=True)
    (root / "toyt" / "__init__.py").write_text("")
    (root / "toyt" / "ops" / "__init__.py").write_text("")
    (root / "toyt" / "engine.py").write_text("def build():\n    return None\n")
    (root / file).write_text("def norm(x):\n    return x\n")
    (root / decl.NAME).write_text(toml if toml is not None else textwrap.dedent(f"""\
        [engine]
        build = "toyt.engine:build"

        [ops.norm]
        file = {decl.quote(file)}
        launchers = ["norm"]
        """))
    return root


# --- B8: nesting past the recursion limit is bad input, not a crash -----------------------------------------------

def test_a_deeply_nested_declaration_is_one_line_naming_the_file(tmp_path):
    root = checkout(tmp_path / "t", toml="a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(UserError) as e:
        decl.load(root)
    msg = str(e.value)
    assert msg.startswith(f"{root / decl.NAME}: not valid TOML: nested too deeply") and "\n" not in msg


def test_a_deeply_nested_policies_yaml_is_one_line_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOKERNEL_CONFIG", "")
    root = checkout(tmp_path / "t")
    (root / "policies.yaml").write_text("ops:\n  deny: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(UserError) as e:
        policy.for_checkout(root)
    assert str(e.value) == f"{root / 'policies.yaml'}: not valid YAML: nested too deeply"


def test_a_value_the_yaml_constructor_refuses_is_bad_input(tmp_path):
    f = tmp_path / "policies.yaml"
    f.write_text("target:\n  model: 2001-13-01\n")  # a date in month 13: PyYAML raises ValueError, not YAMLError
    with pytest.raises(UserError, match=r"policies.yaml: not valid YAML: month must be in 1..12"):
        policy.load(f)


@pytest.mark.parametrize("name, text", [
    (decl.NAME, "a = " + "[" * 100_000 + "]" * 100_000 + "\n"),
    ("policies.yaml", "ops:\n  deny: " + "[" * 5000 + "]" * 5000 + "\n"),
])
def test_profile_on_a_deeply_nested_file_exits_2_without_a_traceback(tmp_path, name, text):
    root = checkout(tmp_path / "t")
    (root / name).write_text(text)
    env = {**os.environ, "AUTOKERNEL_CONFIG": "", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = subprocess.run(CLI + ["profile", "--repo", str(root)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "nested too deeply" in r.stderr, r.stderr[-2000:]


# --- B9: init keeps the declaration's mode --------------------------------------------------------------------------

def test_init_write_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    f = tmp_path / decl.NAME
    f.write_text("# the user's\n")
    for mode in (0o644, 0o664, 0o640):
        os.chmod(f, mode)
        init.write(f, "[engine]\n")
        assert (f.stat().st_mode & 0o777, f.read_text()) == (mode, "[engine]\n")


def test_init_write_gives_a_new_file_what_an_editor_would(tmp_path):
    old = os.umask(0o022)
    try:
        init.write(tmp_path / decl.NAME, "[engine]\n")
    finally:
        os.umask(old)
    assert (tmp_path / decl.NAME).stat().st_mode & 0o777 == 0o644


# --- B5: checkout text in the commit message and the PR body --------------------------------------------------------

@pytest.mark.parametrize("file", [
    "toyt/ops/norm Closes #1 cc @torvalds and @acme-corp.py",  # the red team's: closes an issue, mentions people
    "toyt/ops/norm;rm -rf ~.py",
    "toyt/ops/$(id).py",
    "toyt/ops/`id`.py",
    "toyt/ops/norm'.py",
])
def test_an_op_file_outside_the_safe_characters_is_refused(tmp_path, file):
    root = checkout(tmp_path / "t", file=file)
    with pytest.raises(UserError) as e:
        decl.load(root)
    msg = str(e.value)
    assert "[ops.norm] file: name the file with letters, digits" in msg and "\n" not in msg


def test_the_usual_op_files_still_load(tmp_path):
    for i, file in enumerate(["toyt/ops/norm.py", "toyt/ops/rms_norm-v2.py", "toyt/ops/fused.norm.py"]):
        root = checkout(tmp_path / str(i), file=file)
        assert decl.load(root).ops["norm"].file == file  # type: ignore[union-attr]


def _message(name: str, file: str, detail: str) -> str:
    op = decl.Op(name, file, ["norm"], {"norm": "toyt.ref:norm"})
    speedup = NS(est=1.5, lo=1.3, hi=1.7)
    files = [NS(shapes=[], speedup=speedup, launchers=[]), NS(shapes=[], speedup=speedup, launchers=[])]
    m = NS(label="CPU", files=files, policy={"confidence": 0.95, "min_speedup": 1.02})
    fb = NS(stages=[{"name": "e2e", "passed": True, "detail": detail, "metrics": {"kl_mean": 1e-4}}],
            sha256="ab" * 32, seed=7, isolation="bubblewrap")
    return message(op, m, fb, "c0ffee" * 7, 0.25)  # type: ignore[arg-type]  # a stand-in Feedback


def test_the_reproduce_line_is_one_command_whatever_the_names():
    """An op named like an option and a file with shell characters (the message quotes them: the declaration refuses
    such a file, but the line must not depend on that)."""
    text = _message("--help", "toyt/ops/a b;id.py", "ok")
    repro = next(x for x in text.splitlines() if x.startswith("Reproduce: "))
    assert shlex.split(repro.removeprefix("Reproduce: ")) == [
        "autokernel", "verify", "--repo", ".", "--seed", "7", "--", "--help", "toyt/ops/a b;id.py"]


def test_the_gate_detail_in_the_message_is_inert():
    text = _message("norm", "toyt/ops/norm.py", "KL fine. Closes #1 cc @acme-corp/team")
    assert "#1" not in text and "@acme" not in text
