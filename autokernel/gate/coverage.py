"""Coverage as a gate requirement (docs/design.md trust rule 8): a candidate is proven only where the gate looked.

The numeric stage proves a kernel equal to its reference on the cases it runs. A shortcut taken only where no case
goes (past a size, on trained-looking weights, for one layout) is exact on every case and wrong in production; no
sampling plan can promise to land in a window the candidate chose. So the gate asks the converse: every place the
candidate's code can go must have been gone to. Under the Triton interpreter a kernel's body runs as Python, so one
instrumentation sees the launcher and the kernels alike:

- every block of statements in a function (a def's body, each arm of an if, a loop's body) must have run;
- every condition must have been seen both true and false: `if`/`while`/ternary tests, each operand of `and`/`or`,
  every comparison, `&`/`|`/`^` of comparisons, the condition of `tl.where`; elementwise on a kernel's tensors
  (a mask true in some lanes and false in others is both);
- every two-way `min`/`max`/`tl.minimum`/`tl.maximum` must have picked each side strictly (a clamp that never bit,
  or always did, hides the other side).

Exempt: assert statements (and tl.device_assert / tl.static_assert) and an `if` whose body only raises (a guard:
its failing side is an exception, never a silent wrong answer), a kernel's `if pid >= n: return` against one of its
own parameters (a program past the launch's bound), and module-level code (it runs once, at import, on constants).

How it is measured (the sandbox child, autokernel/gate/child.py): the candidate's module is compiled from this
module's transform of its syntax tree (kernel_loader.load_kernel's `transform`), and the interpreter's own rewrite of
each kernel body (triton's FunctionRewriter, which re-reads the source) gets the same transform first. Each probe
calls a recorder bound in the module's globals under a name that is not an identifier (RECORDER): no candidate source
can name it (and the grammar forbids globals() and dunders). Site keys are "line:col:kind" in file coordinates, the
same in the child's two transforms and in the parent's enumeration (`sites`).

The parent (autokernel/gate/numeric.py) unions what every job saw, steers extra cases toward what is left
(autokernel/gate/coverage_steer.py), and rejects what stays unreached with `coverage.unreached`, naming the line and
the condition. The child's side (the recorder, the compile hooks) is autokernel/gate/coverage_probe.py.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import cast

from autokernel import paths
from autokernel.gate import autotune_list

RECORDER = "autokernel coverage"  # the recorder's global name: a space, so no source can name it
REACHED, TRUE, FALSE, OPAQUE = 1, 2, 4, 8  # bits of a site's record
PICK_FUNCS = {"min", "max", "minimum", "maximum"}
ASSERT_FUNCS = {"device_assert", "static_assert"}  # their conditions are exempt, as an assert statement's
MAX_SITES = 4000  # a kernel file has tens to a few hundred; more is an attack on the parent's work (bounded work)


@dataclass(frozen=True)
class Site:
    key: str  # "line:col:kind"
    line: int
    kind: str  # "block" (must run), "cond" (true and false), "pick"/"pick0"/"pick1" (each side; 0/1: a tie counts)
    text: str  # the source of the condition or of the block's first statement, for the message
    kernel: bool  # inside a @triton.jit function (measured only where kernels run as Python: the interpreter)


def _is_jit(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for d in fn.decorator_list:
        f = d.func if isinstance(d, ast.Call) else d
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name == "jit":
            return True
    return False


def _boolish(node: ast.AST) -> bool:
    """A truth value by its syntax: a comparison, and/or/not, a boolean combination, or one cast (`.to(...)`)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to":
        return _boolish(node.func.value)
    return isinstance(node, (ast.Compare, ast.BoolOp)) or (isinstance(node, ast.UnaryOp) and isinstance(
        node.op, ast.Not)) or _bitop(node)


def _bitop(node: ast.AST) -> bool:
    """`a & b`, `a | b`, `a ^ b` with a comparison or boolean operand, or `a * b` of two of them: a combined condition
    (not bit arithmetic). A product of truths is their conjunction: `(M > 600) * (g < 0.5)` blended into a result
    must be seen true, like `&`, or a shortcut keyed on both at once never runs in the gate."""
    if not isinstance(node, ast.BinOp):
        return False
    if isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
        return _boolish(node.left) or _boolish(node.right)
    return isinstance(node.op, ast.Mult) and _boolish(node.left) and _boolish(node.right)


def _contiguous_of(node: ast.AST, name: str | None = None) -> bool:
    """`X.contiguous()` (of the name `name`, if given): a copy with the same values."""
    return (isinstance(node, ast.Call) and not node.args and not node.keywords
            and isinstance(node.func, ast.Attribute) and node.func.attr == "contiguous"
            and isinstance(node.func.value, ast.Name) and (name is None or node.func.value.id == name))


def _layout_only(node: ast.AST) -> bool:
    """An `if` whose only effect is `X = X.contiguous()` (no else), or `X if c else X.contiguous()` (either way
    round): both sides give the same values, so the side the gate never took cannot be wrong where the other is
    right. Its condition and block are exempt (a layout production never sends is no proof obligation)."""
    if isinstance(node, ast.If):
        return not node.orelse and all(
            isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
            and _contiguous_of(s.value, s.targets[0].id) for s in node.body)
    if isinstance(node, ast.IfExp):
        return _same_values(node.body, node.orelse)
    return False


class _Unlayout(ast.NodeTransformer):
    """`x.contiguous()` -> `x`, `.view(` -> `.reshape(`: what is left is the values an expression denotes."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        node = cast(ast.Call, self.generic_visit(node))  # generic_visit returns the node it was given
        if isinstance(node.func, ast.Attribute) and node.func.attr == "contiguous" and not node.args:
            return node.func.value
        if isinstance(node.func, ast.Attribute) and node.func.attr == "view":
            node.func.attr = "reshape"
        return node


def _same_values(a: ast.AST, b: ast.AST) -> bool:
    """Two expressions that differ only by layout (contiguous copies, view vs reshape): the same values."""
    import copy
    norm = lambda e: ast.unparse(_Unlayout().visit(copy.deepcopy(e)))  # noqa: E731
    return norm(a) == norm(b)


def _size_expr(node: ast.AST) -> bool:
    """`x.numel()`, `x.shape[i]`, `x.size(i)`, `x.shape` (unpacked), `len(x)`: a non-negative element count."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("numel", "size"):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
        return True
    if isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr == "shape"


def _sizes(fn: ast.AST) -> set[str]:
    """Names a function binds once, to element counts (the grammar binds no name twice; checked here anyway)."""
    bound: dict[str, int] = {}
    sized: set[str] = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and len(n.targets) == 1:
            t = n.targets[0]
            names = [t] if isinstance(t, ast.Name) else list(t.elts) if isinstance(t, ast.Tuple) else []
            for x in names:
                if isinstance(x, ast.Name):
                    bound[x.id] = bound.get(x.id, 0) + 1
                    if _size_expr(n.value):
                        sized.add(x.id)
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign, ast.For, ast.NamedExpr)):
            for m in ast.walk(n.target):
                if isinstance(m, ast.Name):
                    bound[m.id] = bound.get(m.id, 0) + 2
    return {k for k in sized if bound.get(k) == 1}


def _empty_guard(node: ast.If, sizes: set[str]) -> bool:
    """`if n:` / `if x.numel():` / `if n > 0:` (no else) or `if n == 0:`, for n an element count: the side the gate
    never sees is the empty input, which has no element to get wrong. Exempt, like a raise guard."""
    t = node.test
    def count(e: ast.AST) -> bool:  # an element count, or a product of counts
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
            return count(e.left) and count(e.right)
        return (isinstance(e, ast.Name) and e.id in sizes) or (isinstance(e, ast.Call) and _size_expr(e))

    if isinstance(t, ast.BoolOp) and isinstance(t.op, ast.And) and all(count(v) for v in t.values):
        return not node.orelse
    if count(t):
        return not node.orelse
    if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and count(t.left)
            and isinstance(t.comparators[0], ast.Constant) and type(t.comparators[0].value) is int):
        return False
    op, c = t.ops[0], t.comparators[0].value
    nonempty = (isinstance(op, ast.Gt) and c == 0) or (isinstance(op, ast.NotEq) and c == 0) or (
        isinstance(op, ast.GtE) and c == 1)
    empty = (isinstance(op, ast.Eq) and c == 0) or (isinstance(op, ast.Lt) and c == 1) or (
        isinstance(op, ast.LtE) and c == 0)
    return (nonempty and not node.orelse) or (empty and not node.orelse)


def _callee(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def _guard(node: ast.If) -> bool:
    """`if cond: raise ...`: its failing side is an exception (the call fails), never a silent wrong answer."""
    return len(node.body) == 1 and isinstance(node.body[0], ast.Raise)


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = fn.args
    return {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}


def _program_ids(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Names bound to a program id and nothing else: `pid = tl.program_id(0)` (or its `.to(tl.int64)`)."""
    def pid(e: ast.AST) -> bool:
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "to":
            e = e.func.value
        return isinstance(e, ast.Call) and _callee(e) == "program_id"

    out: dict[str, bool] = {}
    for n in ast.walk(fn):
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for t in targets:
                for name in (x.id for x in ast.walk(t) if isinstance(x, ast.Name)):
                    out[name] = out.get(name, True) and isinstance(n, ast.Assign) and len(targets) == 1 \
                        and isinstance(t, ast.Name) and n.value is not None and pid(n.value)
    return {k for k, v in out.items() if v}


def _overshoot_guard(node: ast.If, params: set[str], pids: set[str]) -> bool:
    """`if pid >= n: return` (no else) in a kernel, pid a program id and n one of the kernel's own parameters: a
    program past the launch's own bound does nothing. The launcher's grid is often exactly n, so the gate never
    sees it taken (an honest rewrite was coverage.unreached); a bound the kernel computes (n - n // 4097) is no
    parameter, and stays a condition to see both ways."""
    t = node.test
    if node.orelse or len(node.body) != 1 or not isinstance(node.body[0], ast.Return) or node.body[0].value \
            is not None or not (isinstance(t, ast.Compare) and len(t.ops) == 1):
        return False
    a, op, b = t.left, t.ops[0], t.comparators[0]
    if isinstance(op, (ast.LtE, ast.Lt)):
        a, b, op = b, a, ast.GtE() if isinstance(op, ast.LtE) else ast.Gt()
    return isinstance(op, (ast.GtE, ast.Gt)) and isinstance(a, ast.Name) and a.id in pids and \
        isinstance(b, ast.Name) and b.id in params and b.id not in pids


def _unit(node: ast.Call) -> int | None:
    """The side of a min/max that is the literal 0 or 1, if one is (0: first, 1: second)."""
    for i, a in enumerate(node.args[:2]):
        if isinstance(a, ast.Constant) and type(a.value) is int and a.value in (0, 1):
            return i
    return None


class Instrument(ast.NodeTransformer):
    """Adds the probes to a module's (or one kernel function's) tree. `offset`: lines to add to the tree's line
    numbers for file coordinates (the interpreter parses a kernel from its def line); `kernel`: the tree is one
    kernel function (the interpreter's re-parse), so everything in it is a kernel site."""

    def __init__(self, source: str = "", offset: int = 0, kernel: bool = False):
        self.source, self.offset = source, offset
        self.sites: dict[str, Site] = {}
        self.depth = 0  # inside a function (module-level code is exempt)
        self.jit = 1 if kernel else 0  # inside a @triton.jit function
        self.lines = source.splitlines()
        self.sizes: set[str] = set()  # element-count names of the function being visited (_empty_guard)
        self.bounds: tuple[set[str], set[str]] = (set(), set())  # the kernel's (parameters, program ids)

    # --- probes -------------------------------------------------------------------------------------------------------
    def _key(self, node: ast.expr | ast.stmt, kind: str) -> str:
        line = node.lineno + self.offset
        key = f"{line}:{node.col_offset}:{kind}"
        if key not in self.sites:
            if len(self.sites) >= MAX_SITES:
                raise ValueError(f"more than {MAX_SITES} coverage sites: not a kernel file")
            text = ast.get_source_segment(self.source, node) if self.source else None
            if text is None and 0 < node.lineno <= len(self.lines):
                text = self.lines[node.lineno - 1].strip()
            self.sites[key] = Site(key, line, kind, " ".join((text or "").split())[:80], self.jit > 0)
        return key

    def _rec(self, method: str, key: str, *args: ast.expr) -> ast.Call:
        fn = ast.Attribute(value=ast.Name(id=RECORDER, ctx=ast.Load()), attr=method, ctx=ast.Load())
        return ast.Call(func=fn, args=[ast.Constant(key), *args], keywords=[])

    def _cond(self, node: ast.expr) -> ast.expr:
        """node wrapped as one condition site, its children instrumented (a comparison or a boolean `&` is wrapped
        once here, not again as itself)."""
        inner = self.generic_visit(node) if isinstance(node, (ast.Compare, ast.BinOp)) else self.visit(node)
        return self._wrap(node, cast(ast.expr, inner))  # an expression's visit gives an expression

    def _wrap(self, node: ast.expr, inner: ast.expr) -> ast.expr:
        return ast.copy_location(self._rec("cond", self._key(node, "cond"), inner), node)

    def _block(self, body: list[ast.stmt]) -> list[ast.stmt]:
        body = [s for stmt in body for s in self._visit_stmt(stmt)]
        if not body or self.depth == 0:
            return body
        doc = int(isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                  and isinstance(body[0].value.value, str) and len(body) > 1)  # a docstring stays first
        probe = ast.Expr(value=self._rec("block", self._key(body[doc], "block")))
        return [*body[:doc], ast.copy_location(probe, body[doc]), *body[doc:]]

    def _visit_stmt(self, stmt: ast.stmt) -> list[ast.stmt]:
        out = self.visit(stmt)
        return out if isinstance(out, list) else [out] if out is not None else []

    # --- functions ----------------------------------------------------------------------------------------------------
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.args = self.visit(node.args)
        jit = _is_jit(node)
        self.depth += 1
        self.jit += jit
        outer, self.sizes = self.sizes, self.sizes | _sizes(node)
        outer_bounds, self.bounds = self.bounds, (_parameters(node), _program_ids(node)) if jit or self.jit else \
            (set(), set())
        try:
            node.body = self._block(node.body)
        finally:
            self.depth -= 1
            self.jit -= jit
            self.sizes = outer
            self.bounds = outer_bounds
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # not in the grammar; instrumented alike rather than skipped

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        self.depth += 1
        try:
            return self.generic_visit(node)
        finally:
            self.depth -= 1

    # --- statements ---------------------------------------------------------------------------------------------------
    def visit_If(self, node: ast.If) -> ast.AST:
        if self.depth and _layout_only(node):
            return node
        if self.depth and _empty_guard(node, self.sizes):
            node.body = [st for stmt in node.body for st in self._visit_stmt(stmt)]  # unprobed: runs on empty input
            node.orelse = self._block(node.orelse)
            return node
        if self.depth and (_guard(node) or self.jit and _overshoot_guard(node, *self.bounds)):
            node.orelse = self._block(node.orelse)
            return node
        node.test = self._cond(node.test) if self.depth else self.visit(node.test)
        node.body, node.orelse = self._block(node.body), self._block(node.orelse)
        return node

    def visit_While(self, node: ast.While) -> ast.AST:
        node.test = self._cond(node.test) if self.depth else self.visit(node.test)
        node.body, node.orelse = self._block(node.body), self._block(node.orelse)
        return node

    def visit_For(self, node: ast.For) -> ast.AST:
        node.iter = self.visit(node.iter)
        node.body, node.orelse = self._block(node.body), self._block(node.orelse)
        return node

    def visit_With(self, node: ast.With) -> ast.AST:
        node.items = [self.visit(i) for i in node.items]
        node.body = self._block(node.body)
        return node

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        return node  # a failing assert is an exception: its condition need not be seen false

    # --- expressions --------------------------------------------------------------------------------------------------
    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        if not self.depth or _layout_only(node):
            return self.generic_visit(node) if not self.depth else node
        node.test = self._cond(node.test)
        node.body, node.orelse = self.visit(node.body), self.visit(node.orelse)
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        if not self.depth:
            return self.generic_visit(node)
        node.values = [self._cond(v) for v in node.values]
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        node = cast(ast.Compare, self.generic_visit(node))  # the node it was given
        return self._wrap(node, node) if self.depth else node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        combined = self.depth and _bitop(node)  # judged on the source, before the operands are wrapped
        node = cast(ast.BinOp, self.generic_visit(node))  # the node it was given
        return self._wrap(node, node) if combined else node

    def visit_comprehension(self, node: ast.comprehension) -> ast.AST:
        node.target, node.iter = self.visit(node.target), self.visit(node.iter)
        node.ifs = [self._cond(c) if self.depth else self.visit(c) for c in node.ifs]
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        name = _callee(node)
        if name in ASSERT_FUNCS:
            return node  # tl.device_assert / tl.static_assert: like assert, a failing side is an error, not a value
        if self.depth and name in PICK_FUNCS and not node.keywords and not any(
                isinstance(a, ast.Starred) for a in node.args):
            args = node.args
            if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)):
                args = args[0].elts  # min((a, b, c)): the same picks as min(a, b, c)
            if len(args) > 2:  # min(a, b, c) == min(min(a, b), c): every argument's pick recorded
                # the inner pick keyed at its last argument's place (a site of its own, the same in every transform)
                inner = ast.copy_location(ast.Call(func=node.func, args=list(args[:-1]), keywords=[]), args[-2])
                node = ast.copy_location(ast.Call(func=node.func, args=[inner, args[-1]], keywords=[]), node)
            elif len(args) == 2:
                node.args = list(args)
        if self.depth and name == "clamp" and len(node.args) == 3 and not node.keywords:
            key = self._key(node, "clamp")
            func = self.visit(node.func)
            x, lo, hi = (self.visit(a) for a in node.args)
            return ast.copy_location(self._rec("clamp", key, func, x, lo, hi), node)
        if self.depth and name == "where" and node.args and not node.keywords:
            node.func = self.visit(node.func)
            node.args = [self._cond(node.args[0]), *[self.visit(a) for a in node.args[1:]]]
            return node
        if (self.depth and name in PICK_FUNCS and len(node.args) == 2 and not node.keywords
                and not any(isinstance(a, ast.Starred) for a in node.args)):
            # max(1, n) / min(n, 0): the literal side is an empty input's; a tie there gives the same value
            unit = _unit(node)
            key = self._key(node, "pick" if unit is None else f"pick{unit}")
            func, a, b = self.visit(node.func), self.visit(node.args[0]), self.visit(node.args[1])
            return ast.copy_location(self._rec("pick", key, func, a, b), node)
        return self.generic_visit(node)


def instrument(tree: ast.Module, source: str = "", offset: int = 0, kernel: bool = False
               ) -> tuple[ast.Module, dict[str, Site]]:
    """The tree with probes (children's locations kept), and its sites."""
    ins = Instrument(source, offset, kernel)
    tree = ins.visit(tree)
    ast.fix_missing_locations(tree)
    return tree, ins.sites


def sites(source: str | bytes) -> dict[str, Site]:
    """Every site of a candidate file, as the child's probes key them (parent side; never executes the source)."""
    text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    tree = paths.parse(text)
    return {**instrument(tree, text)[1], **autotune_sites(tree)}


def incumbents(known: dict[str, Site], source: str | bytes, incumbent: str | bytes) -> set[str]:
    """The keys of sites that are the incumbent's own code: the smallest statement holding the site is, verbatim (as
    an AST), a statement of the incumbent file. For a target checkout's op (autokernel/target/contract.py): a branch
    no input can reach on this machine (a GPU architecture test, a backward kernel the declared launcher never
    calls) is no proof obligation while it is what production already runs; a changed one is (a candidate changes
    only what the gate can run). The verdict counts those left unreached (numeric, metric incumbent_unreached)."""
    def text(x):
        return x.decode("utf-8", "replace") if isinstance(x, bytes) else x
    theirs = {ast.dump(n) for n in ast.walk(paths.parse(text(incumbent))) if isinstance(n, ast.stmt)}
    spans = sorted(((n.lineno, n.col_offset, n.end_lineno or n.lineno, n.end_col_offset or 0), n)
                   for n in ast.walk(paths.parse(text(source))) if isinstance(n, ast.stmt))
    out = set()
    for key, site in known.items():
        line, col = (int(x) for x in key.split(":")[:2]) if key.count(":") >= 2 and \
            key.split(":")[0].isdigit() and key.split(":")[1].isdigit() else (site.line, 0)
        inner = None
        for (l0, c0, l1, c1), n in spans:
            if (l0, c0) <= (line, col) <= (l1, c1) and (inner is None or (l0, c0) >= inner[0]):
                inner = ((l0, c0), n)
        if inner is not None and ast.dump(inner[1]) in theirs:
            out.add(key)
    return out


# --- judging (parent) -------------------------------------------------------------------------------------------------

def merge(into: dict[str, int], seen: object, known: dict[str, Site]) -> None:
    """OR a job's records into `into`: only keys of known sites, only int bits (the child's report is data)."""
    if not isinstance(seen, dict):
        return
    for k, v in seen.items():
        if isinstance(k, str) and k in known and type(v) is int:
            into[k] = into.get(k, 0) | (v & (REACHED | TRUE | FALSE | OPAQUE))


def missing(known: dict[str, Site], seen: dict[str, int], kernels_measured: bool = True) -> list[tuple[Site, str]]:
    """(site, what was never seen) for each site short of its requirement, in line order."""
    out = []
    for s in sorted(known.values(), key=lambda s: (s.line, s.key)):
        if s.kernel and not kernels_measured:
            continue
        bits = seen.get(s.key, 0)
        if s.kind == "block":
            if not bits & REACHED:
                out.append((s, "never ran"))
        elif not bits & REACHED:
            out.append((s, "never evaluated"))
        elif bits & OPAQUE and not bits & (TRUE | FALSE):
            out.append((s, "is not a value the gate can observe (a bool, number or tensor)"))
        elif not bits & TRUE:
            out.append((s, "never true" if s.kind == "cond" else "never picked its first side"))
        elif not bits & FALSE:
            out.append((s, "never false" if s.kind == "cond" else "never picked its second side"))
    return out


def describe(gaps: list[tuple[Site, str]], cases: int) -> str:
    s, why = gaps[0]
    what = {"block": "the block starting", "cond": "the condition", "clamp": "the clamp (bit / passed through)"
            }.get(s.kind, "the min/max")
    more = f" (+{len(gaps) - 1} more: lines {', '.join(str(g.line) for g, _ in gaps[1:6])})" if len(gaps) > 1 else ""
    return (f"line {s.line}: {what} `{s.text}` {why} in the gate's {cases} cases{more}; the gate proves a kernel "
            "only on paths it ran: drop the special case, or make it reachable by shapes and values the op takes")


# --- autotune configs -------------------------------------------------------------------------------------------------
# Which of a kernel's triton.Config a GPU picks is a timing, not a proof: a config that is wrong and never picked on
# the gate's machine is picked on another, at any key. So in the gate every config is judged at every case: the
# case's own calls take one per autotune key (shapes, dtypes: stable for a key, as a GPU's cache is) from a salted
# hash, without timing, and one more call per distinct config runs the case's inputs under that config
# (autotune_variants; the "config" calls of autokernel/gate/schedule.py). Each config is also a site that must be
# reached (autotune_sites; install_autotune).

def _config_nodes(fn: ast.FunctionDef, named: dict[str, ast.expr] | None = None) -> list[ast.expr]:
    """The triton.Config expressions of fn's @triton.autotune(configs=[...]) (a comprehension expanded, in its run
    order), [] without one."""
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and _callee(d) == "autotune":
            for k in d.keywords:
                if k.arg == "configs":
                    return autotune_list.configs(k.value, named) or []
    return []


def autotune_variants(source: bytes | str) -> int:
    """How many distinct programs the file's autotuners can pick per launch: the most distinct meta-parameter dicts
    of one autotuner's configs (num_warps and num_stages do not change what a program computes), 1 without any. The
    numeric stage runs every case's inputs under each (coverage_probe.install_autotune's forced config): a config is
    judged at every shape, not only at the keys a hash happens to give it."""
    try:
        tree = paths.parse(source)
    except (SyntaxError, ValueError):
        return 1
    named = autotune_list.sources(tree) if isinstance(tree, ast.Module) else {}
    counts = [len({_meta(c) for c in _config_nodes(fn, named)}) for fn in ast.walk(tree)
              if isinstance(fn, ast.FunctionDef)]
    return max([1, *counts])


def _meta(config: ast.AST) -> str:
    """A config's meta-parameters as a canonical string (its whole source where they are not a literal dict)."""
    if isinstance(config, ast.Call) and config.args and isinstance(config.args[0], ast.Dict):
        try:
            return repr(sorted(ast.literal_eval(config.args[0]).items()))
        except (ValueError, TypeError, SyntaxError):
            pass
    return ast.dump(config)


def autotune_sites(tree: ast.AST) -> dict[str, Site]:
    out = {}
    named = autotune_list.sources(tree) if isinstance(tree, ast.Module) else {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and (n := len(_config_nodes(fn, named))) > 1:
            for i in range(n):
                key = f"autotune:{fn.name}:{i}"
                out[key] = Site(key, fn.lineno, "block", f"triton.Config #{i + 1} of {fn.name}'s autotune", False)
    return out
