"""The configs of a `@triton.autotune(configs=...)`, read from the source without running it.

Two forms are in the grammar: a literal list (or tuple) of `triton.Config(...)` calls, and a comprehension over
literal iterables, as engineers write a sweep:

    configs=[triton.Config({"BLOCK_N": b}, num_warps=w) for b in (256, 512, 1024) for w in [4, 8] if b * w <= 4096]

The comprehension is expanded here, in the order Python runs it, into the literal calls it makes (each loop name
replaced by its value, integer arithmetic folded), so the static stage (autokernel/gate/static_decorators.py) checks
every config as if it were written out, and the coverage stage (autokernel/gate/coverage.py) counts and reaches each
one by its index, the index the autotuner has at run time. Anything else (a name, a call, a loop over a non-literal)
is not expanded: None, and the static stage rejects it. A module-level list (`CONFIGS = [...]`) or a function that
only returns one (the Triton tutorial's `get_autotune_config()`), named nowhere but in configs=, stands for its
list (sources()).
"""
from __future__ import annotations

import ast
import copy
import operator

MAX_CONFIGS = 256  # configs one autotuner may declare: each is run at every case's shapes (bounded work)
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}
MAX_FOLDED = 1 << 40  # a folded integer's magnitude (2 ** 10 ** 9 is not a config)


def configs(value: ast.expr, named: dict[str, ast.expr] | None = None) -> list[ast.expr] | None:
    """The config expressions `value` makes: its elements for a literal list/tuple, the expansion of a literal
    comprehension, those of a module-level list or config function it names (`named`: sources()), None for any
    other form (or a comprehension of more than MAX_CONFIGS)."""
    if named and isinstance(value, ast.Name) and value.id in named:
        value = named[value.id]
    elif named and isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in named \
            and not value.args and not value.keywords:
        value = named[value.func.id]
    if isinstance(value, (ast.List, ast.Tuple)):
        return list(value.elts)
    if isinstance(value, ast.ListComp):
        try:
            return _expand(value)
        except _NotLiteral:
            return None
    return None


def sources(tree: ast.Module) -> dict[str, ast.expr]:
    """The module-level names an autotune's configs= may name, with the list each stands for: `CONFIGS = [...]`
    (a list, tuple or comprehension of configs) or tutorial 03's `def get_autotune_config(): return [...]` (no
    parameters, no decorator, nothing but the return). Each is bound once and named nowhere but in configs= (as
    NAME, or NAME() for a function): a list the launcher could also reach would be module state."""
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        value, name = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.FunctionDef) and not node.decorator_list and _no_parameters(node.args):
            body = node.body[1:] if node.body and _docstring(node.body[0]) else node.body
            if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
                name, value = node.name, body[0].value
        if name is not None and isinstance(value, (ast.List, ast.Tuple, ast.ListComp)) and name not in found:
            found[name] = value
        elif name is not None:
            found.pop(name, None)
    bound = [n for node in tree.body for n in _names_bound(node)]
    uses = _configs_uses(tree)
    out = {}
    for name, value in found.items():
        loads = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
        if bound.count(name) == 1 and loads and all(id(n) in uses.get(name, set()) for n in loads) \
                and configs(value) is not None:
            out[name] = value
    return out


def _configs_uses(tree: ast.Module) -> dict[str, set[int]]:
    """name -> ids of the Name nodes that are a configs= value (NAME, or NAME() with no arguments)."""
    out: dict[str, set[int]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.keyword) and n.arg == "configs":
            v = n.value
            if isinstance(v, ast.Call) and not v.args and not v.keywords:
                v = v.func
            if isinstance(v, ast.Name):
                out.setdefault(v.id, set()).add(id(v))
    return out


def _names_bound(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else \
        [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For)) else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _no_parameters(a: ast.arguments) -> bool:
    return not (a.posonlyargs or a.args or a.vararg or a.kwonlyargs or a.kwarg)


def _docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


class _NotLiteral(Exception):
    pass


def _expand(comp: ast.ListComp) -> list[ast.expr]:
    out: list[ast.expr] = []
    for env in _bindings(comp.generators, {}):
        out.append(ast.copy_location(_Substitute(env).visit(_copy(comp.elt)), comp))
        if len(out) > MAX_CONFIGS:
            raise _NotLiteral
    return out


def _bindings(generators: list[ast.comprehension], env: dict[str, object]):
    """Every assignment of the loop names, in the order the comprehension runs, that passes its `if`s."""
    if not generators:
        yield env
        return
    first, rest = generators[0], generators[1:]
    if first.is_async:
        raise _NotLiteral
    for item in _iterable(_fold(first.iter, env)):
        inner = {**env, **_unpack(first.target, item)}
        if all(_truth(_fold(c, inner)) for c in first.ifs):
            yield from _bindings(rest, inner)


def _iterable(node: ast.expr) -> list[object]:
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range" \
            and not node.keywords and 1 <= len(node.args) <= 3:
        bounds = [_value(a) for a in node.args]
        if all(type(b) is int for b in bounds) and len(r := range(*bounds)) <= MAX_CONFIGS:  # type: ignore[arg-type]
            return list(r)
    raise _NotLiteral


def _unpack(target: ast.expr, item: object) -> dict[str, object]:
    if isinstance(target, ast.Name):
        return {target.id: item}
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(item, tuple) and len(item) == len(target.elts):
        return {k: v for t, i in zip(target.elts, item) for k, v in _unpack(t, i).items()}
    raise _NotLiteral


def _value(node: ast.expr) -> object:
    """A folded literal's Python value (numbers, strings, booleans, None, tuples of them)."""
    if isinstance(node, ast.Constant) and not isinstance(node.value, bytes):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_value(e) for e in node.elts)
    raise _NotLiteral


def _truth(node: ast.expr) -> bool:
    v = _value(node)
    if not isinstance(v, (bool, int)):
        raise _NotLiteral
    return bool(v)


def _copy(node: ast.expr) -> ast.expr:
    return copy.deepcopy(node)  # keeps the source positions findings name


def _fold(node: ast.expr, env: dict[str, object]) -> ast.expr:
    return _Substitute(env).visit(_copy(node))


class _Substitute(ast.NodeTransformer):
    """Loop names -> their values; integer arithmetic and comparisons on constants -> constants."""

    def __init__(self, env: dict[str, object]):
        self.env = env

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return _constant(self.env[node.id], node) if node.id in self.env else node

    def visit_Lambda(self, node: ast.Lambda) -> ast.expr:
        raise _NotLiteral  # a lambda's own names would be substituted: not a config

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_Lambda

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        node = self.generic_visit(node)  # type: ignore[assignment]
        a, b, f = _int(node.left), _int(node.right), _BINARY.get(type(node.op))
        if a is None or b is None or f is None or isinstance(node.op, (ast.Pow, ast.LShift)) and not 0 <= b <= 40:
            return node
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and b == 0:
            raise _NotLiteral
        return _constant(_bounded(f(a, b)), node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        node = self.generic_visit(node)  # type: ignore[assignment]
        a = _int(node.operand)
        if isinstance(node.op, ast.USub) and a is not None:
            return _constant(-a, node)
        if isinstance(node.op, ast.Not) and isinstance(node.operand, ast.Constant):
            return _constant(not node.operand.value, node)
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        node = self.generic_visit(node)  # type: ignore[assignment]
        values = [_int(e) for e in [node.left, *node.comparators]]
        fs = [_COMPARE.get(type(op)) for op in node.ops]
        if any(v is None for v in values) or any(f is None for f in fs):
            return node
        return _constant(all(f(a, b) for f, a, b in zip(fs, values, values[1:])), node)  # type: ignore[misc]

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.expr:
        node = self.generic_visit(node)  # type: ignore[assignment]
        if not all(isinstance(v, ast.Constant) and type(v.value) is bool for v in node.values):
            return node
        truths = [v.value for v in node.values if isinstance(v, ast.Constant)]
        return _constant(all(truths) if isinstance(node.op, ast.And) else any(truths), node)


def _int(node: ast.expr) -> int | None:
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def _bounded(v: int) -> int:
    if abs(v) > MAX_FOLDED:
        raise _NotLiteral
    return v


def _constant(v: object, at: ast.AST) -> ast.expr:
    node: ast.expr = ast.Tuple([_constant(e, at) for e in v], ast.Load()) if isinstance(v, tuple) else ast.Constant(v)
    return ast.copy_location(node, at)
