"""The gate's first stage: read a candidate's source and refuse what a kernel file has no business doing.

It only parses (ast), never imports or executes the candidate, so it runs in the autokernel process. The rules are
allowlists wherever a list can be closed (imports, torch and triton names, methods called outside a kernel), because
SHORTCUTS.md's variants will name things no ban list foresaw. A kernel file is: @triton.jit kernels, a launcher that
allocates, computes a grid and launches one of them, and constants. Anything else is either reported or left to the
runtime stage, which sees what actually ran (aten ops, launches, global state) and does not trust this one.

All findings are collected; the verdict reports the first by REASON_ORDER and keeps the rest in its metrics, so the
agent can fix everything at once.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from autokernel.gate.verdict import StageResult

MAX_SOURCE_BYTES = 1 << 20  # a kernel file is a few kB; a megabyte is an attack on the parser, not a kernel

# Reported in this order: the most telling finding first (an import of the old module explains a missing launcher).
REASON_ORDER = ("static.syntax", "static.forbidden_import", "static.fallback", "static.precision",
                "static.forbidden_call", "static.shape_special_case", "static.signature", "static.no_triton_kernel")

# --- imports --------------------------------------------------------------------------------------------------------
# module -> names a `from module import ...` may bind (None: any). Everything else is static.forbidden_import.
ALLOWED_IMPORTS: dict[str, frozenset[str] | None] = {
    "__future__": None, "typing": None, "math": None,
    "torch": None,  # names bound this way are checked like torch.<name> below
    "triton": None,  # likewise
    "triton.language": None,
}
ALLOWED_IMPORT_PREFIXES = ("triton.language.",)  # triton.language.extra.libdevice, ...
TRUSTED_PREFIXES = ("autokernel", "kernels.")  # the trusted side and the other (or old) kernels: bypass/re-export

# --- names a kernel file may reference ------------------------------------------------------------------------------
TORCH_DTYPES = frozenset(
    "float32 float float16 half bfloat16 float64 double int8 int16 int32 int64 long int short uint8 uint16 uint32 "
    "uint64 bool complex64 complex128 float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz".split())
TORCH_ALLOWED = frozenset({f"torch.{d}" for d in TORCH_DTYPES} | {
    "torch", "torch.Tensor", "torch.Size", "torch.dtype", "torch.device", "torch.contiguous_format",
    "torch.preserve_format", "torch.channels_last", "torch.strided",
    # allocation (the runtime stage fills every fresh allocation with poison, so unwritten outputs show)
    "torch.empty", "torch.empty_like", "torch.empty_strided", "torch.zeros", "torch.zeros_like", "torch.ones",
    "torch.ones_like", "torch.full", "torch.full_like",
    # dtype and device facts
    "torch.finfo", "torch.iinfo", "torch.promote_types", "torch.is_tensor", "torch.is_floating_point",
    "torch.no_grad", "torch.inference_mode", "torch.version", "torch.version.cuda", "torch.version.hip",
    "torch.cuda", "torch.cuda.is_available", "torch.cuda.device_count", "torch.cuda.current_device",
    "torch.cuda.get_device_capability", "torch.cuda.get_device_properties", "torch.cuda.get_device_name",
})
TRITON_ALLOWED = frozenset({"triton", "triton.jit", "triton.autotune", "triton.Config", "triton.heuristics",
                            "triton.cdiv", "triton.next_power_of_2", "triton.language"})
NARROW_FLOATS = frozenset({f"torch.{d}" for d in ("float16", "half", "bfloat16")} |
                          {f"torch.{d}" for d in TORCH_DTYPES if d.startswith("float8")} |
                          {f"triton.language.{d}" for d in ("float16", "bfloat16", "float8e4nv", "float8e5",
                                                              "float8e4b8", "float8e5b16", "float8e4b15")})
PRECISION_NAMES = ("tf32", "reduced_precision", "float32_matmul_precision")  # switches in torch.backends & co.
STREAM_NAMES = ("stream", "Stream", "Event", "synchronize", "graph", "Graph")

FORBIDDEN_BUILTINS = frozenset({
    "eval", "exec", "compile", "__import__", "globals", "locals", "vars", "getattr", "setattr", "delattr", "open",
    "breakpoint", "input", "id", "hash", "memoryview", "object", "type", "super", "classmethod", "staticmethod",
    "property", "exit", "quit", "help", "dir", "next", "iter", "__builtins__", "__loader__", "__spec__",
    "__file__", "__dict__"})
BUILTIN_WHY = {"id": "an output cache keyed on object identity", "hash": "an output cache keyed on a hash",
               "next": "state across calls (call counting)", "iter": "state across calls (call counting)",
               "type": "class creation (tensor subclass / lazy output)", "object": "attribute patching"}

# Methods that may be called, outside a @triton.jit kernel, on anything that is not a module: tensor allocation,
# views and metadata, and plain container/str methods. Anything else (x.sum(), x.softmax(), x.float(), x.item(),
# x.data_ptr(), x.tolist()) is compute outside the kernel, a cast, or a way to key a cache or sniff the input.
SAFE_METHODS = frozenset({
    # tensor metadata, views, allocation
    "reshape", "view", "view_as", "reshape_as", "contiguous", "is_contiguous", "stride", "size", "dim",
    "ndimension", "numel", "nelement", "element_size", "storage_offset", "new_empty", "new_empty_strided",
    "new_zeros", "new_ones", "new_full", "expand", "expand_as", "unsqueeze", "squeeze", "flatten", "unflatten",
    "permute", "transpose", "t", "narrow", "split", "chunk", "unbind", "movedim", "select", "is_floating_point",
    "is_complex", "get_device", "clone", "copy_", "fill_", "zero_",
    # plain Python containers and strings
    "append", "extend", "insert", "items", "keys", "values", "get", "index", "count", "join", "format",
    "startswith", "endswith", "lower", "upper", "strip", "replace", "pop", "update", "setdefault", "copy", "add",
    "bit_length", "is_integer",
})
MUTATING_METHODS = frozenset({"append", "extend", "insert", "pop", "popitem", "update", "setdefault", "clear",
                              "add", "discard", "remove"})
CAST_METHODS = frozenset({"half", "bfloat16"})
KERNEL_DECORATOR_KWARGS = frozenset({"do_not_specialize", "do_not_specialize_on_alignment", "noinline", "debug"})
AUTOTUNE_HOOK_KWARGS = frozenset({"prune_configs_by", "pre_hook", "post_hook", "do_bench", "perf_model",
                                  "early_config_prune"})
SHAPE_METHODS = frozenset({"size", "numel", "stride", "nelement"})


@dataclass(frozen=True)
class Finding:
    reason: str
    line: int
    detail: str

    def text(self) -> str:
        return f"line {self.line}: {self.detail}" if self.line else self.detail


def check_file(path: Path, op: str, reference_launcher: Path | None = None) -> StageResult:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        return StageResult.fail("static", "static.syntax", f"cannot read {path}: {e.strerror}")
    return check_source(data, op, reference_launcher)


def check_source(source: str | bytes, op: str, reference_launcher: Path | None = None) -> StageResult:
    """Run every static rule on a candidate for kernels/<op>.py; the first finding by REASON_ORDER is the verdict."""
    findings = find(source, op, reference_launcher)
    if not findings:
        return StageResult.ok("static", "parsed; imports, names and launcher shape allowed")
    findings.sort(key=lambda f: (REASON_ORDER.index(f.reason), f.line))
    first = findings[0]
    more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    return StageResult.fail("static", first.reason, first.text() + more,
                            findings=[{"reason": f.reason, "line": f.line, "detail": f.detail} for f in findings])


def find(source: str | bytes, op: str, reference_launcher: Path | None = None) -> list[Finding]:
    if len(source) > MAX_SOURCE_BYTES:
        return [Finding("static.syntax", 0, f"{len(source)} bytes: larger than any kernel file "
                                            f"({MAX_SOURCE_BYTES} max)")]
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [Finding("static.syntax", e.lineno or 0, f"does not parse: {e.msg}")]
    except (ValueError, RecursionError, MemoryError) as e:
        return [Finding("static.syntax", 0, f"does not parse: {type(e).__name__}")]
    checker = _Checker(tree, op)
    checker.run()
    checker.check_signature(_reference_params(op, reference_launcher))
    return checker.findings


# --- the reference launcher's parameters ----------------------------------------------------------------------------

def _params(fn: ast.FunctionDef) -> dict:
    a = fn.args
    return {"positional-only": [p.arg for p in a.posonlyargs], "positional": [p.arg for p in a.args],
            "*args": a.vararg.arg if a.vararg else None, "keyword-only": [p.arg for p in a.kwonlyargs],
            "**kwargs": a.kwarg.arg if a.kwarg else None,
            "defaults": [ast.dump(d) for d in a.defaults],
            "kw-defaults": [ast.dump(d) if d is not None else None for d in a.kw_defaults]}


def _reference_params(op: str, reference_launcher: Path | None) -> dict | None:
    """The launcher's parameters in kernels/<op>.py (parsed, trusted), else those of the op spec's reference."""
    path = reference_launcher or Path(__file__).resolve().parents[2] / "kernels" / f"{op}.py"
    if path.is_file():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == op:
                return _params(node)
    try:  # no kernel file yet: the spec's reference has the launcher's signature (OpSpec.reference)
        import inspect

        from autokernel.ops import get
        src = inspect.getsource(get(op).reference)
        fn = ast.parse(src).body[0]
        return _params(fn) if isinstance(fn, ast.FunctionDef) else None
    except (KeyError, OSError, TypeError, ImportError):
        return None


# --- the checker ----------------------------------------------------------------------------------------------------

def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class _Checker:
    def __init__(self, tree: ast.Module, op: str):
        self.tree, self.op = tree, op
        self.findings: list[Finding] = []
        self.aliases: dict[str, str] = {}  # local name -> qualified module or module.attr
        self.jit_names: set[str] = set()
        self.functions: dict[str, ast.FunctionDef] = {}
        self.module_names: set[str] = set()  # names bound at module level

    def add(self, reason: str, node: ast.AST | None, detail: str) -> None:
        self.findings.append(Finding(reason, getattr(node, "lineno", 0) or 0, detail))

    # qualified names: `tl.sum` -> "triton.language.sum" when tl is an import alias
    def qual(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.qual(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def run(self) -> None:
        body = self.tree.body
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.check_import(node)
        for node in ast.walk(self.tree):  # `t = torch`, `F = torch.nn`: aliases made by assignment count too
            if isinstance(node, ast.Assign) and self.qual(node.value):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.aliases[t.id] = self.qual(node.value)
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
                if any(self.is_jit_decorator(d) for d in node.decorator_list):
                    self.jit_names.add(node.name)
            for t in _bound_names(node):
                self.module_names.add(t)
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and self.qual(node.value.func) == "triton.jit"):
                self.jit_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        self.inner = {id(n.value) for n in ast.walk(self.tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(self.tree):
            self.check_node(node)
        jit_nodes = [self.functions[n] for n in self.jit_names if n in self.functions]
        inside_jit = {id(n) for fn in jit_nodes for n in ast.walk(fn)}
        for fn in jit_nodes:
            self.check_jit_body(fn)
        for node in ast.walk(self.tree):
            if id(node) not in inside_jit:
                self.check_host_node(node)
        for fn in self.functions.values():
            if fn.name not in self.jit_names:
                self.check_state(fn)
                self.check_shape_branches(fn)
        self.check_launches()

    # imports ---------------------------------------------------------------------------------------------------------
    def check_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "kernels" and a.asname is None:
                    continue  # the package only sets TRITON_INTERPRET; reaching into it is checked at each use
                if not self.import_ok(a.name, node):
                    continue
                if a.asname:
                    self.aliases[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    self.aliases[top] = top
            return
        mod = node.module or ""
        if node.level:
            self.add("static.forbidden_import", node, f"relative import 'from {'.' * node.level}{mod}': a candidate "
                                                      "is one self-contained file")
            return
        if mod == "kernels":
            self.add("static.forbidden_import", node, "imports from the trusted package 'kernels' (bypass / "
                                                      "re-export of the old kernels)")
            return
        if not self.import_ok(mod, node):
            return
        for a in node.names:
            if a.name == "*":
                self.add("static.forbidden_import", node, f"'from {mod} import *' hides which names are used")
                continue
            self.aliases[a.asname or a.name] = f"{mod}.{a.name}"

    def import_ok(self, mod: str, node: ast.AST) -> bool:
        if mod == "kernels" or mod.startswith(TRUSTED_PREFIXES):
            self.add("static.forbidden_import", node, f"imports the trusted module '{mod}': a candidate must not "
                                                      "reuse, wrap or re-export the trusted side or the old kernel")
            return False
        if mod in ALLOWED_IMPORTS or mod.startswith(ALLOWED_IMPORT_PREFIXES):
            return True
        self.add("static.forbidden_import", node, f"imports '{mod}': a kernel file may import only torch, triton, "
                                                  "triton.language, math and typing")
        return False

    def is_jit_decorator(self, d: ast.expr) -> bool:
        target = d.func if isinstance(d, ast.Call) else d
        return self.qual(target) == "triton.jit"

    # rules on every node ---------------------------------------------------------------------------------------------
    def check_node(self, node: ast.AST) -> None:
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            self.add("static.fallback", node, "try/except or try/finally: a failing launch must fail, not fall "
                                              "back to other code")
        elif isinstance(node, ast.ClassDef):
            self.add("static.forbidden_call", node, f"class {node.name}: a kernel file defines no classes (tensor "
                                                    "subclasses compute lazily behind the checks)")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            self.add("static.forbidden_call", node, f"{type(node).__name__.lower()} {', '.join(node.names)}: state "
                                                    "kept across calls (caching, call counting)")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_dunder(node.name):
            self.add("static.forbidden_call", node, f"def {node.name}: module hooks change how names resolve")
        elif isinstance(node, (ast.AsyncFunctionDef, ast.Await)):
            self.add("static.forbidden_call", node, "async code: work the caller does not wait for")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in FORBIDDEN_BUILTINS:
                why = BUILTIN_WHY.get(node.id, "introspection / dynamic code")
                self.add("static.forbidden_call", node, f"{node.id}: {why}")
            elif _is_dunder(node.id) and node.id != "__name__":
                self.add("static.forbidden_call", node, f"{node.id}: introspection")
            else:
                self.check_qualified(node)
        elif isinstance(node, ast.Attribute):
            if _is_dunder(node.attr):
                self.add("static.forbidden_call", node, f".{node.attr}: introspection / patching")
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                what = ast.unparse(node)
                if any(p in node.attr for p in PRECISION_NAMES):
                    self.add("static.precision", node, f"sets {what}: a global precision switch")
                else:
                    self.add("static.forbidden_call", node, f"assigns {what}: a kernel file patches nothing "
                                                            "(timers, torch, triton, the harness)")
            elif isinstance(node.ctx, ast.Load) and id(node) not in self.inner:
                self.check_qualified(node)
        elif isinstance(node, ast.Call):
            self.check_call_common(node)

    def check_qualified(self, node: ast.Name | ast.Attribute) -> None:
        """A name rooted in an import: only the allowlisted torch/triton names. Only the outermost link of a chain
        is judged (torch.cuda.Stream, not torch.cuda as well)."""
        q = self.qual(node)
        if q is None:
            return
        if q.startswith("kernels"):
            self.add("static.forbidden_import", node, f"reaches into the trusted package: {q}")
        elif q.startswith("torch."):
            if any(p in q for p in PRECISION_NAMES):
                self.add("static.precision", node, f"{q}: a global precision switch")
            elif q not in TORCH_ALLOWED and any(s in q for s in STREAM_NAMES):
                self.add("static.forbidden_call", node, f"{q}: streams, events and syncs hide work from the timer")
            elif q not in TORCH_ALLOWED and not q.startswith(("torch.version.", "torch.Tensor.")):
                self.add("static.forbidden_call", node, f"{q}: torch beyond allocation, views and dtype facts (the "
                                                        "work belongs in the Triton kernel)")
            elif q.startswith("torch.Tensor."):
                self.add("static.forbidden_call", node, f"{q}: reaching into torch.Tensor (patching / compute)")
        elif q.startswith("triton.") and q not in TRITON_ALLOWED and not q.startswith("triton.language"):
            self.add("static.forbidden_call", node, f"{q}: only triton.jit/autotune/Config/heuristics/cdiv/"
                                                    "next_power_of_2 and triton.language are a kernel's business")

    def check_call_common(self, node: ast.Call) -> None:
        q = self.qual(node.func)
        if q == "triton.jit":
            for k in node.keywords:
                if k.arg not in KERNEL_DECORATOR_KWARGS:
                    self.add("static.forbidden_call", node, f"triton.jit({k.arg}=...): hooks run arbitrary code "
                                                            "around the launch")
        elif q in ("triton.autotune", "triton.Config", "triton.heuristics"):
            for k in node.keywords:
                if k.arg in AUTOTUNE_HOOK_KWARGS:
                    self.add("static.forbidden_call", node, f"{q}({k.arg}=...): a hook runs arbitrary code inside "
                                                            "the launch, or replaces the timer")
        # a call carrying a narrow float dtype: x.to(tl.float16), tl.cast(x, tl.bfloat16), torch.empty(..., half)
        for arg in list(node.args) + [k.value for k in node.keywords]:
            aq = self.qual(arg)
            if aq in NARROW_FLOATS:
                self.add("static.precision", node, f"{ast.unparse(node)[:80]}: computes or stores in "
                                                   f"{aq.split('.')[-1]}; keep the data's own dtype "
                                                   "(x.dtype, ptr.dtype.element_ty)")
        for k in node.keywords:
            v = k.value
            if k.arg == "allow_tf32" and isinstance(v, ast.Constant) and v.value is True or \
                    k.arg == "input_precision" and isinstance(v, ast.Constant) and v.value not in ("ieee", None):
                self.add("static.precision", node, f"{k.arg}={v.value!r}: fp32 inputs multiplied in reduced "
                                                   "precision")
        if isinstance(node.func, ast.Attribute) and node.func.attr in CAST_METHODS:
            self.add("static.precision", node, f".{node.func.attr}(): down-casts the op's data")

    # inside @triton.jit ----------------------------------------------------------------------------------------------
    def check_jit_body(self, fn: ast.FunctionDef) -> None:
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                q = self.aliases.get(node.id)
                if q and not q.startswith(("triton", "math", "typing")):
                    self.add("static.forbidden_call", node, f"{node.id} ({q}) inside @triton.jit {fn.name}: the "
                                                            "interpreter would run it as Python, a GPU never")
                elif node.id in self.functions and node.id not in self.jit_names:
                    self.add("static.forbidden_call", node, f"{fn.name} calls the plain Python function "
                                                            f"{node.id}: only @triton.jit functions run in a kernel")

    # outside @triton.jit: the launcher, helpers, module level -------------------------------------------------------
    def check_host_node(self, node: ast.AST) -> None:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            self.add("static.forbidden_call", node, f"{ast.unparse(node)[:60]}: a matmul in torch, outside the "
                                                    "kernel")
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and self.qual(node) is None:
            if isinstance(node.value, ast.Name) and node.value.id in self.jit_names:
                self.add("static.forbidden_call", node, f"{ast.unparse(node)}: a kernel is launched only as "
                                                        "kernel[grid](...)")
            elif node.attr.startswith("_") and not _is_dunder(node.attr):
                self.add("static.forbidden_call", node, f"{ast.unparse(node)[:60]}: private attribute (cache keys "
                                                        "like _version, internals)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and self.qual(node.func) is None:
            m = node.func.attr
            recv = node.func.value
            if isinstance(recv, ast.Name) and recv.id in self.jit_names:
                return  # reported on the attribute
            if m in CAST_METHODS or m.startswith("_"):
                return  # reported as precision / private attribute
            if m in ("to", "type", "float", "double", "cpu", "cuda"):
                self.add("static.forbidden_call", node, f"{ast.unparse(node)[:60]}: a conversion copy outside the "
                                                        "kernel (load and convert inside it)")
            elif m not in SAFE_METHODS:
                self.add("static.forbidden_call", node, f"{ast.unparse(node)[:60]}: .{m}() is not allocation, a "
                                                        "view or metadata; compute belongs in the Triton kernel")

    def check_state(self, fn: ast.FunctionDef) -> None:
        """Writes to module-level containers from a function keep state across calls (output caches, counters)."""
        local = _local_names(fn)
        for node in ast.walk(fn):
            target = None
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Subscript):
                        target = _root_name(t)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in MUTATING_METHODS):
                target = _root_name(node.func.value)
            if target and target not in local and target in self.module_names:
                self.add("static.forbidden_call", node, f"{fn.name} writes to module-level {target}: state kept "
                                                        "across calls (output caches, call counting)")

    def check_shape_branches(self, fn: ast.FunctionDef) -> None:
        """`if (M, N) == (64, 576)`: a branch on a shape equal to a literal special-cases the shapes tests use."""
        derived: set[str] = set()
        for _ in range(3):  # names derived from names derived from shapes, a few levels deep
            for node in ast.walk(fn):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    if self.shape_derived(node.value, derived):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        for t in targets:
                            derived.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        tests = [n.test for n in ast.walk(fn) if isinstance(n, (ast.If, ast.IfExp, ast.While))]
        tests += [c for n in ast.walk(fn) if isinstance(n, ast.comprehension) for c in n.ifs]
        for test in tests:
            for cmp in (n for n in ast.walk(test) if isinstance(n, ast.Compare)):
                operands = [cmp.left] + cmp.comparators
                for op, a, b in zip(cmp.ops, operands, operands[1:]):
                    for x, y in ((a, b), (b, a)):
                        if isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)) and \
                                self.shape_derived(x, derived) and _special_literal(y):
                            self.add("static.shape_special_case", cmp, f"{ast.unparse(cmp)[:80]} in {fn.name}: a "
                                                                       "branch special-cases a shape")
                            break
                    else:
                        continue
                    break

    def shape_derived(self, node: ast.AST, derived: set[str]) -> bool:
        if isinstance(node, ast.Name):
            return node.id in derived
        if isinstance(node, ast.Attribute):
            return node.attr == "shape"
        if isinstance(node, ast.Subscript):
            return self.shape_derived(node.value, derived)
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in SHAPE_METHODS:
                return True
            if isinstance(f, ast.Name) and f.id in ("min", "max", "abs", "int", "tuple", "list"):
                return any(self.shape_derived(a, derived) for a in node.args)
            return False
        if isinstance(node, ast.BinOp):
            return self.shape_derived(node.left, derived) or self.shape_derived(node.right, derived)
        if isinstance(node, (ast.Tuple, ast.List)):
            return any(self.shape_derived(e, derived) for e in node.elts)
        if isinstance(node, ast.Starred):
            return self.shape_derived(node.value, derived)
        return False

    # the launcher ----------------------------------------------------------------------------------------------------
    def check_signature(self, ref: dict | None) -> None:
        fn = self.functions.get(self.op)
        if fn is None:
            self.add("static.signature", None, f"defines no launcher 'def {self.op}(...)' at module level")
            return
        if fn.decorator_list:
            self.add("static.signature", fn, f"the launcher {self.op} is decorated; it must be a plain function")
        rebinds = [n for n in self.tree.body if self.op in _bound_names(n) and n is not fn]
        if rebinds:
            self.add("static.signature", rebinds[0], f"{self.op} is bound again at module level; the launcher is "
                                                     "one plain def")
        if ref is not None:
            mine = _params(fn)
            for key, want in ref.items():
                if mine[key] != want:
                    if key.endswith("defaults"):
                        self.add("static.signature", fn, f"{self.op}: default values differ from kernels/"
                                                         f"{self.op}.py")
                    else:
                        self.add("static.signature", fn, f"{self.op}: {key} parameters {mine[key]} differ from "
                                                         f"kernels/{self.op}.py's {want}")
                    break

    def check_launches(self) -> None:
        if not self.jit_names:
            self.add("static.no_triton_kernel", None, "defines no @triton.jit kernel")
            return
        fn = self.functions.get(self.op)
        if fn is None:
            return
        seen, todo = set(), [fn.name]
        while todo:  # the launcher and the module-level helpers it calls
            name = todo.pop()
            if name in seen or name not in self.functions:
                continue
            seen.add(name)
            for node in ast.walk(self.functions[name]):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and \
                        isinstance(node.func.value, ast.Name) and node.func.value.id in self.jit_names:
                    return
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                        node.func.id not in self.jit_names:
                    todo.append(node.func.id)
        self.add("static.no_triton_kernel", fn, f"the launcher {self.op} never launches a kernel as "
                                                "kernel[grid](...)")


def _bound_names(node: ast.AST) -> set[str]:
    """Names a module-level statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, (ast.For, ast.With)):
        targets = [node.target] if isinstance(node, ast.For) else [i.optional_vars for i in node.items
                                                                    if i.optional_vars]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _local_names(fn: ast.FunctionDef) -> set[str]:
    a = fn.args
    names = {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}
    names |= {p.arg for p in (a.vararg, a.kwarg) if p}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _special_literal(node: ast.AST) -> bool:
    """An int literal other than 0/1 (or a tuple/list/set holding one): a specific size, not a divisibility test."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool) and node.value not in (0, 1)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _special_literal(node.operand)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_special_literal(e) for e in node.elts)
    return False
