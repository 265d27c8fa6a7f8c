"""Trust rule 6 (docs/design.md): the checkout is untrusted input. Its policies.yaml cannot route the API key, spend
more of the user's money or weaken the sandbox; every file read from it is a regular file inside it (a symlink to a
secret is refused, named, never read); an incumbent that does not parse is bad input (exit 2), never a traceback
quoting it; `verify` keeps its run state in the checkout (or the user's cache), never in the installed package.

Each test here fails with its defence removed (checked by removing it: see the commit that added this file)."""
import json
import os
import re
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from autokernel import paths, policy, sandbox
from autokernel.errors import UserError
from autokernel.paths import INSTALLED
from autokernel.sandbox import runner

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "gate" / "fixtures" / "rmsnorm"
SECRET = "SECRET_TOKEN=hunter2-do-not-leak"
STATIC_REJECT = FIXTURES / "call_functional.py"  # rejected by the static stage: verify returns without a sandbox


@pytest.fixture
def secret(tmp_path) -> Path:
    """A file outside the checkout that must never be read: the user's env file."""
    f = tmp_path / "home" / ".env"
    f.parent.mkdir()
    f.write_text(SECRET + "\n")
    return f


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """A git work tree with kernels/ (an autokernel target), the current directory, and no user config."""
    root = tmp_path / "checkout"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "rmsnorm.py").write_bytes((INSTALLED / "kernels" / "rmsnorm.py").read_bytes())
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    monkeypatch.chdir(root)
    monkeypatch.setenv("AUTOKERNEL_CONFIG", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return root


def policies(root: Path, text: str) -> Path:
    f = root / "policies.yaml"
    f.write_text(text)
    return f


# --- class 1: what the checkout's policies.yaml may set ------------------------------------------------------------

@pytest.mark.parametrize("text, field", [
    ("agent:\n  provider: openai\n", "agent.provider"),
    ("agent:\n  max_iterations: 2\n  base_url: http://127.0.0.1:9/v1\n", "agent.base_url"),
    ("cluster:\n  address: ray://evil:10001\n", "cluster.address"),
    ("agent:\n  prices: {gpt: [0, 0]}\n", "agent.prices"),
    ("agent:\n  max_usd: 500\n", "agent.max_usd"),
    ("agent:\n  workers: 64\n", "agent.workers"),
    ("sandbox:\n  isolation: none\n", "sandbox.isolation"),
    ("sandbox:\n  fork: allow\n", "sandbox.fork"),
    ("sandbox:\n  memory_mb: 1000000\n", "sandbox.memory_mb"),
])
def test_the_checkout_may_not_route_the_key_spend_more_or_weaken_the_sandbox(checkout, text, field):
    f = policies(checkout, text)
    with pytest.raises(UserError) as e:
        policy.for_checkout(checkout)
    msg = str(e.value)
    assert f"{f}:{text.count(chr(10))}: field '{field}': refused" in msg and "--policy" in msg and "\n" not in msg


def test_the_checkout_may_tighten_and_set_everything_else(checkout):
    policies(checkout, "sandbox:\n  isolation: required\n  timeout_s: 60\nagent:\n  provider: search\n"
                       "  max_usd: 0.5\n  max_iterations: 2\nbench:\n  min_speedup: 1.5\n")
    p = policy.for_checkout(checkout)
    assert (p.sandbox.isolation, p.sandbox.timeout_s, p.agent.max_usd) == ("required", 60, 0.5)
    assert (p.agent.max_iterations, p.bench.min_speedup) == (2, 1.5)
    assert "checkout" in p.sandbox.origin("isolation")
    policy.for_checkout(ROOT)  # this repository's own policies.yaml asks for nothing it may not


def test_the_command_line_user_config_and_policy_flag_are_trusted(checkout, tmp_path, monkeypatch):
    policies(checkout, "agent:\n  provider: openai\n  base_url: http://127.0.0.1:9/v1\nsandbox:\n  isolation: none\n")
    with pytest.raises(UserError):
        policy.for_checkout(checkout, flags=["agent.provider"])  # --agent given, but base_url and isolation are not
    mine = tmp_path / "mine.yaml"
    mine.write_text("sandbox:\n  isolation: none\n")
    monkeypatch.setenv("AUTOKERNEL_CONFIG", str(mine))
    p = policy.for_checkout(checkout, flags=["agent.provider", "agent.base_url"])
    assert p.sandbox.isolation == "none" and p.sandbox.origin("isolation") == str(mine)
    assert p.agent.provider == "search" and p.agent.base_url is None  # the checkout's values are moot, not applied
    # --policy FILE is the user's own choice, wherever it lives (even the checkout's own file)
    p = policy.for_checkout(checkout, explicit=checkout / "policies.yaml")
    assert p.agent.base_url == "http://127.0.0.1:9/v1" and "--policy" in p.sandbox.origin("isolation")


def test_a_command_is_refused_only_for_what_it_acts_on(checkout, capsys):
    from autokernel.cli.verify import verify_command
    policies(checkout, "agent:\n  provider: openai\n")
    assert verify_command("rmsnorm", STATIC_REJECT) == 1  # verify sends no key: the field is not its business
    with pytest.raises(UserError, match="agent.provider"):
        policy.for_checkout(checkout)  # `run` and `agent` would send one


def test_a_checkout_base_url_never_receives_the_key(checkout, monkeypatch):
    """`autokernel run` in a checkout that names its own server: refused before any request (the key used to be sent
    with the first request, before profiling)."""
    from rich.console import Console

    from autokernel.cli import run as run_cli  # the command's lookup of the checkout and its policy, then run.context
    listener = socket.create_server(("127.0.0.1", 0))
    port, seen = listener.getsockname()[1], []
    threading.Thread(target=lambda: seen.append(listener.accept()), daemon=True).start()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-of-the-user")
    policies(checkout, f"agent:\n  provider: openai\n  base_url: http://127.0.0.1:{port}/v1\n")
    with pytest.raises(UserError, match="field 'agent.provider': refused"):
        run_cli.context(agent=None, model=None, base_url=None, repo=checkout, policy_file=None, console=Console())
    with pytest.raises(UserError, match="field 'agent.base_url': refused"):  # naming the provider is not enough
        run_cli.context(agent="openai", model=None, base_url=None, repo=checkout, policy_file=None,
                        console=Console())
    listener.close()
    assert seen == []


def test_the_isolation_warning_names_who_chose_none(checkout, capsys, monkeypatch):
    policies(checkout, "sandbox:\n  isolation: none\n")
    p = policy.for_checkout(checkout, explicit=checkout / "policies.yaml")
    monkeypatch.setattr(runner, "_warned", set())
    sandbox.preflight(p.sandbox, untrusted_author=False)
    err = capsys.readouterr().err
    assert f"set by --policy {checkout / 'policies.yaml'} (a file of the checkout" in err
    assert "Install bubblewrap" not in err


# --- class 2: every file read from the checkout is a regular file inside it ----------------------------------------

def _refused(fn, link: Path) -> str:
    with pytest.raises(UserError) as e:
        fn()
    msg = str(e.value)
    assert str(link) in msg and "refused" in msg and SECRET not in msg and "hunter2" not in msg
    return msg


def test_a_kernel_symlinked_out_of_the_checkout_is_never_read(checkout, secret):
    from autokernel.agent import context, prompt
    from autokernel.agent.command import check_op
    from autokernel.cluster import _kernels
    link = checkout / "kernels" / "rmsnorm.py"
    link.unlink()
    link.symlink_to(secret)
    layout = paths.Layout(checkout)
    _refused(lambda: layout.kernel_file("rmsnorm"), link)
    _refused(lambda: check_op("rmsnorm", policy.Policy(), layout), link)
    _refused(lambda: prompt.build("rmsnorm", policy.Agent(), kernel_file=link), link)  # what the model is shown
    _refused(lambda: _kernels(checkout / "kernels"), link)  # what a Ray cluster is sent
    sibling = checkout / "kernels" / "add_rmsnorm.py"
    sibling.symlink_to(secret)
    _refused(lambda: context.sibling_sources("rmsnorm", checkout / "kernels"), sibling)


def test_policies_workload_ledger_and_run_state_links_are_refused(checkout, secret, tmp_path):
    from autokernel.agent.ledger import Ledger
    (checkout / "policies.yaml").symlink_to(secret)
    _refused(lambda: policy.for_checkout(checkout), checkout / "policies.yaml")
    (checkout / "policies.yaml").unlink()
    (checkout / "wl.yaml").symlink_to(secret)
    policies(checkout, "target:\n  workload: wl.yaml\n")
    _refused(lambda: policy.for_checkout(checkout), checkout / "wl.yaml")
    (checkout / "sandbox").mkdir()
    (checkout / "sandbox" / "ledger.jsonl").symlink_to(secret)
    led = Ledger.of(paths.Layout(checkout))
    _refused(lambda: led.entries("rmsnorm"), checkout / "sandbox" / "ledger.jsonl")
    with pytest.raises(OSError):  # appending never follows the link into the user's file
        led.record(type("F", (), {"reasons": [], "sha256": "0", "op": "rmsnorm", "verdict": "rejected",
                                  "summary": "", "accepted": False, "speedup": None, "speedup_ci": None,
                                  "pct_of_peak": None, "implausible": False})())
    assert secret.read_text() == SECRET + "\n"
    away = tmp_path / "elsewhere"
    away.mkdir()
    (checkout / "traces").symlink_to(away)
    with pytest.raises(UserError, match="traces/ is a symlink"):
        _ = paths.Layout(checkout).traces


def test_a_fifo_is_refused_without_blocking(checkout):
    fifo = checkout / "kernels" / "softmax.py"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        paths.read_bytes(fifo, checkout)


@pytest.mark.parametrize("command", ["verify", "bench"])
def test_verify_and_bench_refuse_a_symlinked_incumbent(checkout, secret, capsys, command):
    link = checkout / "kernels" / "rmsnorm.py"
    link.unlink()
    link.symlink_to(secret)
    assert _run(command, as_json=False) == 2
    out = capsys.readouterr()
    assert str(link) in out.err and "refused" in out.err and "hunter2" not in out.out + out.err


# --- class 3: an incumbent that does not parse is bad input ---------------------------------------------------------

def _run(command: str, as_json: bool) -> int:
    if command == "verify":
        from autokernel.cli.verify import verify_command
        return verify_command("rmsnorm", STATIC_REJECT, as_json=as_json)
    from autokernel.cli.bench import bench_command
    return bench_command("rmsnorm", [STATIC_REJECT], None, as_json)


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("command", ["verify", "bench"])
def test_an_incumbent_that_does_not_parse_is_exit_2_naming_it_never_quoting_it(checkout, capsys, command, as_json):
    incumbent = checkout / "kernels" / "rmsnorm.py"
    incumbent.write_text("import triton\n" + SECRET + " (\n")
    assert _run(command, as_json) == 2
    out = capsys.readouterr()
    assert "hunter2" not in out.out + out.err and "Traceback" not in out.err
    (err,) = out.err.strip().splitlines()
    assert str(incumbent) in err and "does not parse" in err and "line 2" in err
    if as_json:
        assert json.loads(out.out)["exit_code"] == 2


# --- class 8: verify's run state goes to the checkout, or the user's cache; never the installed package ------------

def _verdicts(under: Path) -> list[Path]:
    return sorted(under.glob("**/verdict.json")) if under.exists() else []


def test_verify_writes_into_the_checkout_it_runs_in(checkout, capsys):
    from autokernel.cli.verify import verify_command
    before = _verdicts(INSTALLED / "sandbox")
    assert verify_command("rmsnorm", STATIC_REJECT) == 1
    assert len(_verdicts(checkout / "sandbox")) == 1 and _verdicts(INSTALLED / "sandbox") == before
    (verdict,) = _verdicts(checkout / "sandbox")  # sandbox/<kind>-<UTC stamp>-<tags>-<hex>: paths.run_name
    assert re.fullmatch(r"verify-\d{8}-\d{6}-rmsnorm-[0-9a-f]{4}", verdict.relative_to(checkout / "sandbox").parts[0])


def test_verify_outside_a_checkout_writes_into_the_user_cache(tmp_path, monkeypatch, capsys):
    from autokernel.cli.verify import verify_command
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    before = _verdicts(INSTALLED / "sandbox")
    assert verify_command("rmsnorm", STATIC_REJECT) == 1
    assert len(_verdicts(tmp_path / "cache" / "autokernel" / "sandbox")) == 1
    assert _verdicts(INSTALLED / "sandbox") == before
