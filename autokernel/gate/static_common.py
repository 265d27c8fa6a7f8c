"""Rules shared by the static stage's kernel and launcher grammars (autokernel/gate/static.py): literals, names,
annotations, arguments, precision, shadowing of module names, and shape special-casing in the launcher."""
from __future__ import annotations

import ast
import builtins
from typing import TYPE_CHECKING

from autokernel.gate import allowlist as A
from autokernel.paths import parse as parse  # re-exported: the gate's one parser

if TYPE_CHECKING:
    from autokernel.gate.static_facts import Facts


class BadStatement:
    """What both grammars (the kernel's and the launcher's) do with a statement they do not allow: their own
    `reject` records the finding, then what the statement holds is still checked with their `body` and `expr`, so
    every finding is reported, not only the first."""

    if TYPE_CHECKING:  # each grammar's own
        def reject(self, s: ast.stmt) -> None: ...
        def body(self, stmts: list[ast.stmt]) -> None: ...
        def expr(self, e: ast.AST) -> object: ...

    def bad_stmt(self, s: ast.stmt) -> None:
        self.reject(s)
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return  # its own scope: the definition is the finding
        for name in ("body", "orelse", "finalbody"):
            self.body(getattr(s, name, None) or [])
        for h in getattr(s, "handlers", None) or []:
            self.body(h.body)
        for item in getattr(s, "items", None) or []:
            self.expr(item.context_expr)
        if isinstance(s, ast.While):
            self.expr(s.test)


TYPE_NAMES = {f"torch.{t}" for t in A.TORCH_TYPES} | {"triton.language.constexpr", "triton.language.tensor"} | \
    {f"typing.{t}" for t in A.TYPING_NAMES}


def literal(node: ast.AST) -> bool:
    """An immutable literal: a constant, or a tuple/list of them (lists only where the callee copies them)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return literal(node.operand)
    return isinstance(node, (ast.Tuple, ast.List)) and all(literal(e) for e in node.elts)


def name_why(name: str, where: str) -> tuple[str, str]:
    """The reason and text for a name the grammar does not bind."""
    if name.startswith("__"):
        return "static.forbidden_attribute", f"{name} in {where}: dunder names are introspection (module name, " \
                                             "file, builtins) and tell the gate from production"
    if hasattr(builtins, name):
        return "static.forbidden_call", f"{name} in {where}: not an allowlisted builtin (introspection, dynamic " \
                                        "code, I/O or state)"
    return "static.forbidden_call", f"{name} in {where}: not defined in this file nor allowlisted"


def in_compares(fn: ast.AST) -> set[int]:
    """Nodes inside a comparison: a narrow dtype named there only yields a bool (`if x.dtype == tl.float16`)."""
    return {id(n) for c in ast.walk(fn) if isinstance(c, ast.Compare) for n in ast.walk(c)}


def narrow(e: ast.AST, q: str | None, compares: set[int], facts: Facts) -> None:
    """A narrow float dtype named anywhere but in a comparison computes or stores in it: static.precision."""
    if q in A.NARROW_DTYPES and id(e) not in compares:
        facts.add("static.precision", e, f"{ast.unparse(e)[:40]} ({q.split('.')[-1]}) outside a comparison: computes "
                                         "or stores in a narrower float than the data; use the data's own dtype "
                                         "(x.dtype, ptr.dtype.element_ty)")


def precision(call: ast.Call, facts: Facts) -> None:
    """Reduced-precision switches in a call's keywords (tf32 products): static.precision."""
    for k in call.keywords:
        v = k.value
        if k.arg == "allow_tf32" and not (isinstance(v, ast.Constant) and v.value is False) or \
                k.arg == "input_precision" and not (isinstance(v, ast.Constant) and v.value == A.DOT_PRECISION) or \
                k.arg == "max_num_imprecise_acc" and not (isinstance(v, ast.Constant) and v.value in (None, 0)):
            facts.add("static.precision", call, f"{k.arg}={ast.unparse(v)[:30]}: reduced-precision products")


def shadows(name: str, facts: Facts) -> bool:
    """A local that hides a module-level name would let `math.floor(t)` mean `t.floor()`: never allowed."""
    return name in facts.aliases or name in facts.jit or name in facts.launchers


def check_annotation(node: ast.AST, facts: Facts) -> None:
    """Annotations are evaluated at import (without `from __future__ import annotations`): types only."""
    if not _annotation_ok(node, facts):
        facts.add("static.forbidden_syntax", node, f"annotation {ast.unparse(node)[:40]}: annotations run at import; "
                                                   "use types (torch.Tensor, int, tl.constexpr, ...)")


def _annotation_ok(n: ast.AST, facts: Facts) -> bool:
    if isinstance(n, ast.Constant):
        return n.value is None or n.value is Ellipsis or isinstance(n.value, str)
    if isinstance(n, ast.Name):
        return n.id in A.HOST_TYPES and n.id not in facts.aliases or facts.aliases.get(n.id) in TYPE_NAMES
    if isinstance(n, ast.Attribute):
        return facts.qual(n) in TYPE_NAMES
    if isinstance(n, ast.Subscript):
        return _annotation_ok(n.value, facts) and _annotation_ok(n.slice, facts)
    if isinstance(n, ast.Tuple):
        return all(_annotation_ok(e, facts) for e in n.elts)
    if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr):
        return _annotation_ok(n.left, facts) and _annotation_ok(n.right, facts)
    return False


def check_arguments(fn: ast.FunctionDef | ast.Lambda, facts: Facts) -> None:
    a = fn.args
    for d in a.defaults + [d for d in a.kw_defaults if d is not None]:
        if not (literal(d) and not isinstance(d, ast.List)):
            facts.add("static.mutable_state", d, f"default {ast.unparse(d)[:40]}: defaults are immutable literals "
                                                 "(a mutable default keeps state across calls)")
    for p in a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p]:
        if p.annotation is not None:
            check_annotation(p.annotation, facts)


# --- shape special-casing ------------------------------------------------------------------------------------------

def shape_special_cases(fn: ast.FunctionDef, facts: Facts) -> None:
    """`if (M, N) == (64, 576)`: an equality between a shape and a literal other than 0/1, anywhere but an assert,
    special-cases the shapes tests use."""
    derived: set[str] = set()
    for _ in range(3):  # names derived from names derived from shapes, a few levels deep
        for node in ast.walk(fn):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                if shape_derived(node.value, derived):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    derived.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.For) and shape_derived(node.iter, derived):
                derived.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
    in_assert = {id(n) for a in ast.walk(fn) if isinstance(a, ast.Assert) for n in ast.walk(a.test)}
    for cmp in (n for n in ast.walk(fn) if isinstance(n, ast.Compare) and id(n) not in in_assert):
        operands = [cmp.left] + cmp.comparators
        hit = any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)) and
                  (shape_derived(x, derived) and special(y) or shape_derived(y, derived) and special(x))
                  for op, x, y in zip(cmp.ops, operands, operands[1:]))
        if hit:
            facts.add("static.shape_special_case", cmp, f"{ast.unparse(cmp)[:60]} in {fn.name}: a shape equal to a "
                                                        "literal special-cases the shapes tests use")


def shape_derived(node: ast.AST, derived: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in derived
    if isinstance(node, ast.Attribute):
        return node.attr == "shape"
    if isinstance(node, ast.Subscript):
        return shape_derived(node.value, derived)
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in ("size", "numel", "stride", "nelement"):
            return True
        return isinstance(f, ast.Name) and f.id in ("min", "max", "abs", "int", "tuple", "list") and \
            any(shape_derived(a, derived) for a in node.args)
    if isinstance(node, ast.BinOp):
        return shape_derived(node.left, derived) or shape_derived(node.right, derived)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(shape_derived(e, derived) for e in node.elts)
    if isinstance(node, ast.Starred):
        return shape_derived(node.value, derived)
    return False


def special(node: ast.AST) -> bool:
    """An int literal other than 0/1 (or a tuple/list/set holding one): a specific size, not a divisibility test."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool) and node.value not in (0, 1)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return special(node.operand)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(special(e) for e in node.elts)
    return False


# --- bit reinterpretation (a precision cheat with no narrow dtype in sight) -----------------------------------------

def reinterpretations(tree: ast.AST) -> frozenset[str]:
    """What bit reinterpretation a (trusted, incumbent) kernel file uses, read syntactically: "bitcast" for a
    `.to(..., bitcast=True)` / `tl.cast(..., bitcast=True)`, "pointer_type:<dtype>" for each pointer re-typing,
    "view_dtype" for a host `.view(torch.<dtype>)`. A candidate may use what its incumbent does, nothing more."""
    out = set()
    for c in ast.walk(tree):
        if not isinstance(c, ast.Call):
            continue
        f = c.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in ("to", "cast") and _bitcast_arg(c, method=isinstance(f, ast.Attribute) and
                                                   ast.unparse(f.value) not in ("tl", "triton.language")):
            out.add("bitcast")
        elif name == "pointer_type" and c.args:
            out.add(f"pointer_type:{ast.unparse(c.args[0]).rpartition('.')[2]}")
        elif name == "view" and len(c.args) == 1 and ast.unparse(c.args[0]).startswith("torch."):
            out.add("view_dtype")
    return frozenset(out)


def _bitcast_arg(c: ast.Call, method: bool) -> ast.AST | None:
    """The bitcast argument of a `.to()`/`.cast()` method call or a `tl.cast()` call, unless it is literally off."""
    index = 2 if method else 3  # to(dtype, fp_downcast_rounding, bitcast) / cast(input, dtype, rounding, bitcast)
    arg = next((k.value for k in c.keywords if k.arg == "bitcast"), c.args[index] if len(c.args) > index else None)
    if arg is None or isinstance(arg, ast.Constant) and arg.value in (None, False, 0):
        return None
    return arg


def reinterpret(c: ast.Call, facts: Facts, method: bool) -> None:
    """A kernel call that reinterprets bits: `x.to(tl.int32, bitcast=True)`, `tl.cast(x, ..., bitcast=True)`, or a
    pointer re-typed to another element type (`p.to(tl.pointer_type(tl.int32))`). Masking the mantissa of a float's
    bits and casting back is a narrower float with no narrow dtype named (static.precision); reading a buffer
    through another element type is the same trick on memory. Allowed only where the incumbent kernels/<op>.py
    does the same kind (matmul_q4_1 reads its packed codes as uint32 words)."""
    f = c.func
    name = f.attr if isinstance(f, ast.Attribute) else None
    q = facts.qual(f)
    if q == "triton.language.pointer_type":
        target = facts.qual(c.args[0]) if c.args else None
        kind = f"pointer_type:{(target or '?').rpartition('.')[2]}"
        if not (target and target.startswith("triton.language.")) or kind not in facts.reinterpret:
            allowed = sorted(k.partition(":")[2] for k in facts.reinterpret if k.startswith("pointer_type:"))
            facts.add("static.precision", c, f"{ast.unparse(c)[:50]}: reads memory as another element type (bit "
                                             f"reinterpretation); kernels/{facts.op}.py re-types " +
                                             (f"pointers to {', '.join(allowed)} only" if allowed else "no pointer"))
        return
    if q == "triton.language.cast" or name in ("to", "cast") and q is None:
        if _bitcast_arg(c, method=q is None) is not None and \
                "bitcast" not in facts.reinterpret:
            facts.add("static.precision", c, f"{ast.unparse(c)[:50]}: reinterprets the bits (a float's mantissa "
                                             "masked as an integer is a narrower float; a pointer's bits are where "
                                             f"the data lives); kernels/{facts.op}.py uses no bitcast")


def host_view_dtype(c: ast.Call, facts: Facts) -> None:
    """`x.view(torch.int32)` in the launcher: the kernel then sees the data's bits as integers (see reinterpret)."""
    if "view_dtype" not in facts.reinterpret:
        facts.add("static.precision", c, f"{ast.unparse(c)[:50]}: views the data as another dtype (bit "
                                         f"reinterpretation); kernels/{facts.op}.py does not")
