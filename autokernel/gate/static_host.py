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
from typing import TYPE_CHECKING

from autokernel.gate import allowlist as A
from autokernel.gate.static_kernel import in_compares, literal, name_why, narrow, precision

if TYPE_CHECKING:
    from autokernel.gate.static import Facts

T, TS, S, SH, DT, DV, INFO, META, G, TYPE, ANY = ("tensor", "tensors", "scalar", "shape", "dtype", "device", "info",
                                                 "meta", "grid", "type", "any")
TENSORISH = frozenset({T, TS})
ATTR_KINDS = {T: {"shape": SH, "dtype": DT, "device": DV, "ndim": S, "itemsize": S, "T": T},
              DT: {a: S for a in A.DTYPE_ATTRS}, INFO: {a: S for a in A.INFO_ATTRS}}
SCALAR_METHODS = {"stride", "size", "dim", "ndimension", "numel", "nelement", "element_size", "storage_offset",
                  "is_contiguous", "is_floating_point"}
TYPE_NAMES = {f"torch.{t}" for t in A.TORCH_TYPES} | {"triton.language.constexpr", "triton.language.tensor"}


def shadows(name: str, facts: Facts) -> bool:
    """A local that hides a module-level name would let `math.floor(t)` mean `t.floor()`: never allowed."""
    return name in facts.aliases or name in facts.jit or name in facts.launchers


def launches(fn: ast.FunctionDef, facts: Facts) -> bool:
    return any(isinstance(n, ast.Expr) and _launch(n.value, facts) for n in ast.walk(fn))


def _launch(e: ast.AST, facts: Facts) -> bool:
    return isinstance(e, ast.Call) and isinstance(e.func, ast.Subscript) and \
        isinstance(e.func.value, ast.Name) and e.func.value.id in facts.jit


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
    _shape_special_cases(fn, facts)


class _Host:
    def __init__(self, fn: ast.FunctionDef, facts: Facts, params: dict[str, frozenset]):
        self.fn, self.facts, self.env = fn, facts, dict(params)
        self.report = False
        self.where = f"launcher {fn.name}"
        self.compares = in_compares(fn)

    def add(self, reason: str, node: ast.AST, detail: str) -> None:
        if self.report:
            self.facts.add(reason, node, f"{detail} ({self.where})")

    def add_name(self, node: ast.AST, name: str, where: str) -> None:
        reason, detail = name_why(name, where)
        if self.report and name not in self.facts.rejected:  # else its definition's finding says why
            self.facts.add(reason, node, detail)

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
        if isinstance(s, ast.Assign):
            if isinstance(s.value, ast.Lambda) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
                self.bind(s.targets[0], self.grid_lambda(s.value), s)
                return
            kinds = self.expr(s.value)
            for t in s.targets:
                self.bind(t, kinds, s)
        elif isinstance(s, ast.AugAssign):
            if not isinstance(s.target, ast.Name):
                self.bind(s.target, frozenset(), s)
                return
            self.bind(s.target, self.binop(s, self.expr(s.target), self.expr(s.value), s.op), s)
        elif isinstance(s, ast.AnnAssign):
            check_annotation(s.annotation, self.facts) if self.report else None
            self.bind(s.target, self.expr(s.value) if s.value is not None else frozenset({ANY}), s)
        elif isinstance(s, ast.Expr):
            if _launch(s.value, self.facts):
                self.launch(s.value)
            else:
                self.expr(s.value)
                self.add("static.forbidden_syntax", s, f"{ast.unparse(s)[:50]}: an expression statement that is "
                                                       "not a kernel launch kernel[grid](...)")
        elif isinstance(s, ast.If):
            self.truth(s.test)
            self.body(s.body)
            self.body(s.orelse)
        elif isinstance(s, ast.For):
            it = self.expr(s.iter)
            if it & TENSORISH:
                self.add("static.forbidden_call", s, f"for ... in {ast.unparse(s.iter)[:40]}: a Python loop over "
                                                     "tensor data; the kernel does the work")
            self.bind(s.target, frozenset({S}) if it <= {SH, S, ANY} else it - {SH} | ({S} if SH in it else set()), s)
            if s.orelse:
                self.add("static.forbidden_syntax", s, "for ... else in the launcher")
            self.body(s.body)
        elif isinstance(s, ast.Assert):
            self.truth(s.test)
            if s.msg is not None:
                self.expr(s.msg)
        elif isinstance(s, ast.Return):
            if s.value is not None:
                self.expr(s.value)
        elif isinstance(s, ast.Raise):
            self.raise_(s)
        elif isinstance(s, (ast.Pass, ast.Break, ast.Continue)):
            pass
        else:
            self.bad_stmt(s)

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

    # expressions -----------------------------------------------------------------------------------------------------
    def expr(self, e: ast.AST) -> frozenset:
        if isinstance(e, ast.Constant):
            return frozenset({S})
        if isinstance(e, ast.Name):
            return self.name(e)
        if isinstance(e, ast.Attribute):
            return self.attribute(e)
        if isinstance(e, ast.Call):
            if _launch(e, self.facts):
                self.add("static.forbidden_syntax", e, "a kernel launch is a statement of its own")
                self.launch(e)
                return frozenset({ANY})
            return self.call(e)
        if isinstance(e, ast.BinOp):
            return self.binop(e, self.expr(e.left), self.expr(e.right), e.op)
        if isinstance(e, ast.UnaryOp):
            k = self.expr(e.operand)
            if k & TENSORISH:
                self.add("static.forbidden_call", e, f"{ast.unparse(e)[:40]}: an operator on a tensor is torch "
                                                     "compute outside the kernel")
            return frozenset({S}) if isinstance(e.op, ast.Not) else k
        if isinstance(e, ast.BoolOp):
            out = frozenset()
            for v in e.values:
                self.truth(v)
                out |= self.expr(v)
            return out
        if isinstance(e, ast.Compare):
            return self.compare(e)
        if isinstance(e, ast.IfExp):
            self.truth(e.test)
            return self.expr(e.body) | self.expr(e.orelse)
        if isinstance(e, (ast.Tuple, ast.List)):
            return self.sequence(e)
        if isinstance(e, ast.Subscript):
            return self.subscript(e)
        if isinstance(e, ast.JoinedStr):
            for v in e.values:
                if isinstance(v, ast.FormattedValue):
                    k = self.expr(v.value)
                    if k & TENSORISH:
                        self.add("static.forbidden_call", v, f"{{{ast.unparse(v.value)[:30]}}}: formatting a tensor "
                                                             "reads its data on the host")
                    if DV in k:
                        self.add("static.forbidden_attribute", v, f"{{{ast.unparse(v.value)[:30]}}}: a device turned "
                                                                  "into text (device fingerprinting)")
                    if v.format_spec is not None:
                        self.expr(v.format_spec)
            return frozenset({S})
        if isinstance(e, ast.Lambda):
            self.add("static.forbidden_syntax", e, "a lambda that is not a launch grid (`grid = lambda meta: ...`)")
            return frozenset({ANY})
        self.add("static.forbidden_syntax", e, f"{type(e).__name__} ({ast.unparse(e)[:40]}): not part of a "
                                               "launcher (no comprehensions, walrus, dicts, sets, await, yield)")
        return frozenset({ANY})

    def name(self, e: ast.Name) -> frozenset:
        n, f = e.id, self.facts
        if n.startswith("__"):
            return frozenset({ANY})  # reported by static._dunders
        if n in self.env:
            return self.env[n]
        if n in f.constants:
            if self.report:
                narrow(e, f.constants[n], self.compares, f)
            return frozenset({DT if f.constants[n] else S})
        if n in f.jit:
            self.add("static.forbidden_call", e, f"{n}: a kernel used as a value; launch it as {n}[grid](...)")
        elif n in f.aliases:
            q = f.aliases[n]
            if q in A.IMPORTS:
                self.add("static.forbidden_attribute", e, f"{n}: a module used as a value (aliases and subscripts "
                                                          "of modules escape the allowlist)")
            else:
                return self.qualified(e, q, called=False)
        elif n in A.HOST_BUILTINS or n in A.HOST_EXCEPTIONS or n in A.HOST_TYPES:
            if n not in A.HOST_TYPES:
                self.add("static.forbidden_call", e, f"{n}: a builtin used as a value; call it directly")
            return frozenset({TYPE})
        elif n in f.launchers:
            self.add("static.forbidden_call", e, f"{n}: the launcher used as a value (recursion, re-export)")
        else:
            self.add_name(e, n, self.where)
        return frozenset({ANY})

    def qualified(self, e: ast.AST, q: str, called: bool) -> frozenset:
        """A module-rooted name: torch dtypes/types, math constants, tl dtypes as values; functions only called."""
        mod, _, rest = q.partition(".")
        if q.rpartition(".")[2].startswith("__"):
            return frozenset({ANY})  # reported by static._dunders
        if self.report:
            narrow(e, q, self.compares, self.facts)
        if not called:
            if q in {f"torch.{d}" for d in A.TORCH_DTYPES} or q in {f"triton.language.{d}" for d in A.TL_DTYPES}:
                return frozenset({DT})
            if q in TYPE_NAMES:
                return frozenset({TYPE})
            if q in {f"math.{c}" for c in A.MATH_CONSTANTS} | {f"torch.{c}" for c in A.TORCH_CONSTANTS}:
                return frozenset({S})
        allowed = {"torch": A.TORCH_ALLOC | A.TORCH_FACTS, "triton": A.TRITON_HOST, "math": A.MATH_FUNCTIONS}
        if called and rest in allowed.get(mod, ()):
            return frozenset()
        if any(w in q for w in A.PRECISION_WORDS):
            self.add("static.precision", e, f"{q}: a global precision switch")
        elif not called:
            stored = rest in allowed.get(mod, ())
            self.add("static.forbidden_attribute", e, f"{q}: " + ("a function stored in a variable; call it "
                                                                  "directly" if stored else
                                                                  "not an allowlisted torch/triton/math name (torch."
                                                                  "backends, torch.cuda, triton.runtime, os/sys "
                                                                  "reached through a module, ...)"))
        else:
            self.add("static.forbidden_call", e, f"{q}(...): not allocation, a view, a dtype fact, triton.cdiv/"
                                                 "next_power_of_2 or math; the work belongs in the Triton kernel")
        return frozenset({ANY})

    def attribute(self, e: ast.Attribute, called: bool = False) -> frozenset:
        q = self.facts.qual(e)
        if q is not None:
            return self.qualified(e, q, called)
        a = e.attr
        base = self.expr(e.value)
        if a.startswith("__"):
            return frozenset({ANY})  # reported by static._dunders
        if a.startswith("_"):
            self.add("static.forbidden_attribute", e, f".{a}: private and dunder attributes (cache keys like "
                                                      "_version, __class__, __dict__, internals)")
            return frozenset({ANY})
        if called:
            return base
        out = set()
        for k in (base if ANY not in base else ATTR_KINDS):
            out |= {v for name, v in ATTR_KINDS.get(k, {}).items() if name == a}
        if not out:
            if a in A.TENSOR_METHODS or a in ("to", "tolist", "item", "numpy", "data_ptr"):
                self.add("static.forbidden_attribute", e, f"{ast.unparse(e)[:40]}: a method stored instead of "
                                                          "called; call allowlisted methods directly")
            elif DV in base:
                self.add("static.forbidden_attribute", e, f"{ast.unparse(e)[:40]}: device facts tell one machine "
                                                          "from another; pass device= on, never read it")
            else:
                self.add("static.forbidden_attribute", e, f"{ast.unparse(e)[:40]}: not an allowlisted attribute "
                                                          f"({', '.join(sorted(A.TENSOR_ATTRS))} of tensors)")
            return frozenset({ANY})
        return frozenset(out)

    def binop(self, e: ast.AST, left: frozenset, right: frozenset, op: ast.operator) -> frozenset:
        if isinstance(op, ast.MatMult) or (left | right) & TENSORISH:
            self.add("static.forbidden_call", e, f"{ast.unparse(e)[:50]}: an operator on a tensor is torch compute "
                                                 "outside the kernel")
            return frozenset({T})
        if SH in left | right and isinstance(op, (ast.Add, ast.Mult)):
            return frozenset({SH})
        return frozenset({S}) if left | right <= {S} else left | right

    def compare(self, e: ast.Compare) -> frozenset:
        kinds = [self.expr(x) for x in [e.left] + e.comparators]
        identity = all(isinstance(op, (ast.Is, ast.IsNot)) for op in e.ops)
        if not identity and any(k & TENSORISH for k in kinds):
            self.add("static.forbidden_call", e, f"{ast.unparse(e)[:50]}: comparing tensors is torch compute (and "
                                                 "reads the data on the host)")
        if any(DV in k for k in kinds) and not all(k == {DV} for k in kinds):
            self.add("static.forbidden_attribute", e, f"{ast.unparse(e)[:50]}: a device compared with something else "
                                                      "(device fingerprinting)")
        return frozenset({S})

    def sequence(self, e: ast.Tuple | ast.List) -> frozenset:
        out = set()
        for x in e.elts:
            k = self.expr(x.value if isinstance(x, ast.Starred) else x)
            out |= {TS} if k & TENSORISH else {SH} if k <= {S, SH, ANY} else k
        return frozenset(out or {SH})

    def subscript(self, e: ast.Subscript) -> frozenset:
        base = self.expr(e.value)
        idx = e.slice
        parts = idx.elts if isinstance(idx, ast.Tuple) else [idx]
        index_kinds = frozenset()
        for p in parts:
            if isinstance(p, ast.Slice):
                for b in (p.lower, p.upper, p.step):
                    if b is not None:
                        index_kinds |= self.expr(b)
            else:
                index_kinds |= self.expr(p)
        if index_kinds & TENSORISH:
            self.add("static.forbidden_call", e, f"{ast.unparse(e)[:40]}: indexing by a tensor is a gather (torch "
                                                 "compute outside the kernel)")
        if base & {DV, DT, INFO, G, TYPE}:
            self.add("static.forbidden_syntax", e, f"{ast.unparse(e)[:40]}: indexes what is not a tensor, shape "
                                                   "or grid meta")
        out = set()
        if T in base:
            out.add(T)
        if TS in base:
            out.add(T)
        if SH in base:
            out.add(SH if isinstance(idx, ast.Slice) else S)
        if base & {S, META, ANY}:
            out.add(S if META in base and not base & {ANY} else ANY)
        return frozenset(out or {ANY})

    def call(self, c: ast.Call) -> frozenset:
        f = c.func
        args = [self.expr(a.value if isinstance(a, ast.Starred) else a) for a in c.args]
        kw = {k.arg: self.expr(k.value) for k in c.keywords}
        if any(k.arg is None for k in c.keywords):
            self.add("static.forbidden_syntax", c, f"{ast.unparse(c)[:40]}: **kwargs in a launcher call")
        precision(c, self.facts) if self.report else None
        every = frozenset().union(*args, *kw.values())
        if isinstance(f, ast.Name) and f.id not in self.env and f.id not in self.facts.aliases:
            return self.builtin(c, f.id, args, every)
        if isinstance(f, ast.Name) and f.id in self.facts.aliases:
            return self.qualified_call(c, self.facts.aliases[f.id], args, every)
        if isinstance(f, ast.Attribute):
            q = self.facts.qual(f)
            if q is not None:
                return self.qualified_call(c, q, args, every)
            return self.method(c, f, self.attribute(f, called=True), args, every)
        what = "a variable" if isinstance(f, ast.Name) else "the result of an expression"
        self.add("static.forbidden_call", c, f"{ast.unparse(f)[:40]}(...): calls {what}; only allowlisted names are "
                                             "called, by name")
        return frozenset({ANY})

    def builtin(self, c: ast.Call, n: str, args: list[frozenset], every: frozenset) -> frozenset:
        if n not in A.HOST_BUILTINS:
            if n.startswith("__"):
                pass  # reported by static._dunders
            elif n in self.facts.jit:
                self.add("static.forbidden_call", c, f"{n}(...): a kernel is launched as {n}[grid](...)")
            else:
                self.add_name(c, n, self.where)
            return frozenset({ANY})
        if n in A.SCALAR_BUILTINS | {"tuple", "list", "zip", "enumerate"} and every & TENSORISH:
            self.add("static.forbidden_call", c, f"{ast.unparse(c)[:40]}: {n}() of a tensor reads its data on the "
                                                 "host (sniffing, memoising, Python loops over values)")
        if n in ("tuple", "list"):
            return args[0] if args and args[0] <= {SH, TS} else frozenset({SH})
        if n in ("zip", "enumerate", "range"):
            return frozenset({SH})
        return frozenset({S})

    def qualified_call(self, c: ast.Call, q: str, args: list[frozenset], every: frozenset) -> frozenset:
        self.qualified(c.func, q, called=True)
        if any(k.arg == "out" for k in c.keywords):
            self.add("static.forbidden_call", c, f"{ast.unparse(c)[:40]}: out= writes into an existing tensor")
        mod, _, name = q.partition(".")
        if mod == "torch" and name in A.TORCH_ALLOC:
            data = args[1:] if name.endswith("_like") else args
            if frozenset().union(*data) & TENSORISH:
                self.add("static.forbidden_call", c, f"{ast.unparse(c)[:50]}: sizes and fill values are Python "
                                                     "numbers, never tensor data")
            return frozenset({T})
        if mod == "torch" and name in ("finfo", "iinfo"):
            return frozenset({INFO})
        if mod == "torch" and name == "promote_types":
            return frozenset({DT})
        if every & TENSORISH:
            self.add("static.forbidden_call", c, f"{ast.unparse(c)[:40]}: a tensor given to scalar math reads its "
                                                 "data on the host")
        return frozenset({S})

    def method(self, c: ast.Call, f: ast.Attribute, base: frozenset, args: list[frozenset],
               every: frozenset) -> frozenset:
        m = f.attr
        if m.startswith("_"):
            return frozenset({ANY})  # reported by attribute()
        if m in A.NARROW_METHODS:
            self.add("static.precision", c, f"{ast.unparse(c)[:50]}: down-casts the op's data in the launcher")
            return frozenset({T})
        if base & {T, ANY} and m in A.TENSOR_METHODS:
            if every & TENSORISH and m not in ("view_as", "expand_as"):
                self.add("static.forbidden_call", c, f"{ast.unparse(c)[:50]}: a tensor as an argument of .{m}() "
                                                     "(sizes and fill values are numbers, never tensor data)")
            if m in SCALAR_METHODS:
                return frozenset({S}) if c.args or m not in ("stride", "size") else frozenset({SH})
            return frozenset({TS}) if m in ("split", "chunk", "unbind") else frozenset({T})
        if SH in base and m in ("index", "count", "numel") and not base & TENSORISH:
            return frozenset({S})
        if m in ("to", "float", "double", "type", "cpu", "cuda", "int", "long"):
            why = "a conversion copy outside the kernel (load and convert inside it)"
        elif m in ("tolist", "item", "numpy", "data_ptr", "untyped_storage", "storage"):
            why = "reads the data or the address on the host (sniffing, memoising, output caches)"
        else:
            why = "not allocation, a view or metadata; compute belongs in the Triton kernel"
        self.add("static.forbidden_call", c, f"{ast.unparse(c)[:50]}: .{m}() {why}")
        return frozenset({ANY})


# --- shape special-casing ------------------------------------------------------------------------------------------

def _shape_special_cases(fn: ast.FunctionDef, facts: Facts) -> None:
    """`if (M, N) == (64, 576)`: an equality between a shape and a literal other than 0/1, anywhere but an assert,
    special-cases the shapes tests use."""
    derived: set[str] = set()
    for _ in range(3):  # names derived from names derived from shapes, a few levels deep
        for node in ast.walk(fn):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                if _shape_derived(node.value, derived):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    derived.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.For) and _shape_derived(node.iter, derived):
                derived.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
    in_assert = {id(n) for a in ast.walk(fn) if isinstance(a, ast.Assert) for n in ast.walk(a.test)}
    for cmp in (n for n in ast.walk(fn) if isinstance(n, ast.Compare) and id(n) not in in_assert):
        operands = [cmp.left] + cmp.comparators
        hit = any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)) and
                  (_shape_derived(x, derived) and _special(y) or _shape_derived(y, derived) and _special(x))
                  for op, x, y in zip(cmp.ops, operands, operands[1:]))
        if hit:
            facts.add("static.shape_special_case", cmp, f"{ast.unparse(cmp)[:60]} in {fn.name}: a shape equal to a "
                                                        "literal special-cases the shapes tests use")


def _shape_derived(node: ast.AST, derived: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in derived
    if isinstance(node, ast.Attribute):
        return node.attr == "shape"
    if isinstance(node, ast.Subscript):
        return _shape_derived(node.value, derived)
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in ("size", "numel", "stride", "nelement"):
            return True
        return isinstance(f, ast.Name) and f.id in ("min", "max", "abs", "int", "tuple", "list") and \
            any(_shape_derived(a, derived) for a in node.args)
    if isinstance(node, ast.BinOp):
        return _shape_derived(node.left, derived) or _shape_derived(node.right, derived)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(_shape_derived(e, derived) for e in node.elts)
    if isinstance(node, ast.Starred):
        return _shape_derived(node.value, derived)
    return False


def _special(node: ast.AST) -> bool:
    """An int literal other than 0/1 (or a tuple/list/set holding one): a specific size, not a divisibility test."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool) and node.value not in (0, 1)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _special(node.operand)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_special(e) for e in node.elts)
    return False
