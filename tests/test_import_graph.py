"""The package's import graph against docs/design.md's "may import" table: no module cycles, no back-imports.

Every module under autokernel/ is read with ast (nothing is imported). An import counts wherever it is written: at
module level, inside a function (a lazy import is still a dependency), and under `if TYPE_CHECKING:` (a type named
from a module is a dependency on it). `from autokernel.gate import static` is an edge to the module
autokernel.gate.static; `from autokernel.gate import Verdict` an edge to the package's __init__.

A unit is a package directory (`gate/`) or a top-level module (`paths.py`). The command line is one unit,
`autokernel/cli/`, the top row: every command lives there and typer is imported nowhere else, so the stage packages
are libraries. The root `autokernel/__init__.py` holds only `__version__` and imports nothing.
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


def imports_typer(path: Path) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name.split(".")[0] == "typer" for a in n.names)
               or isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "typer"
               for n in ast.walk(_tree(path)))


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


def unit_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The edges between units, each unit -> the units it imports."""
    out: dict[str, set[str]] = {}
    for m, imported in edges.items():
        src = unit(m)
        for o in imported:
            if unit(o) not in (src, "__init__.py"):
                out.setdefault(src, set()).add(unit(o))
    return out


def table() -> dict[str, set[str]]:
    """docs/design.md's layout table: unit -> what it may import."""
    may: dict[str, set[str]] = {}
    for row in DESIGN.read_text().splitlines():
        m = re.match(r"\| `autokernel/([^`]+)` \|[^|]*\|([^|]*)\|$", row)
        if m:
            may[m.group(1)] = set(re.findall(r"`([^`]+)`", m.group(2)))
    return may


def _units() -> set[str]:
    return {unit(m) for m in MODULES} - {"__init__.py"}


def test_no_module_imports_itself_back():
    assert cycles(graph()) == []


def test_no_back_imports_between_units():
    assert cycles(unit_edges(graph())) == []


def test_every_unit_has_a_row_in_the_design_table():
    may = table()
    assert sorted(_units() - set(may)) == []
    assert sorted(set(may) - _units()) == []  # a row for something that is gone


def test_each_unit_imports_only_what_the_table_allows():
    edges, may = unit_edges(graph()), table()
    extra = {u: sorted(out - may.get(u, set())) for u, out in edges.items() if out - may.get(u, set())}
    assert extra == {}, "imports docs/design.md's table does not allow"


def test_the_table_allows_nothing_that_is_not_imported():
    edges, may = unit_edges(graph()), table()
    stale = {u: sorted(out - edges.get(u, set())) for u, out in may.items() if out - edges.get(u, set())}
    assert stale == {}, "docs/design.md's table allows imports that no longer exist: tighten it"


def test_only_the_command_line_imports_typer():
    """The stage packages are libraries: options, terminal output and exit codes live in autokernel/cli/."""
    assert sorted(m for m, p in MODULES.items() if imports_typer(p) and unit(m) != "cli/") == []


def test_the_table_rows_run_bottom_to_top():
    """design.md: the rows are in layer order, a room imports only rooms listed above it."""
    may = table()
    order = list(may)
    below = {u: sorted(o for o in out if order.index(o) > order.index(u)) for u, out in may.items()}
    assert {u: b for u, b in below.items() if b} == {}
