"""The grammar of @triton.jit kernels and their decorators (the static stage, autokernel/gate/static.py).

Under TRITON_INTERPRET=1 a kernel body runs as ordinary Python, so this grammar is what keeps it a kernel: every
name must be a local, a parameter, a module constant, another @triton.jit function of the file, an allowlisted tl
name or builtin; every attribute an allowlisted tl name or a method/attribute of tl values (never .handle, .data,
.fn, dunders); statements are assignments, if, for over range / tl.range / tl.static_range, while, assert, return.
Decorators: triton.jit, triton.heuristics of literal-keyed lambdas over args[...], triton.autotune of literal
triton.Config lists, never a hook. Tables: autokernel/gate/allowlist.py.
"""
from __future__ import annotations

import ast
import builtins
from typing import TYPE_CHECKING

from autokernel.gate import allowlist as A

if TYPE_CHECKING:
    from autokernel.gate.static import Facts

TL = "triton.language."


def is_jit(d: ast.expr, facts: Facts) -> bool:
    return facts.qual(d.func if isinstance(d, ast.Call) else d) == "triton.jit"


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


# --- decorators -----------------------------------------------------------------------------------------------------

def check_decorators(fn: ast.FunctionDef, facts: Facts) -> None:
    *outer, jit = fn.decorator_list
    if isinstance(jit, ast.Call):
        if jit.args:
            facts.add("static.forbidden_call", jit, "triton.jit(...) takes keyword options only")
        for k in jit.keywords:
            if k.arg not in A.JIT_KWARGS or not literal(k.value):
                facts.add("static.forbidden_call", jit, f"triton.jit({k.arg}=...): only literal "
                                                        f"{', '.join(sorted(A.JIT_KWARGS))}")
    for d in outer:
        q = facts.qual(d.func) if isinstance(d, ast.Call) else None
        if q == "triton.heuristics":
            _heuristics(d, facts)
        elif q == "triton.autotune":
            _autotune(d, facts)
        else:
            facts.add("static.forbidden_call", d, f"@{ast.unparse(d)[:50]} on {fn.name}: only triton.autotune and "
                                                  "triton.heuristics may wrap a @triton.jit kernel")


def _heuristics(d: ast.Call, facts: Facts) -> None:
    if d.keywords or len(d.args) != 1 or not isinstance(d.args[0], ast.Dict):
        facts.add("static.forbidden_call", d, "triton.heuristics takes one literal dict {'NAME': lambda args: ...}")
        return
    for k, v in zip(d.args[0].keys, d.args[0].values):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            facts.add("static.forbidden_syntax", d, "triton.heuristics keys are string literals")
        a = v.args if isinstance(v, ast.Lambda) else None
        if a is None or len(a.args) != 1 or a.defaults or a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs:
            facts.add("static.forbidden_syntax", v, "a heuristic is `lambda args: <expression>`")
            continue
        _heuristic_expr(v.body, a.args[0].arg, facts)


def _heuristic_expr(e: ast.AST, param: str, facts: Facts) -> None:
    """Arithmetic on args['name'], literals and module constants; min/max/abs, triton.cdiv/next_power_of_2, math."""
    if isinstance(e, ast.Constant) or isinstance(e, ast.Name) and e.id in facts.constants:
        return
    if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Name) and e.value.id == param:
        if not (isinstance(e.slice, ast.Constant) and isinstance(e.slice.value, str)):
            facts.add("static.forbidden_syntax", e, f"{ast.unparse(e)[:40]}: index args with a string literal")
        return
    if isinstance(e, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Tuple)):
        if isinstance(e, ast.Compare):
            from autokernel.gate.static_host import _special
            ops = [e.left] + e.comparators
            if any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) and (_special(a) or _special(b))
                   for op, a, b in zip(e.ops, ops, ops[1:])):
                facts.add("static.shape_special_case", e, f"{ast.unparse(e)[:50]} in a heuristic: a size equal to a "
                                                          "literal special-cases the shapes tests use")
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.MatMult):
            facts.add("static.forbidden_call", e, "@ in a heuristic: compute outside the kernel")
        for child in ast.iter_child_nodes(e):
            if isinstance(child, ast.expr):
                _heuristic_expr(child, param, facts)
        return
    if isinstance(e, ast.Call) and not e.keywords:
        q = facts.qual(e.func)
        if isinstance(e.func, ast.Name) and e.func.id in A.HEURISTIC_BUILTINS and e.func.id not in facts.aliases or \
                q in {f"triton.{n}" for n in A.TRITON_HOST} | {f"math.{n}" for n in A.MATH_FUNCTIONS}:
            for a in e.args:
                _heuristic_expr(a, param, facts)
            return
        facts.add("static.forbidden_call", e, f"{ast.unparse(e)[:50]} in a heuristic: only min/max/abs, "
                                              "triton.cdiv/next_power_of_2 and math functions")
        return
    facts.add("static.forbidden_syntax", e, f"{ast.unparse(e)[:50]} in a heuristic: arithmetic on args['name'] "
                                            "and literals only")


def _autotune(d: ast.Call, facts: Facts) -> None:
    if d.args:
        facts.add("static.forbidden_call", d, "triton.autotune takes configs=[...] and key=[...] by keyword")
    for k in d.keywords:
        if k.arg not in A.AUTOTUNE_KWARGS:
            facts.add("static.forbidden_call", d, f"triton.autotune({k.arg}=...): only configs and key (hooks and "
                                                  "custom benchmarking run arbitrary code around the launch)")
        elif k.arg == "key" and not (isinstance(k.value, (ast.List, ast.Tuple)) and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in k.value.elts)):
            facts.add("static.forbidden_syntax", d, "triton.autotune key=[...] lists string literals")
        elif k.arg == "configs":
            if not isinstance(k.value, (ast.List, ast.Tuple)):
                facts.add("static.forbidden_syntax", d, "triton.autotune configs=[triton.Config(...), ...] literal")
                continue
            for c in k.value.elts:
                _config(c, facts)


def _config(c: ast.AST, facts: Facts) -> None:
    if not (isinstance(c, ast.Call) and facts.qual(c.func) == "triton.Config"):
        facts.add("static.forbidden_syntax", c, f"{ast.unparse(c)[:40]}: configs are triton.Config(...) literals")
        return
    meta = c.args[0] if c.args else None
    ok = len(c.args) == 1 and isinstance(meta, ast.Dict) and all(
        isinstance(k, ast.Constant) and isinstance(k.value, str) for k in meta.keys) and all(
        literal(v) for v in meta.values)
    if not ok:
        facts.add("static.forbidden_syntax", c, "triton.Config({'NAME': literal, ...}, num_warps=..): literals only")
    for k in c.keywords:
        if k.arg not in A.CONFIG_KWARGS:
            facts.add("static.forbidden_call", c, f"triton.Config({k.arg}=...): only "
                                                  f"{', '.join(sorted(A.CONFIG_KWARGS))} (a hook runs code)")
        elif not literal(k.value):
            facts.add("static.forbidden_syntax", c, f"triton.Config({k.arg}=...): a literal")


# --- kernel bodies ---------------------------------------------------------------------------------------------------

def check_kernel(fn: ast.FunctionDef, facts: Facts) -> None:
    _Kernel(fn, facts).run()


class _Kernel:
    def __init__(self, fn: ast.FunctionDef, facts: Facts):
        self.fn, self.facts = fn, facts
        a = fn.args
        self.locals = {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                self.locals.add(n.id)
        self.where = f"@triton.jit {fn.name}"
        self.compares = in_compares(fn)
        from autokernel.gate.static_host import shadows
        for n in sorted(self.locals):
            if shadows(n, facts):
                facts.add("static.forbidden_syntax", fn, f"{n} in {self.where}: a parameter or local that rebinds a "
                                                         "module-level name (a module or a kernel)")

    def add(self, reason: str, node: ast.AST, detail: str) -> None:
        self.facts.add(reason, node, f"{detail} ({self.where})")

    def add_name(self, node: ast.AST, name: str, where: str) -> None:
        reason, detail = name_why(name, where)
        if name not in self.facts.rejected:  # else its definition's finding says why
            self.facts.add(reason, node, detail)

    def run(self) -> None:
        from autokernel.gate.static_host import check_annotation, check_arguments
        check_arguments(self.fn, self.facts)
        if self.fn.returns is not None:
            check_annotation(self.fn.returns, self.facts)
        for s in self.fn.body:
            self.stmt(s)

    # statements ------------------------------------------------------------------------------------------------------
    def stmt(self, s: ast.stmt) -> None:
        if isinstance(s, ast.Assign):
            for t in s.targets:
                self.target(t)
            self.expr(s.value)
        elif isinstance(s, ast.AugAssign):
            self.target(s.target, plain=True)
            self.expr(s.value)
        elif isinstance(s, ast.AnnAssign):
            from autokernel.gate.static_host import check_annotation
            self.target(s.target, plain=True)
            check_annotation(s.annotation, self.facts)
            if s.value is not None:
                self.expr(s.value)
        elif isinstance(s, ast.Expr):
            if not (isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)):
                self.expr(s.value)
        elif isinstance(s, (ast.If, ast.While)):
            self.expr(s.test)
            self.body(s.body + s.orelse)
        elif isinstance(s, ast.For):
            self.target(s.target)
            it = s.iter
            q = self.facts.qual(it.func) if isinstance(it, ast.Call) else None
            if not (isinstance(it, ast.Call) and (isinstance(it.func, ast.Name) and it.func.id == "range"
                                                   or q in (TL + "range", TL + "static_range"))):
                self.add("static.forbidden_syntax", s, f"for ... in {ast.unparse(it)[:40]}: kernels loop over "
                                                       "range, tl.range or tl.static_range")
            if s.orelse:
                self.add("static.forbidden_syntax", s, "for ... else: Triton cannot compile it")
            self.expr(it)
            self.body(s.body)
        elif isinstance(s, (ast.Return, ast.Assert)):
            for child in ast.iter_child_nodes(s):
                self.expr(child)
        elif isinstance(s, ast.Pass):
            pass
        else:
            self.bad_stmt(s)

    def body(self, stmts: list[ast.stmt]) -> None:
        for s in stmts:
            self.stmt(s)

    def bad_stmt(self, s: ast.stmt) -> None:
        self.reject(s)
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return  # its own scope: the definition is the finding
        for name in ("body", "orelse", "finalbody"):  # every finding, not only the first: check what it holds
            self.body(getattr(s, name, None) or [])
        for h in getattr(s, "handlers", None) or []:
            self.body(h.body)
        for item in getattr(s, "items", None) or []:
            self.expr(item.context_expr)
        if isinstance(s, ast.While):
            self.expr(s.test)

    def reject(self, s: ast.stmt) -> None:
        kind = type(s).__name__
        if isinstance(s, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            self.add("static.fallback", s, "try in a kernel: a failure must surface, not fall back")
        elif isinstance(s, (ast.Global, ast.Nonlocal)):
            self.add("static.mutable_state", s, f"{kind.lower()} {', '.join(s.names)}: state kept across calls")
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            self.add("static.forbidden_import", s, "import inside a function: imports are at the top")
        elif isinstance(s, (ast.Break, ast.Continue)):
            self.add("static.forbidden_syntax", s, f"{kind.lower()}: Triton cannot compile it (use a mask or tl.where)")
        else:
            self.add("static.forbidden_syntax", s, f"{kind} statement: not part of a kernel")

    def target(self, t: ast.AST, plain: bool = False) -> None:
        if isinstance(t, ast.Name):
            return
        if isinstance(t, ast.Tuple) and not plain:
            for e in t.elts:
                self.target(e)
            return
        if isinstance(t, ast.Attribute):
            self.add("static.mutable_state", t, f"assigns {ast.unparse(t)[:50]}: a kernel sets no attributes")
        else:
            self.add("static.forbidden_syntax", t, f"assigns {ast.unparse(t)[:50]}: kernels assign plain names "
                                                   "(write memory with tl.store)")

    # expressions -----------------------------------------------------------------------------------------------------
    def expr(self, e: ast.AST) -> None:
        if isinstance(e, ast.Constant):
            return
        if isinstance(e, ast.Name):
            self.name(e)
        elif isinstance(e, ast.Attribute):
            self.attribute(e, called=False)
        elif isinstance(e, ast.Call):
            self.call(e)
        elif isinstance(e, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Tuple, ast.List,
                            ast.JoinedStr, ast.FormattedValue)):
            for child in ast.iter_child_nodes(e):
                if isinstance(child, ast.expr):
                    self.expr(child)
        elif isinstance(e, ast.Subscript):
            self.expr(e.value)
            for idx in (e.slice.elts if isinstance(e.slice, ast.Tuple) else [e.slice]):
                ok = isinstance(idx, ast.Constant) and (idx.value is None or idx.value is Ellipsis or
                                                        type(idx.value) is int) or \
                    isinstance(idx, ast.Slice) and idx.lower is None and idx.upper is None and idx.step is None
                if not ok:
                    self.add("static.forbidden_syntax", e, f"{ast.unparse(e)[:40]}: kernel indexing is [:, None] "
                                                           "style (load with offsets instead)")
        else:
            kind = type(e).__name__
            self.add("static.forbidden_syntax", e, f"{kind} ({ast.unparse(e)[:40]}): not part of a kernel")

    def name(self, e: ast.Name) -> None:
        n = e.id
        if n.startswith("__"):
            return  # reported by static._dunders
        if n in self.facts.constants and n not in self.locals:
            narrow(e, self.facts.constants[n], self.compares, self.facts)
        if n in self.locals or n in self.facts.constants or n in self.facts.jit:
            return
        if n in self.facts.aliases:
            q = self.facts.aliases[n]
            if q in A.IMPORTS:
                self.add("static.forbidden_attribute", e, f"{n}: a module used as a value; use its allowlisted names")
            else:
                self.qualified(e, q)
        else:
            self.add_name(e, n, "a kernel")

    def attribute(self, e: ast.Attribute, called: bool) -> None:
        a = e.attr
        q = self.facts.qual(e)
        if q is not None:
            self.qualified(e, q, called)
            return
        if a.startswith("__"):
            pass  # reported by static._dunders
        elif a.startswith("_"):
            self.add("static.forbidden_attribute", e, f".{a}: private and dunder attributes are interpreter "
                                                      "internals (handles, raw data, the Python function)")
        elif called and a not in A.KERNEL_METHODS or not called and a not in A.KERNEL_ATTRS:
            what = "method" if called else "attribute"
            self.add("static.forbidden_attribute", e, f".{a}: not an allowlisted {what} of tl values (.handle, "
                                                      ".data, .fn and the like reach the interpreter's internals)")
        self.expr(e.value)

    def qualified(self, e: ast.AST, q: str, called: bool = False) -> None:
        if q.rpartition(".")[2].startswith("__"):
            return  # reported by static._dunders
        narrow(e, q, self.compares, self.facts)
        name = q[len(TL):] if q.startswith(TL) else None
        if name in A.TL_FUNCTIONS or q.startswith(TL + "math.") and q[len(TL + "math."):] in A.TL_MATH:
            return
        if q in {f"math.{c}" for c in A.MATH_CONSTANTS} or q in self.facts.constants.values():
            return
        if name in A.TL_POLICY:
            if not self.facts.allow_inline_asm:
                self.add("static.forbidden_call", e, f"tl.{name}: opaque device code; allowed only when the "
                                                     f"policy sets {A.TL_POLICY[name]}")
            return
        if called:
            self.add("static.forbidden_call", e, f"{q}(...): not an allowlisted tl function; a kernel calls tl "
                                                 "functions and @triton.jit functions only")
        else:
            self.add("static.forbidden_attribute", e, f"{q}: not an allowlisted tl name inside a kernel")

    def call(self, c: ast.Call) -> None:
        f = c.func
        if isinstance(f, ast.Name):
            if f.id.startswith("__"):
                pass  # reported by static._dunders
            elif f.id in A.KERNEL_BUILTINS and f.id not in self.locals and f.id not in self.facts.aliases or \
                    f.id in self.facts.jit:
                pass
            elif f.id in self.facts.aliases:
                self.qualified(f, self.facts.aliases[f.id], called=True)
            elif f.id in self.locals:
                self.add("static.forbidden_call", c, f"{f.id}(...): calls a variable; call tl functions and "
                                                     "@triton.jit functions by name")
            else:
                self.add_name(c, f.id, "a kernel")
        elif isinstance(f, ast.Attribute):
            self.attribute(f, called=True)
        else:
            self.add("static.forbidden_call", c, f"{ast.unparse(f)[:40]}(...): calls the result of an expression")
            self.expr(f)
        for a in c.args:
            if isinstance(a, ast.Starred):
                self.add("static.forbidden_syntax", a, "*args in a kernel call")
            self.expr(a.value if isinstance(a, ast.Starred) else a)
        for k in c.keywords:
            if k.arg is None:
                self.add("static.forbidden_syntax", k.value, "**kwargs in a kernel call")
            self.expr(k.value)
        precision(c, self.facts)
        if self.facts.qual(f) == TL + "dot" and not any(k.arg == "input_precision" for k in c.keywords):
            self.add("static.precision", c, f"{ast.unparse(c)[:50]}: tl.dot without input_precision=\""
                                            f"{A.DOT_PRECISION}\" multiplies fp32 in tf32 on a GPU")
