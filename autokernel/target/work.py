"""A declared op's work counts (docs/targets.md, `work`): FLOPs and bytes moved per launcher call, as arithmetic over
the call's recorded arguments, so a target's ops rank by roofline headroom as autokernel's own do
(autokernel/profile/rank.py) instead of by time share alone.

    work = { flops = "4 * X.numel", bytes = "2 * X.nbytes + W.nbytes" }

An expression is numbers, + - * / // % and ** (a constant exponent up to 4, not of a power), parentheses, min(...)
and max(...), and the launcher's parameters: a tensor's `.numel`, `.nbytes`, `.shape[i]` (i a constant, negative
from the end) and `.ndim`; an int or float argument by its name. The declaration is untrusted text: it is parsed
here into a tree of those nodes only and evaluated by walking it, never compiled or run, and the result must be a
finite, non-negative number below 2**63.
"""
from __future__ import annotations

import ast
import math
import operator

from autokernel import paths
from autokernel.errors import UserError

MAX_CHARS = 400
MAX_NODES = 200
BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
TENSOR_ATTRS = ("numel", "nbytes", "ndim")
ELEM_BYTES = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "int16": 2,
              "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
FIELDS = ("flops", "bytes")


def parse(text, where: str) -> ast.expr:
    """The checked tree of one expression; UserError naming `where` and what is not allowed."""
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_CHARS:
        raise UserError(f"{where}: an arithmetic expression over the launcher's arguments, up to {MAX_CHARS} "
                        "characters (docs/targets.md)")
    try:
        tree = paths.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise UserError(f"{where}: does not parse: {e.msg} (docs/targets.md)") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise UserError(f"{where}: more than {MAX_NODES} terms (docs/targets.md)")
    for node in nodes:
        why = _refused(node)
        if why:
            raise UserError(f"{where}: {why} is not allowed; numbers, + - * / // % ** (constant exponent <= 4), "
                            "min, max, and arguments (X.numel, X.nbytes, X.shape[i], X.ndim, n) (docs/targets.md)")
    return tree


def _refused(node: ast.AST) -> str | None:
    if isinstance(node, (ast.Name, ast.Load, ast.operator, ast.USub, ast.UAdd)) or type(node) in BINOPS:
        return None
    if isinstance(node, ast.Constant):
        return None if type(node.value) in (int, float) else f"the constant {node.value!r}"
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Pow) and not (isinstance(node.right, ast.Constant)
                                                 and type(node.right.value) is int and 0 <= node.right.value <= 4):
            return "an exponent other than a constant 0..4"
        if isinstance(node.op, ast.Pow) and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow)
                                                for n in ast.walk(node.left)):
            return "a power of a power"  # iterated, it grows past any memory
        return None if type(node.op) in BINOPS else f"the operator {type(node.op).__name__}"
    if isinstance(node, ast.UnaryOp):
        return None if isinstance(node.op, (ast.USub, ast.UAdd)) else f"the operator {type(node.op).__name__}"
    if isinstance(node, ast.Call):
        ok = isinstance(node.func, ast.Name) and node.func.id in ("min", "max") and node.args and not node.keywords
        return None if ok else "a call other than min(...) / max(...)"
    if isinstance(node, ast.Attribute):
        ok = isinstance(node.value, ast.Name) and node.attr in (*TENSOR_ATTRS, "shape")
        return None if ok else f"the attribute .{node.attr}"
    if isinstance(node, ast.Subscript):
        ok = (isinstance(node.value, ast.Attribute) and node.value.attr == "shape"
              and isinstance(node.slice, (ast.Constant, ast.UnaryOp)))
        return None if ok else "a subscript other than X.shape[i]"
    return f"{type(node).__name__}"


def evaluate(tree: ast.expr, sig: list[tuple]) -> float:
    """The expression's value on one recorded call signature ([(parameter, description)], discover's form); ValueError
    when it names what the call does not have or comes out negative, infinite or huge."""
    args = dict(sig)
    v = _eval(tree, args)
    if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 <= v < 2 ** 63):
        raise ValueError(f"came to {v!r}")
    return float(v)


def _eval(node: ast.expr, args: dict):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BinOp):
        return BINOPS[type(node.op)](_eval(node.left, args), _eval(node.right, args))
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, args)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Call):
        fn = min if node.func.id == "min" else max  # type: ignore[attr-defined]
        return fn(_eval(a, args) for a in node.args)
    if isinstance(node, ast.Name):
        d = args.get(node.id)
        if d is None or d[0] not in ("int", "float", "bool"):
            raise ValueError(f"{node.id} is not an int or float argument of the call")
        return d[1]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        shape, dtype = _tensor(args, node.value.id)
        n = math.prod(shape)
        return {"numel": n, "nbytes": n * ELEM_BYTES.get(dtype, 4), "ndim": len(shape)}[node.attr]
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
        shape, _ = _tensor(args, node.value.value.id)  # type: ignore[attr-defined]
        i = int(_eval(node.slice, args))
        if not -len(shape) <= i < len(shape):
            raise ValueError(f"shape[{i}] of a {len(shape)}-dimensional argument")
        return shape[i]
    raise ValueError(f"{type(node).__name__}")


def _tensor(args: dict, name: str) -> tuple[tuple[int, ...], str]:
    d = args.get(name)
    if d is None or d[0] != "tensor":
        raise ValueError(f"{name} is not a tensor argument of the call")
    return tuple(int(x) for x in d[2]), str(d[1])


def table(value, where: str) -> dict[str, str]:
    """The declaration's `work` table, each expression checked; UserError otherwise."""
    if not isinstance(value, dict) or set(value) != set(FIELDS):
        raise UserError(f"{where}: {{ flops = \"...\", bytes = \"...\" }}, both (docs/targets.md)")
    for k in FIELDS:
        parse(value[k], f"{where} {k}")
    return {k: value[k] for k in FIELDS}


def counts(work: dict[str, str], sig: list[tuple]) -> dict[str, float] | None:
    """{flops, bytes} of one recorded call signature, None when an expression does not apply to it."""
    try:
        return {k: evaluate(parse(work[k], k), sig) for k in FIELDS}
    except (ValueError, TypeError, ZeroDivisionError, OverflowError, UserError):
        return None
