"""Every ast.parse in autokernel goes through autokernel.paths.parse, under its lock. CPython 3.11's parser keeps
its recursion depth per interpreter, not per thread: an unlocked parse in one thread (the coverage check, the
offline search) broke a locked one in another with "SystemError: AST constructor recursion depth mismatch" (a CI run
of tests/gate/test_gate_cheats.py, whose verdicts run in threads as parallel verifies do)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "autokernel"


def test_no_module_calls_ast_parse_but_paths():
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parse" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "ast":
                calls.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert [c.rpartition(":")[0] for c in calls] == ["autokernel/paths.py"], calls
