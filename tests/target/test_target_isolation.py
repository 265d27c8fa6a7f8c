"""A target checkout's code is untrusted whoever writes the candidates (docs/design.md trust rule 6): where jobs
would not get full isolation (here: no bubblewrap on PATH), every target command refuses to run the checkout's
engine, references or kernels (exit 2, one line, the engine never imported), unless the user's own --policy says
`sandbox.isolation: none`. Before, init, profile, verify, bench and `run --agent search` ran the checkout's engine as
a plain subprocess that could read the parent's environment (/proc/<ppid>/environ: the API keys) and the network.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_target_gate import NORM, checkout

CLI = [str(Path(sys.executable).parent / "autokernel")]
IMPORTED = "\nimport pathlib as _p\n_p.Path({marker!r}).write_text('the engine ran')\n"


def _no_bwrap_env(tmp_path: Path) -> dict[str, str]:
    """PATH with git and nothing else: bubblewrap is missing, as on a machine without it."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    os.symlink(shutil.which("git"), bin_ / "git")
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "TMPDIR")}
    return {**keep, "PATH": str(bin_), "XDG_CACHE_HOME": str(tmp_path / "cache"), "OPENAI_API_KEY": "sk-canary"}


@pytest.fixture
def hostile(tmp_path):
    root = checkout(tmp_path / "co")
    marker = tmp_path / "imported"
    engine = root / "toyt/engine.py"
    engine.write_text(IMPORTED.format(marker=str(marker)) + engine.read_text())
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "co"]):
        subprocess.run(["git", *args], cwd=root, check=True)
    cand = tmp_path / "norm.py"
    cand.write_text(NORM)
    return root, marker, cand


@pytest.mark.parametrize("command", ["init --force", "profile", "verify norm CAND", "bench norm CAND",
                                     "run --agent search --op norm --yes"])
def test_every_target_command_refuses_the_checkouts_code_without_isolation(hostile, tmp_path, command):
    root, marker, cand = hostile
    args = [a.replace("CAND", str(cand)) for a in command.split()]
    r = subprocess.run(CLI + [*args, "--repo", str(root)], capture_output=True, text=True, timeout=300,
                       env=_no_bwrap_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    said = r.stderr + r.stdout  # run reports on its console (stdout), the others on stderr
    assert "refusing to run untrusted code" in said and "bubblewrap" in said, said
    assert not marker.exists()


def test_the_users_own_policy_can_opt_out(hostile, tmp_path):
    """The control: with the user's `--policy` saying isolation none the same command runs the engine (loudly), so
    the refusal above is the isolation check, not a broken checkout."""
    root, marker, _ = hostile
    policy = tmp_path / "mine.yaml"
    policy.write_text("sandbox:\n  isolation: none\n")
    r = subprocess.run(CLI + ["init", "--force", "--repo", str(root), "--policy", str(policy)], capture_output=True,
                       text=True, timeout=300, env=_no_bwrap_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert marker.exists() and "WEAKER isolation" in r.stderr


@pytest.fixture
def own_layout(tmp_path):
    """A checkout in autokernel's own layout (kernels/<op>.py, no autokernel.toml) whose rmsnorm runs a payload at
    import: someone else's kernels, as untrusted as a target's."""
    from autokernel.paths import INSTALLED
    root = tmp_path / "co"
    (root / "kernels").mkdir(parents=True)
    for f in (INSTALLED / "kernels").glob("*.py"):
        shutil.copy(f, root / "kernels" / f.name)
    marker = tmp_path / "imported"
    kernel = root / "kernels" / "rmsnorm.py"
    kernel.write_text(IMPORTED.format(marker=str(marker)) + kernel.read_text())
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "co"]):
        subprocess.run(["git", *args], cwd=root, check=True)
    cand = tmp_path / "rmsnorm.py"
    shutil.copy(INSTALLED / "kernels" / "rmsnorm.py", cand)
    return root, marker, cand


@pytest.mark.parametrize("command", ["bench rmsnorm CAND", "verify rmsnorm CAND", "agent rmsnorm --agent search",
                                     "run --agent search --op rmsnorm --yes"])
def test_a_checkout_in_autokernels_own_layout_is_refused_too(own_layout, tmp_path, command):
    """Run in such a checkout (its kernels/ the incumbent, the end-to-end engine's other ops), bench, verify, agent
    and run --agent search only warned and ran its kernels as a plain subprocess (the payload read the parent's
    OPENAI_API_KEY from /proc). Now exit 2 like a target's, before any of its code runs."""
    root, marker, cand = own_layout
    args = [a.replace("CAND", str(cand)) for a in command.split()]
    r = subprocess.run(CLI + args, capture_output=True, text=True, timeout=300, env=_no_bwrap_env(tmp_path), cwd=root)
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    said = r.stderr + r.stdout
    assert "refusing to run untrusted code" in said and "bubblewrap" in said, said
    assert not marker.exists()
