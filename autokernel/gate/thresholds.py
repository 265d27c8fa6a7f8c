"""Integer thresholds a candidate compares against, read from its source in the parent (docs/shortcuts.md,
"coverage shortcuts").

A kernel that is exact for small M and takes a shortcut past `M > 3000` (a quantised load, half a grid, a smaller
block, `if row > 4000:` inside the kernel) is only caught by a case on the far side of 3000. The schedule
(autokernel/gate/schedule.py) sweeps the leading dimension log-spaced up to policy gate.max_rows; these values add
T-1, T, T+1 (and T // N for each traced dimension N, for thresholds on a product like M * N) so a literal threshold is
checked on both sides exactly, wherever it lies below max_rows.

Collected: every int > 1 that is a constant operand of a comparison (<, <=, >, >=, ==, !=) anywhere in the file
(launcher, kernels, heuristics lambdas), constant expressions there folded (`1 << 12`, `3 * 1024`), and names
assigned such a constant anywhere in the file and then compared (`LIMIT = 3000 ... if M > LIMIT`). A constant also
reaches a name as an argument: a keyword (`kernel[grid](..., LIMIT=3000)`, `f(limit=3000)`), a positional argument
of a function defined in the file (bound to its parameter by position: `kernel[grid](x, M, 3000)` binds the kernel's
third parameter), a string-keyed dict entry (`triton.Config({"LIMIT": 3000})`) or a parameter's default; each such
value is a threshold wherever that name is compared. A threshold computed at run time from non-constants is left to
the log-spaced sweep.

A comparison can also hide in arithmetic: `(M - 520) // 384` is 0 exactly for M in [520, 904), and
`min(1, abs(...))` turns that into a switch with no comparison in the file. So every int > 1 that arithmetic
(+ - * // % << >> & | ^ **) or a min/max call combines with a value that is not constant is a threshold too: M = 520
is then checked, inside such a window. (Found by an in-session red team: an rmsnorm that summed half of each row's
squares for M in [520, 904) was accepted; the sweep's log-spaced values skip that window.)
"""
from __future__ import annotations

import ast
import operator
from collections.abc import Callable

from autokernel.gate.static_common import parse

_OPS: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
    ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.Pow: pow, ast.Mod: operator.mod}
_LIMIT = 1 << 40  # a folded value past this is no row count (and `2 ** 10 ** 9` must not be computed)


def _fold(node: ast.AST, names: dict[str, int]) -> int | None:
    """The int value of a constant expression (names bound to constants included), else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _fold(node.operand, names)
        return None if v is None else -v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _fold(node.left, names), _fold(node.right, names)
        if a is None or b is None or abs(a) > _LIMIT or abs(b) > _LIMIT:
            return None
        if isinstance(node.op, (ast.Pow, ast.LShift)) and not 0 <= b <= 40:
            return None
        try:
            v = _OPS[type(node.op)](a, b)
        except (ZeroDivisionError, ValueError, OverflowError):
            return None
        return v if abs(v) <= _LIMIT else None
    return None


def names(source: str | bytes) -> dict[str, int]:
    """The file's names bound to int constant expressions (empty if it does not parse)."""
    try:
        return _constant_names(parse(source))
    except (SyntaxError, ValueError):
        return {}


def _constant_names(tree: ast.AST) -> dict[str, int]:
    """Names assigned an int constant expression anywhere in the file (the last constant assignment wins; a name
    assigned two constants keeps both via the compare walk below seeing each)."""
    names: dict[str, int] = {}
    for _ in range(2):  # a name defined from another constant name
        for n in ast.walk(tree):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
            value = getattr(n, "value", None)
            for t in targets:
                if isinstance(t, ast.Name) and value is not None:
                    v = _fold(value, names)
                    if v is not None:
                        names[t.id] = v
    return names


def _bound_arguments(tree: ast.AST, names: dict[str, int]) -> dict[str, set[int]]:
    """Constants that reach a name as an argument, a dict entry or a default (see the module docstring)."""
    params = {f.name: [a.arg for a in f.args.posonlyargs + f.args.args] for f in ast.walk(tree)
              if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    out: dict[str, set[int]] = {}

    def bind(name: str, value: ast.AST) -> None:
        v = _fold(value, names)
        if v is not None:
            out.setdefault(name, set()).add(v)

    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            for kw in n.keywords:
                if kw.arg is not None:
                    bind(kw.arg, kw.value)
            callee = n.func.value if isinstance(n.func, ast.Subscript) else n.func  # kernel[grid](...) or f(...)
            if isinstance(callee, ast.Name) and callee.id in params:
                for pname, arg in zip(params[callee.id], n.args):
                    bind(pname, arg)
        elif isinstance(n, ast.Dict):
            for k, v in zip(n.keys, n.values):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    bind(k.value, v)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for name, d in _defaults(n.args):
                bind(name, d)
    return out


def _defaults(a: ast.arguments) -> list[tuple[str, ast.expr]]:
    """(parameter name, default expression) of a def or lambda."""
    positional = a.posonlyargs + a.args
    return [(arg.arg, d) for arg, d in zip(positional[len(positional) - len(a.defaults):], a.defaults)] + \
        [(arg.arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]


def extract(source: str | bytes) -> set[int]:
    """Every int > 1 a comparison in `source` is made against (see the module docstring); empty if it does not
    parse (the static stage has rejected it then)."""
    try:
        tree = parse(source)
    except (SyntaxError, ValueError):
        return set()
    names = _constant_names(tree)
    bound = _bound_arguments(tree, names)
    out: set[int] = set(_arithmetic(tree, names))
    for c in ast.walk(tree):
        if not isinstance(c, ast.Compare):
            continue
        for side in [c.left, *c.comparators]:
            for n in ast.walk(side):  # the operand and its constant sub-expressions (`M * 2 > 6000 + 1`)
                v = _fold(n, names)
                if v is not None and v > 1:
                    out.add(v)
                if isinstance(n, ast.Name):  # a name some argument, dict entry or default binds to constants
                    out |= {b for b in bound.get(n.id, ()) if b > 1}
    return out


_ARITH = (*_OPS, ast.BitAnd, ast.BitOr, ast.BitXor)


def _arithmetic(tree: ast.AST, names: dict[str, int]) -> set[int]:
    """Ints > 1 combined with a non-constant value by arithmetic or min/max (the module docstring)."""
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.BinOp) and isinstance(n.op, _ARITH):
            sides = [n.left, n.right]
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("min", "max"):
            sides = list(n.args)
        else:
            continue
        values = [_fold(x, names) for x in sides]
        if any(v is None for v in values):  # some side varies: the constant sides shape its value
            out |= {v for v in values if v is not None and v > 1}
    return out


MAX_ROWS_FROM_THRESHOLDS = 48  # the most range values a candidate's constants may add to a plan (bounded work,
# docs/design.md): a file of thousands of dead constants otherwise made a 1,107-case plan (117x the usual). The
# cheapest are kept; a threshold left out and taken by the code is still a condition the coverage requirement
# (autokernel/gate/coverage.py) must see both ways, and its steering aims at the numbers in it.


def rows(thresholds: set[int], shape: dict[str, int], dim: str, max_rows: int,
         sides: tuple[int, ...] = (-1, 0, 1)) -> list[int]:
    """Leading-dimension values that put each threshold T (and T // N for each other dimension N > 1 of `shape`, for
    a threshold on a product) on both sides for the swept dimension `dim`: T-1, T, T+1 (`sides`), within
    1..max_rows; at most MAX_ROWS_FROM_THRESHOLDS of them, the smallest."""
    out: set[int] = set()
    others = {v for k, v in shape.items() if k != dim and v > 1}
    for t in sorted(thresholds)[:4 * MAX_ROWS_FROM_THRESHOLDS]:  # a bound on the work here too (thousands of them)
        for c in {t} | {t // n for n in others}:
            out |= {v for v in (c + s for s in sides) if 1 <= v <= max_rows}
    return sorted(out)[:MAX_ROWS_FROM_THRESHOLDS]
