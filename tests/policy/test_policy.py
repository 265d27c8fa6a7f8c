import subprocess
import sys
from pathlib import Path

import pytest

from autokernel.errors import UserError
from autokernel.policy import Policy, load

ROOT = Path(__file__).parents[2]


def test_repo_policy_is_valid():
    p = load(ROOT / "policies.yaml")
    assert p.ops.protected == ["lm_head"] and p.agent.provider == "search"


def test_defaults_declared_once_with_docs():
    for name, section in Policy.model_fields.items():
        for field, info in section.annotation.model_fields.items():
            assert info.description, f"{name}.{field} has no docstring"


@pytest.mark.parametrize("text,where", [
    ("bench:\n  min_speedup: fast\n", ":2: field 'bench.min_speedup'"),
    ("agent:\n  provider: gpt\n", ":2: field 'agent.provider'"),
    ("sandbox:\n  isolaton: required\n", ":2: field 'sandbox.isolaton'"),
    ("- just\n- a list\n", "top level must be a mapping"),
    ("bench: [unclosed\n", "policies.yaml:2:1: not valid YAML: while parsing a flow sequence; expected ',' or ']'"),
    ("agent:\n  max_iterations: 3\n   bad: [\n", "policies.yaml:3:7: not valid YAML: mapping values are not allowed"),
])
def test_bad_policy_names_field_and_line(tmp_path, text, where):
    f = tmp_path / "policies.yaml"
    f.write_text(text)
    with pytest.raises(UserError, match=None) as e:
        load(f)
    assert where in str(e.value)


def test_cli_policy_check_exit_codes(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("e2e:\n  top1_min: lots\n")
    cmd = [sys.executable, "-c", "from autokernel.cli import main; main()", "policy", "check"]
    ok = subprocess.run(cmd + [str(ROOT / "policies.yaml")], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "valid" in ok.stdout
    r = subprocess.run(cmd + [str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"{bad}:2: field 'e2e.top1_min'" in r.stderr and "Traceback" not in r.stderr
