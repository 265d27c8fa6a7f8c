import json

import pytest

from autokernel.errors import UserError
from autokernel.profile import workload


def test_default_workload_is_valid_and_small():
    w, text, sha = workload.load()
    assert w.name == "default" and w.chat and 3 <= len(w.prompts) <= 4 and 4 <= w.decode_steps <= 8
    assert len({len(p) for p in w.prompts}) == len(w.prompts)  # mixed lengths
    assert len(sha) == 64 and text.startswith("#")


def test_json_and_max_new_tokens_alias(tmp_path):
    f = tmp_path / "w.json"
    f.write_text(json.dumps({"prompts": ["a", "b", "c"], "max_new_tokens": 3, "batch": 2, "chat": False}))
    w, _, _ = workload.load(f)
    assert w.decode_steps == 3 and w.batches() == [["a", "b"], ["c"]]


@pytest.mark.parametrize("text,where", [
    ("decode_steps: 2\n", "field 'prompts': Field required"),
    ("prompts: [a]\ndecode_steps: -1\n", ":2: field 'decode_steps'"),
    ("prompts: [a]\ndecode_steps: 2\nbatch: 0\n", ":3: field 'batch'"),
    ("prompts: [a]\ndecode_steps: 2\nbach: 2\n", ":3: field 'bach': Extra inputs are not permitted"),
    ("prompts: [a, '  ']\ndecode_steps: 2\n", "field 'prompts': prompt 1 is empty"),
    ("prompts: []\ndecode_steps: 2\n", "field 'prompts'"),
    ("prompts:\n  - a\n  - [nested]\ndecode_steps: 1\n", ":3: field 'prompts.1'"),
    ("- a\n- b\n", "top level must be a mapping with fields prompts"),
    ("prompts: [unclosed\n", "not valid YAML"),
    ("prompts: [a]\ndecode_steps: 1\nseed: 123456789012345678901234567890\n", ":3: field 'seed'"),  # torch overflowed
])
def test_malformed_workload_names_the_field(tmp_path, text, where):
    f = tmp_path / "w.yaml"
    f.write_text(text)
    with pytest.raises(UserError) as e:
        workload.load(f)
    assert where in str(e.value) and str(f) in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_workload_file(tmp_path):
    with pytest.raises(UserError, match="no such workload file"):
        workload.load(tmp_path / "nope.yaml")


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "a:\n" + "".join("  " * i + "- b:\n" for i in range(3000))])
def test_a_deeply_nested_workload_is_one_line(tmp_path, text):
    """A checkout's workload file (target.workload) is a config file someone else may have written: nesting past
    Python's recursion limit is a one-line UserError (policy.parse_untrusted), not a RecursionError traceback."""
    path = tmp_path / "w.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        workload.load(path)
    assert str(e.value).startswith(f"{path}") and "not valid YAML" in str(e.value) and "\n" not in str(e.value)
