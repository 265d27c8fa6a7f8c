"""The package's import graph against docs/design.md's "may import" table: no module cycles, no back-imports.

Every module under autokernel/ is read with ast (nothing is imported). An import counts wherever it is written: at
module level, inside a function (a lazy import is still a dependency), and under `if TYPE_CHECKING:` (a type named
from a module is a dependency on it). `from autokernel.gate import static` is an edge to the module
autokernel.gate.static; `from autokernel.gate import Verdict` an edge to the package's __init__.

A unit is a package directory (`gate/`) or a top-level module (`paths.py`). A command module (`command.py`,
`*_command.py`, `cli.py`, or one that imports typer: `run.py`, `agent/ledger.py`...) is the command line living
inside a package until the commands move to one `autokernel/cli/` package (issue 27, item 1): its imports are listed
apart in the table ("commands also") and are left out of the back-import check. The root
`autokernel/__init__.py` holds only `__version__` and imports nothing.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "autokernel"
DESIGN = ROOT / "docs" / "design.md"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str:
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def imports(path: Path) -> set[str]:
    """The autokernel modules `path` imports, at any depth of its tree."""
    out = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            out |= {_resolve(a.name) for a in node.names if a.name.split(".")[0] == "autokernel"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "autokernel":
            mod = node.module or ""
            out |= {f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else _resolve(mod) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import (the graph reads absolute ones)")
    return out


def is_command(path: Path) -> bool:
    """A module of the command line: named for it (`command.py`, `*_command.py`, `cli.py`) or importing typer."""
    if path.stem in ("command", "cli") or path.stem.endswith("_command"):
        return True
    return any(isinstance(n, ast.Import) and any(a.name == "typer" for a in n.names)
               or isinstance(n, ast.ImportFrom) and n.module == "typer" for n in ast.walk(_tree(path)))


def unit(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return parts[1] + "/" if (PACKAGE / parts[1]).is_dir() else parts[1] + ".py"


def graph() -> dict[str, set[str]]:
    return {m: imports(p) - {m} for m, p in MODULES.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def unit_edges(edges: dict[str, set[str]]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(library edges, command-only edges) between units, each unit -> the units it imports."""
    lib: dict[str, set[str]] = {}
    cmd: dict[str, set[str]] = {}
    for m, out in edges.items():
        src = unit(m)
        bucket = cmd if is_command(MODULES[m]) else lib
        for o in out:
            if unit(o) not in (src, "__init__.py"):
                bucket.setdefault(src, set()).add(unit(o))
    for src, out in cmd.items():
        out -= lib.get(src, set())
    return lib, {k: v for k, v in cmd.items() if v}


def table() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """docs/design.md's layout table: unit -> (what it may import, what its commands also may import)."""
    lib: dict[str, set[str]] = {}
    cmd: dict[str, set[str]] = {}
    for row in DESIGN.read_text().splitlines():
        m = re.match(r"\| `autokernel/([^`]+)` \|[^|]*\|([^|]*)\|$", row)
        if not m:
            continue
        name = m.group(1)
        own, _, also = m.group(2).partition("commands also:")
        lib[name] = set(re.findall(r"`([^`]+)`", own))
        cmd[name] = set(re.findall(r"`([^`]+)`", also))
    return lib, cmd


def _units() -> set[str]:
    return {unit(m) for m in MODULES} - {"__init__.py"}


def test_no_module_imports_itself_back():
    assert cycles(graph()) == []


def test_no_back_imports_between_units():
    lib, _ = unit_edges(graph())
    assert cycles(lib) == []


def test_every_unit_has_a_row_in_the_design_table():
    lib, _ = table()
    assert sorted(_units() - set(lib)) == []
    assert sorted(set(lib) - _units()) == []  # a row for something that is gone


def test_each_unit_imports_only_what_the_table_allows():
    lib, cmd = unit_edges(graph())
    may, also = table()
    extra = {u: sorted(out - may.get(u, set())) for u, out in lib.items() if out - may.get(u, set())}
    assert extra == {}, "imports docs/design.md's table does not allow"
    extra = {u: sorted(out - may.get(u, set()) - also.get(u, set()))
             for u, out in cmd.items() if out - may.get(u, set()) - also.get(u, set())}
    assert extra == {}, "command-module imports docs/design.md's table does not allow"


def test_the_table_allows_nothing_that_is_not_imported():
    lib, cmd = unit_edges(graph())
    may, also = table()
    stale = {u: sorted(out - lib.get(u, set())) for u, out in may.items() if out - lib.get(u, set())}
    stale |= {f"{u} (commands)": sorted(out - cmd.get(u, set())) for u, out in also.items() if out - cmd.get(u, set())}
    assert stale == {}, "docs/design.md's table allows imports that no longer exist: tighten it"


def test_the_table_rows_run_bottom_to_top():
    """design.md: the rows are in layer order, a room imports only rooms listed above it."""
    may, _ = table()
    order = list(may)
    below = {u: sorted(o for o in out if order.index(o) > order.index(u)) for u, out in may.items()}
    assert {u: b for u, b in below.items() if b} == {}
