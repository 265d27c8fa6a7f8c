"""Kinds of launcher expressions (the static stage's host grammar, autokernel/gate/static_host.py).

Every expression of a launcher gets a set of kinds (tensor, tensors, scalar, shape, dtype, device, ...); a rule
fires when a kind that may be a tensor reaches an operator, a comparison, a truth test, a scalar conversion, a
format or an index: that is torch compute or a read of the data on the host. Names resolve to locals, the
launcher's parameters (kinds from the incumbent's annotations), module constants and allowlisted module names;
methods must be called where they are named.
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeGuard, TypeVar

from autokernel.gate import allowlist as A
from autokernel.gate.static_common import TYPE_NAMES, host_view_dtype, name_why, narrow, precision

if TYPE_CHECKING:
    from autokernel.gate.static_facts import Facts

T, TS, S, SH, DT, DV, INFO, META, G, TYPE, ANY = ("tensor", "tensors", "scalar", "shape", "dtype", "device", "info",
                                                 "meta", "grid", "type", "any")
TENSORISH = frozenset({T, TS})
ATTR_KINDS = {T: {"shape": SH, "dtype": DT, "device": DV, "ndim": S, "itemsize": S, "T": T},
              DT: {a: S for a in A.DTYPE_ATTRS}, INFO: {a: S for a in A.INFO_ATTRS}}
SCALAR_METHODS = {"stride", "size", "dim", "ndimension", "numel", "nelement", "element_size", "storage_offset",
                  "is_contiguous", "is_floating_point"}


H = TypeVar("H")


def dispatch(table: Mapping[type, H], node: ast.AST, default: H) -> H:
    """The handler of `node`'s type in `table`: the first of its classes listed (as an isinstance chain would find
    it), else `default`. The grammars' statement and expression tables."""
    return next((table[c] for c in type(node).__mro__ if c in table), default)


def is_launch(e: ast.AST, facts: Facts) -> TypeGuard[ast.Call]:
    return isinstance(e, ast.Call) and isinstance(e.func, ast.Subscript) and \
        isinstance(e.func.value, ast.Name) and e.func.value.id in facts.jit


class Kinds:
    """The expression half of a launcher checker; the statement half (static_host._Host) sets env/report/facts."""
    facts: Facts
    env: dict[str, frozenset]
    report: bool
    where: str
    compares: set[int]

    if TYPE_CHECKING:  # the statement half's
        def truth(self, test: ast.AST) -> None: ...
        def launch(self, c: ast.Call) -> None: ...

    def add(self, reason: str, node: ast.AST, detail: str) -> None:
        if self.report:
            self.facts.add(reason, node, f"{detail} ({self.where})")

    def add_name(self, node: ast.AST, name: str, where: str) -> None:
        reason, detail = name_why(name, where)
        if self.report and name not in self.facts.rejected:  # else its definition's finding says why
            self.facts.add(reason, node, detail)

    def expr(self, e: ast.AST) -> frozenset:
        """The kinds of `e`, checked by its node type's handler (EXPRESSIONS, below the class)."""
        return dispatch(EXPRESSIONS, e, Kinds.other)(self, e)

    # one handler per expression node type (the others: name, attribute, compare, sequence, subscript, call) ----------
    def constant(self, e: ast.Constant) -> frozenset:
        return frozenset({S})

    def binop_expr(self, e: ast.BinOp) -> frozenset:
        return self.binop(e, self.expr(e.left), self.expr(e.right), e.op)

    def unaryop(self, e: ast.UnaryOp) -> frozenset:
        k = self.expr(e.operand)
        if k & TENSORISH:
            self.add("static.forbidden_call", e, f"{ast.unparse(e)[:40]}: an operator on a tensor is torch "
                                                 "compute outside the kernel")
        return frozenset({S}) if isinstance(e.op, ast.Not) else k

    def boolop(self, e: ast.BoolOp) -> frozenset:
        out: frozenset = frozenset()
        for v in e.values:
            self.truth(v)
            out |= self.expr(v)
        return out

    def ifexp(self, e: ast.IfExp) -> frozenset:
        self.truth(e.test)
        return self.expr(e.body) | self.expr(e.orelse)

    def joinedstr(self, e: ast.JoinedStr) -> frozenset:
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

    def lambda_(self, e: ast.Lambda) -> frozenset:
        self.add("static.forbidden_syntax", e, "a lambda that is not a launch grid (`grid = lambda meta: ...`)")
        return frozenset({ANY})

    def other(self, e: ast.AST) -> frozenset:
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
            if q.startswith("typing."):
                self.add("static.forbidden_syntax", e, f"{n}: typing's names are for annotations only")
            elif q in A.IMPORTS:
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
        out: set[str] = set()
        for x in e.elts:
            k = self.expr(x.value if isinstance(x, ast.Starred) else x)
            out |= {TS} if k & TENSORISH else {SH} if k <= {S, SH, ANY} else k
        return frozenset(out or {SH})

    def subscript(self, e: ast.Subscript) -> frozenset:
        base = self.expr(e.value)
        idx = e.slice
        parts = idx.elts if isinstance(idx, ast.Tuple) else [idx]
        index_kinds: frozenset = frozenset()
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
        if is_launch(c, self.facts):
            self.add("static.forbidden_syntax", c, "a kernel launch is a statement of its own")
            self.launch(c)
            return frozenset({ANY})
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
        if base & {T, ANY} and m == "view" and any(DT in a for a in args):
            host_view_dtype(c, self.facts)
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


# The expression grammar, one row per node type a launcher may use; any other node is Kinds.other's finding.
EXPRESSIONS: dict[type, Callable[[Kinds, Any], frozenset]] = {
    ast.Constant: Kinds.constant, ast.Name: Kinds.name, ast.Attribute: Kinds.attribute, ast.Call: Kinds.call,
    ast.BinOp: Kinds.binop_expr, ast.UnaryOp: Kinds.unaryop, ast.BoolOp: Kinds.boolop, ast.Compare: Kinds.compare,
    ast.IfExp: Kinds.ifexp, ast.Tuple: Kinds.sequence, ast.List: Kinds.sequence, ast.Subscript: Kinds.subscript,
    ast.JoinedStr: Kinds.joinedstr, ast.Lambda: Kinds.lambda_,
}
