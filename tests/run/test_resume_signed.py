"""`--resume` reads only run state this user's autokernel wrote (autokernel/run.py RunState: HMAC-SHA256 with a key
in the user's cache). Red team (helper-40): a checkout shipping its own sandbox/run-*/state.json with a
`delivery_failed` entry had `run --resume` commit what that directory said (a workflow sending GITHUB_TOKEN away, a
key file read through a link) on a branch outside autokernel/, with no gate and no benchmark."""
import json

import pytest

from autokernel.errors import UserError
from autokernel.run import RunState


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_a_saved_state_resumes(tmp_path):
    s = RunState(tmp_path, "t", ["rmsnorm"], {"rmsnorm": {"status": "delivery_failed", "branch": "autokernel/x"}})
    s.save()
    back = RunState.load(tmp_path)
    assert (back.ops, back.done) == (s.ops, s.done)
    assert oct((tmp_path / "cache" / "autokernel" / "state.key").stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("forge", ["unsigned", "edited", "other_key", "link"])
def test_a_state_this_user_did_not_write_is_refused(tmp_path, monkeypatch, forge):
    run = tmp_path / "run"
    run.mkdir()
    RunState(run, None, ["rmsnorm"], {"rmsnorm": {"status": "delivery_failed", "branch": "autokernel/x"}}).save()
    f = run / "state.json"
    d = json.loads(f.read_text())
    if forge == "unsigned":
        d.pop("mac")
    elif forge == "edited":
        d["done"]["rmsnorm"]["branch"] = "main-hotfix"
    elif forge == "other_key":  # signed by another machine's autokernel (the checkout author's)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "theirs"))
        RunState(run, None, ["rmsnorm"], {"rmsnorm": {"status": "delivery_failed", "branch": "main"}}).save()
        d = json.loads(f.read_text())
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if forge == "link":
        real = tmp_path / "elsewhere.json"
        real.write_text(f.read_text())
        f.unlink()
        f.symlink_to(real)
    else:
        f.write_text(json.dumps(d))
    with pytest.raises(UserError, match="not an autokernel run directory|not written by autokernel") as e:
        RunState.load(run)
    assert "\n" not in str(e.value)
