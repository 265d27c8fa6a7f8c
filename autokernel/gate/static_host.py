"""The grammar of the launcher (the static stage, autokernel/gate/static.py): allocate, compute a grid, launch.

Every expression gets a kind (tensor, scalar, shape, dtype, device, ...): the launcher's parameters take theirs from
the incumbent's annotations, locals from what is assigned to them. That is what lets a grammar refuse compute on
the host without a ban list: any operator, comparison, truth test, indexing by a tensor or scalar conversion whose
operand may be a tensor is torch compute or a read of the data (sniffing, memoising on sampled elements, .tolist()
loops), and the work belongs in the kernel. Calls are allowlisted builtins, torch allocation, triton.cdiv /
next_power_of_2, math, and tensor view/metadata methods called directly (a method stored in a variable, a called
variable and a module used as a value are refused, so nothing reaches a call the allowlist did not see).
Statements: assignment to plain names, augmented assignment, assert, if/else, for over range or a shape, raise,
return, kernel launches `kernel[grid](...)`, and `grid = lambda meta: (...)`. Tables: autokernel/gate/allowlist.py.
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any, Callable

from autokernel.gate import allowlist as A
from autokernel.gate.static_common import (
    BadStatement,
    check_annotation,
    check_arguments,
    in_compares,
    precision,
    shadows,
    shape_special_cases,
)
from autokernel.gate.static_kinds import (
    ANY,
    DT,
    DV,
    INFO,
    META,
    SH,
    TENSORISH,
    TS,
    TYPE,
    G,
    Kinds,
    S,
    T,
    dispatch,
    is_launch,
)

if TYPE_CHECKING:
    from autokernel.gate.static_facts import Facts


def launches(fn: ast.FunctionDef, facts: Facts) -> bool:
    return any(isinstance(n, ast.Expr) and is_launch(n.value, facts) for n in ast.walk(fn))


def annotation_kind(ann: ast.AST | None) -> frozenset:
    if ann is None:
        return frozenset({ANY})
    text = ast.unparse(ann).replace("'", "").replace('"', "")
    kinds = set()
    for part in text.split("|"):
        part = part.strip()
        kinds.add({"torch.Tensor": T, "Tensor": T, "torch.dtype": DT, "int": S, "float": S, "bool": S, "str": S,
                   "None": S}.get(part, SH if part.startswith(("tuple[int", "list[int", "torch.Size")) else ANY))
    return frozenset(kinds)


def check_launcher(fn: ast.FunctionDef, facts: Facts) -> None:
    check_arguments(fn, facts)
    if fn.returns is not None:
        check_annotation(fn.returns, facts)
    if fn.args.vararg or fn.args.kwarg:
        facts.add("static.signature", fn, f"{fn.name}: *args/**kwargs hide the parameters")
    ref = facts.reference.get(fn.name, {}).get("annotations", {})
    params = {}
    for p in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
        params[p.arg] = annotation_kind(ref.get(p.arg, p.annotation))
    h = _Host(fn, facts, params)
    h.run()
    shape_special_cases(fn, facts)


class _Host(Kinds, BadStatement):
    """The statement half of a launcher checker (expressions: static_kinds.Kinds)."""

    def __init__(self, fn: ast.FunctionDef, facts: Facts, params: dict[str, frozenset]):
        self.fn, self.facts, self.env = fn, facts, dict(params)
        self.report = False
        self.where = f"launcher {fn.name}"
        self.compares = in_compares(fn)

    def run(self) -> None:
        for _ in range(4):  # kinds of locals: a few passes reach the fixpoint of a straight-line launcher
            before = dict(self.env)
            self.body(self.fn.body, top=True)
            if before == self.env:
                break
        self.report = True
        self.body(self.fn.body, top=True)

    def bind(self, t: ast.AST, kinds: frozenset, node: ast.AST) -> None:
        if isinstance(t, ast.Name):
            if shadows(t.id, self.facts):
                self.add("static.forbidden_syntax", t, f"{t.id} = ...: rebinds a module-level name (a module or "
                                                       "kernel); the allowlist reads names")
            self.env[t.id] = self.env.get(t.id, frozenset()) | kinds
        elif isinstance(t, (ast.Tuple, ast.List)):
            elem = frozenset({T} if kinds & TENSORISH else set()) | frozenset({S} if SH in kinds else set()) | \
                (kinds - TENSORISH - {SH})
            for e in t.elts:
                self.bind(e.value if isinstance(e, ast.Starred) else e,
                          frozenset({SH}) if isinstance(e, ast.Starred) and SH in kinds else elem, node)
        elif isinstance(t, ast.Attribute):
            reason = "static.precision" if any(w in t.attr for w in A.PRECISION_WORDS) else "static.mutable_state"
            self.add(reason, t, f"assigns {ast.unparse(t)[:50]}: a kernel file sets no attributes (function "
                                "attributes keep state; module attributes patch torch, triton or the harness)")
        elif isinstance(t, ast.Subscript):
            base = self.expr(t.value)
            if base & TENSORISH:
                self.add("static.forbidden_call", t, f"{ast.unparse(t)[:40]} = ...: writes tensor data on the host; "
                                                     "the kernel writes its outputs")
            else:
                self.add("static.forbidden_syntax", t, f"{ast.unparse(t)[:40]} = ...: the launcher assigns plain names")
        else:
            self.add("static.forbidden_syntax", t, f"assigns {ast.unparse(t)[:40]}")

    # statements ------------------------------------------------------------------------------------------------------
    def body(self, stmts: list[ast.stmt], top: bool = False) -> None:
        for i, s in enumerate(stmts):
            if top and i == 0 and isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
                continue  # the docstring
            self.stmt(s)

    def stmt(self, s: ast.stmt) -> None:
        """Check `s` with its node type's handler (STATEMENTS, below the class); any other statement is refused."""
        dispatch(STATEMENTS, s, _Host.bad_stmt)(self, s)

    # one handler per statement node type (and raise_ below) ----------------------------------------------------------
    def assign(self, s: ast.Assign) -> None:
        if isinstance(s.value, ast.Lambda) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
            self.bind(s.targets[0], self.grid_lambda(s.value), s)
            return
        kinds = self.expr(s.value)
        for t in s.targets:
            self.bind(t, kinds, s)

    def augassign(self, s: ast.AugAssign) -> None:
        if not isinstance(s.target, ast.Name):
            self.bind(s.target, frozenset(), s)
            return
        self.bind(s.target, self.binop(s, self.expr(s.target), self.expr(s.value), s.op), s)

    def annassign(self, s: ast.AnnAssign) -> None:
        check_annotation(s.annotation, self.facts) if self.report else None
        self.bind(s.target, self.expr(s.value) if s.value is not None else frozenset({ANY}), s)

    def expr_stmt(self, s: ast.Expr) -> None:
        if is_launch(s.value, self.facts):
            self.launch(s.value)
        else:
            self.expr(s.value)
            self.add("static.forbidden_syntax", s, f"{ast.unparse(s)[:50]}: an expression statement that is "
                                                   "not a kernel launch kernel[grid](...)")

    def if_(self, s: ast.If) -> None:
        self.truth(s.test)
        self.body(s.body)
        self.body(s.orelse)

    def for_(self, s: ast.For) -> None:
        it = self.expr(s.iter)
        if it & TENSORISH:
            self.add("static.forbidden_call", s, f"for ... in {ast.unparse(s.iter)[:40]}: a Python loop over "
                                                 "tensor data; the kernel does the work")
        self.bind(s.target, frozenset({S}) if it <= {SH, S, ANY} else it - {SH} | ({S} if SH in it else set()), s)
        if s.orelse:
            self.add("static.forbidden_syntax", s, "for ... else in the launcher")
        self.body(s.body)

    def assert_(self, s: ast.Assert) -> None:
        self.truth(s.test)
        if s.msg is not None:
            self.expr(s.msg)

    def return_(self, s: ast.Return) -> None:
        if s.value is not None:
            self.expr(s.value)

    def nothing(self, s: ast.stmt) -> None:
        """pass, break, continue."""

    def reject(self, s: ast.stmt) -> None:
        kind = type(s).__name__
        if isinstance(s, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            self.add("static.fallback", s, "try/except or try/finally: a failing launch must fail, not fall back "
                                           "to other code")
        elif isinstance(s, (ast.Global, ast.Nonlocal)):
            self.add("static.mutable_state", s, f"{kind.lower()} {', '.join(s.names)}: state kept across calls "
                                                "(caching, call counting)")
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            self.add("static.forbidden_import", s, "import inside a function: a kernel file imports at the top, "
                                                   "and only torch, triton, triton.language and math")
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.add("static.forbidden_syntax", s, f"nested {kind} {s.name}: closures keep state across calls "
                                                   "and hide code (grids are `lambda meta: (...)`)")
        elif isinstance(s, ast.While):
            self.add("static.forbidden_syntax", s, "while in the launcher: loop over range(...) (bounded)")
        else:
            self.add("static.forbidden_syntax", s, f"{kind} statement: not part of a launcher")
            if isinstance(s, ast.With) and self.facts.relative:  # a target's `with device_context(...)`: the
                self.body(s.body)  # header is excused as the incumbent's (static.excused); its body is checked

    def raise_(self, s: ast.Raise) -> None:
        e = s.exc
        f = e.func if isinstance(e, ast.Call) else e
        if not (isinstance(f, ast.Name) and f.id in A.HOST_EXCEPTIONS) or s.cause is not None:
            self.add("static.forbidden_syntax", s, f"raise {ast.unparse(e)[:40] if e else ''}: raise one of "
                                                   f"{', '.join(sorted(A.HOST_EXCEPTIONS))}(...)")
        if isinstance(e, ast.Call):
            for a in e.args:
                self.expr(a)

    def truth(self, test: ast.AST) -> None:
        if self.expr(test) & TENSORISH:
            self.add("static.forbidden_call", test, f"{ast.unparse(test)[:40]}: the truth value of a tensor reads "
                                                    "its data on the host")

    # the launch and the grid -----------------------------------------------------------------------------------------
    def launch(self, c: ast.Call) -> None:
        assert isinstance(c.func, ast.Subscript) and isinstance(c.func.value, ast.Name)  # is_launch(c)
        kernel = self.facts.jit[c.func.value.id]
        if self.report:
            precision(c, self.facts)
        grid = c.func.slice
        if isinstance(grid, ast.Lambda):
            self.grid_lambda(grid)
        else:
            self.expr(grid)
        allowed = A.LAUNCH_KWARGS | {p.arg for p in kernel.args.args + kernel.args.kwonlyargs}
        for a in c.args:
            if isinstance(a, ast.Starred):
                if not self.expr(a.value) <= {SH, TS, ANY}:
                    self.add("static.forbidden_syntax", a, f"*{ast.unparse(a.value)[:30]}: unpack only shapes and "
                                                           "strides into a launch")
            elif self.expr(a) & {TYPE, G, INFO, DV}:
                self.add("static.forbidden_call", a, f"{ast.unparse(a)[:30]}: a kernel takes tensors, numbers, "
                                                     "strings and dtypes (types and functions run as Python)")
        for k in c.keywords:
            if k.value is not None and self.expr(k.value) & {TYPE, G, INFO, DV}:
                self.add("static.forbidden_call", k.value, f"{k.arg}=...: a kernel takes tensors, numbers, strings "
                                                           "and dtypes")
            if k.arg is None or k.arg not in allowed:
                self.add("static.forbidden_call", c, f"{kernel.name}[...](**/{k.arg}=...): pass the kernel's own "
                                                     f"parameters and {', '.join(sorted(A.LAUNCH_KWARGS))}")
            self.expr(k.value)

    def grid_lambda(self, lam: ast.Lambda) -> frozenset:
        a = lam.args
        if len(a.args) != 1 or a.defaults or a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs:
            self.add("static.forbidden_syntax", lam, "a grid is `lambda meta: (...)` with one parameter")
            return frozenset({G})
        if shadows(a.args[0].arg, self.facts):
            self.add("static.forbidden_syntax", lam, f"lambda {a.args[0].arg}: shadows a module-level name")
        saved = self.env.get(a.args[0].arg)
        self.env[a.args[0].arg] = frozenset({META})
        self.expr(lam.body)
        if saved is None:
            del self.env[a.args[0].arg]
        else:
            self.env[a.args[0].arg] = saved
        return frozenset({G})


# The statement grammar, one row per statement a launcher may hold; any other is refused (_Host.reject, then what it
# holds is still checked: static_common.BadStatement).
STATEMENTS: dict[type, Callable[[_Host, Any], None]] = {
    ast.Assign: _Host.assign, ast.AugAssign: _Host.augassign, ast.AnnAssign: _Host.annassign, ast.Expr: _Host.expr_stmt,
    ast.If: _Host.if_, ast.For: _Host.for_, ast.Assert: _Host.assert_, ast.Return: _Host.return_,
    ast.Raise: _Host.raise_, ast.Pass: _Host.nothing, ast.Break: _Host.nothing, ast.Continue: _Host.nothing,
}
