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
from typing import TYPE_CHECKING

from autokernel.gate import allowlist as A
from autokernel.gate.static_common import (
    BadStatement,
    check_annotation,
    check_arguments,
    in_compares,
    name_why,
    narrow,
    precision,
    reinterpret,
    shadows,
)

if TYPE_CHECKING:
    from autokernel.gate.static_facts import Facts

TL = "triton.language."


def is_jit(d: ast.expr, facts: Facts) -> bool:
    return facts.qual(d.func if isinstance(d, ast.Call) else d) == "triton.jit"


# --- kernel bodies ---------------------------------------------------------------------------------------------------

def check_kernel(fn: ast.FunctionDef, facts: Facts) -> None:
    _Kernel(fn, facts).run()


class _Kernel(BadStatement):
    def __init__(self, fn: ast.FunctionDef, facts: Facts):
        self.fn, self.facts = fn, facts
        a = fn.args
        self.locals = {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                self.locals.add(n.id)
        self.where = f"@triton.jit {fn.name}"
        self.compares = in_compares(fn)
        for name in sorted(self.locals):
            if shadows(name, facts):
                facts.add("static.forbidden_syntax", fn, f"{name} in {self.where}: a parameter or local that rebinds a "
                                                         "module-level name (a module or a kernel)")

    def add(self, reason: str, node: ast.AST, detail: str) -> None:
        self.facts.add(reason, node, f"{detail} ({self.where})")

    def add_name(self, node: ast.AST, name: str, where: str) -> None:
        reason, detail = name_why(name, where)
        if name not in self.facts.rejected:  # else its definition's finding says why
            self.facts.add(reason, node, detail)

    def run(self) -> None:
        check_arguments(self.fn, self.facts)
        if self.fn.returns is not None:
            check_annotation(self.fn.returns, self.facts)
        for s in self.fn.body:
            self.stmt(s)
        grid_special_cases(self.fn, self.facts, self.where)

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
        reinterpret(c, self.facts, method=isinstance(f, ast.Attribute))
        if self.facts.qual(f) == TL + "dot" and not any(k.arg == "input_precision" or k.arg == "allow_tf32"
                                                        for k in c.keywords):  # allow_tf32=False (checked by
            # precision() above) is Triton's older spelling of input_precision="ieee"
            self.add("static.precision", c, f"{ast.unparse(c)[:50]}: tl.dot without input_precision=\""
                                            f"{A.DOT_PRECISION}\" multiplies fp32 in tf32 on a GPU")


# --- the grid's size as a switch -------------------------------------------------------------------------------------

_STEP_OPS = (ast.FloorDiv, ast.Mod, ast.RShift, ast.BitAnd, ast.BitOr, ast.BitXor)  # step functions of their input
_CLAMPS = {"min", "max", TL + "minimum", TL + "maximum", TL + "clamp"}  # a clamp of the grid size is a threshold


class _GridNames:
    """The kernel's names derived from the grid's size (tl.num_programs), a few assignments deep, and whether an
    expression uses one. An index that walks the rows in grid-sized steps (`row += nprog`, `row = pid + i * nprog`,
    as `tl.range(pid, M, nprog)` does: a persistent kernel written with while or a counted loop) is not one:
    comparing it with the row count is a per-row decision like program_id's."""

    def __init__(self, fn: ast.FunctionDef, facts: Facts):
        self.facts, self.names, self.pids = facts, set[str](), set[str]()
        for _ in range(3):  # names derived from tl.program_id: where a grid-strided walk starts
            for n in ast.walk(fn):
                if isinstance(n, ast.Assign) and self._from_pid(n.value):
                    self.pids.update(t.id for tg in n.targets for t in ast.walk(tg) if isinstance(t, ast.Name))
        for _ in range(3):
            for n in ast.walk(fn):
                if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None and \
                        self.derived(n.value) and not self._walk_index(n):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    self.names.update(t.id for tg in targets for t in ast.walk(tg) if isinstance(t, ast.Name))

    def derived(self, e: ast.AST) -> bool:
        return any(self._size(n) for n in ast.walk(e))

    def _size(self, e: ast.AST) -> bool:
        return isinstance(e, ast.Call) and self.facts.qual(e.func) == TL + "num_programs" or \
            isinstance(e, ast.Name) and e.id in self.names

    def _stride(self, e: ast.AST) -> bool:
        """The grid's size, or a multiple of it by something else: one step of a grid-strided walk."""
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
            grid_left, grid_right = self.derived(e.left), self.derived(e.right)
            return grid_left != grid_right and self._stride(e.left if grid_left else e.right)
        return self._size(e)

    def _from_pid(self, e: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and self.facts.qual(n.func) == TL + "program_id" or
                   isinstance(n, ast.Name) and n.id in self.pids for n in ast.walk(e))

    def _walk_index(self, n: ast.Assign | ast.AugAssign | ast.AnnAssign) -> bool:
        """A program's index stepped by the grid: `row += nprog` where row starts at the program id, or `pid + i *
        nprog` (never `n = 0; n += nprog`, which is the grid's size again)."""
        if isinstance(n, ast.AugAssign):
            return isinstance(n.op, ast.Add) and isinstance(n.target, ast.Name) and n.target.id in self.pids \
                and self._stride(n.value)
        v = n.value
        return isinstance(v, ast.BinOp) and isinstance(v.op, ast.Add) and any(
            not self.derived(a) and self._from_pid(a) and self._stride(b) for a, b in ((v.left, v.right),
                                                                                      (v.right, v.left)))


def grid_special_cases(fn: ast.FunctionDef, facts: Facts, where: str) -> None:
    """`if tl.num_programs(0) > 64:` (or == 97, min(nprog, 64), nprog // 64, `nprog > M * 0 + 64`, through locals): a
    kernel that behaves one way on small grids and another on large ones. The grid's size is a shape, and unlike a
    threshold on M the numeric stage's sweep cannot aim at it: how many programs a given M makes depends on block
    sizes, heuristics and autotune configs, and a window (== 97) is missed by any sweep. What the "other side" is
    cannot be trusted either: arithmetic turns any run-time value into a constant (`M * 0 + 64`). So the grid's size
    (and any local derived from it) may feed range() bounds and strides (persistent kernels) and + - * arithmetic,
    never a decision: no comparison, no condition (if / while / ternary / tl.where / assert / and-or), no step function
    (// % >> & | ^), no clamp (min / max / tl.minimum / tl.maximum / tl.clamp): static.shape_special_case.
    tl.program_id compared with a constant is left to the numeric stage: program p runs in every grid larger than
    p, so every case past the threshold exercises the other branch (and a literal threshold gets cases on both sides,
    autokernel/gate/thresholds.py)."""
    is_grid = _GridNames(fn, facts).derived
    for n in ast.walk(fn):
        if isinstance(n, ast.Compare):
            parts = [n.left, *n.comparators]
        elif isinstance(n, ast.BoolOp):
            parts = list(n.values)
        elif isinstance(n, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            parts = [n.test]
        elif isinstance(n, ast.BinOp) and isinstance(n.op, _STEP_OPS):
            parts = [n.left, n.right]
        elif isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            parts = [n.operand]
        elif isinstance(n, ast.Call) and (facts.qual(n.func) in _CLAMPS | {TL + "where"} or
                                          isinstance(n.func, ast.Name) and n.func.id in ("min", "max")):
            parts = n.args[:1] if facts.qual(n.func) == TL + "where" else list(n.args)
        else:
            continue
        if any(is_grid(a) for a in parts):
            facts.add("static.shape_special_case", n, f"{ast.unparse(n)[:60]} in {where}: the grid's size "
                                                      "(tl.num_programs) in a decision switches behaviour by grid "
                                                      "size; use it only for range() bounds and strides")
