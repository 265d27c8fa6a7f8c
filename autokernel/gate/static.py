"""The gate's first stage: the candidate file must be a sentence of the kernel-file grammar, or it is rejected.

A grammar, not a ban list (docs/design.md): the file is read top to bottom with ast (never imported or executed, so
this runs in the autokernel process) and every statement, expression, name and attribute must be one the grammar
allows; the tables live in autokernel/gate/allowlist.py, next to the runtime guard's. A kernel file is: the allowed
imports, module constants bound to immutable literals, @triton.jit kernels (autotune/heuristics decorators with
literal configs), and the launcher def(s) of kernels/<op>.py. Kernel bodies: autokernel/gate/static_kernel.py
(decorators: static_decorators.py); launchers: static_host.py (statements) and static_kinds.py (expressions);
shared rules: static_common.py; the types they share (Finding, Facts): static_facts.py. The runtime stage
(autokernel/gate/child.py) does not trust this one.

Every finding is kept, each with a stable reason code, ordered most telling first; the verdict names the first and
the metrics carry all of them, so the agent can fix everything at once.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import TYPE_CHECKING

from autokernel.gate import allowlist as A
from autokernel.gate import autotune_list, static_common, static_decorators, static_host, static_kernel
from autokernel.gate.static_facts import Facts, Finding  # re-exported: callers import them from here
from autokernel.gate.verdict import StageResult

if TYPE_CHECKING:
    from autokernel.policy import Policy

MAX_SOURCE_BYTES = 1 << 20  # a kernel file is a few kB; a megabyte is an attack on the parser, not a kernel

# Reported in this order: the most telling finding first (an import of the old module explains a missing launcher).
REASON_ORDER = ("static.syntax", "static.forbidden_import", "static.fallback", "static.precision",
                "static.no_triton_kernel", "static.mutable_state", "static.forbidden_call",
                "static.forbidden_attribute", "static.forbidden_syntax", "static.shape_special_case",
                "static.signature")


def check_file(path: Path, op: str, reference_launcher: Path, *,
               allow_inline_asm: bool = False) -> StageResult:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        return StageResult.fail("static", "static.syntax", f"cannot read {path}: {e.strerror}")
    return check_source(data, op, reference_launcher, allow_inline_asm=allow_inline_asm)


def check_source(source: str | bytes, op: str, reference_launcher: Path, *,
                 allow_inline_asm: bool = False, policy: Policy | None = None, relative: bool = False) -> StageResult:
    """Parse a candidate for kernels/<op>.py against the grammar; the first finding by REASON_ORDER is the verdict.

    reference_launcher: the incumbent kernels/<op>.py whose launcher signature the candidate must keep (the gate,
    the bench and the targets pass the target checkout's; a path with no file there: see _reference). policy (its
    gate.allow_inline_asm) or allow_inline_asm: whether tl.inline_asm_elementwise is allowed (off by default).
    relative: a target checkout's kernel file (autokernel/target/contract.py), `op` its launcher: what
    the incumbent file itself does is excused (excused)."""
    if policy is not None:
        allow_inline_asm = policy.gate.allow_inline_asm
    findings = find(source, op, reference_launcher, allow_inline_asm=allow_inline_asm, relative=relative)
    if relative:
        findings = excused(findings, find(reference_launcher.read_bytes(), op, reference_launcher,
                                          allow_inline_asm=allow_inline_asm, relative=True))
    if not findings:
        return StageResult.ok("static", "the file is a kernel file: imports, constants, kernels and launcher allowed")
    first = findings[0]
    more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    return StageResult.fail("static", first.reason, first.text() + more,
                            findings=[{"reason": f.reason, "line": f.line, "detail": f.detail} for f in findings])


def find(source: str | bytes, op: str, reference_launcher: Path, *,
         allow_inline_asm: bool = False, relative: bool = False) -> list[Finding]:
    """Every finding, most telling first (REASON_ORDER, then line). reference_launcher: the incumbent kernels/<op>.py
    of the checkout the caller works on (the caller resolves it: autokernel.paths.Layout); none there: the op spec's
    reference gives the signature."""
    if len(source) > MAX_SOURCE_BYTES:
        return [Finding("static.syntax", 0, f"{len(source)} bytes: larger than any kernel file "
                                            f"({MAX_SOURCE_BYTES} max)")]
    try:
        tree = static_common.parse(source)
    except SyntaxError as e:
        return [Finding("static.syntax", e.lineno or 0, f"does not parse: {e.msg}")]
    except (ValueError, RecursionError, MemoryError) as e:
        return [Finding("static.syntax", 0, f"does not parse: {type(e).__name__}")]
    incumbent = _incumbent(Path(reference_launcher))
    facts = Facts(op=op, allow_inline_asm=allow_inline_asm, reference=_reference(op, incumbent), relative=relative,
                  reinterpret=static_common.reinterpretations(incumbent) if incumbent else frozenset())
    try:
        _check_module(tree, facts)
    except RecursionError:
        facts.add("static.syntax", None, "nested too deeply to check")
    out = sorted(set(facts.findings), key=lambda f: (REASON_ORDER.index(f.reason), f.line, f.detail))
    return out


def excused(findings: list[Finding], incumbent: list[Finding]) -> list[Finding]:
    """A target's candidate against the grammar, relative to its incumbent (a third-party file: Liger's imports its
    own helpers, defines autograd classes and backward kernels): a finding is excused when the incumbent has the same
    finding on the very same node (same reason, the same AST, position aside), each incumbent finding excusing one.
    So a candidate may keep, verbatim, what the project already runs, and nothing new outside the grammar: an import
    the incumbent does not make, a new class, a changed helper, a new host-side computation are findings as for
    autokernel's own kernels (docs/targets.md)."""
    budget: dict[tuple[str, str], int] = {}
    for f in incumbent:
        if f.node:
            budget[(f.reason, f.node)] = budget.get((f.reason, f.node), 0) + 1
    out = []
    for f in findings:
        k = (f.reason, f.node)
        if f.node and budget.get(k, 0) > 0:
            budget[k] -= 1
        else:
            out.append(f)
    return out


def _dunders(tree: ast.Module, facts: Facts) -> None:
    """Dunder names and attributes anywhere (__name__, __file__, __import__, __class__, __dict__, __globals__, ...)
    are introspection: they tell the gate from production and reach objects no allowlist names. One rule, whole file
    (the kernel and host checkers leave them to it); a module-level `__all__ = [...]` of strings is the exception."""
    exempt = {id(t) for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name) and t.id == "__all__"}
    for n in ast.walk(tree):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else \
            n.arg if isinstance(n, (ast.arg, ast.keyword)) else None
        if name and name.startswith("__") and name.endswith("__") and id(n) not in exempt:
            facts.add("static.forbidden_attribute", n, f"{name}: dunder names are introspection (module name, file, "
                                                       "builtins, frames, classes) and tell the gate from production")


def _check_module(tree: ast.Module, facts: Facts) -> None:
    _dunders(tree, facts)
    facts.config_sources = autotune_list.sources(tree)
    for node in tree.body:  # imports first: every later rule resolves names through them
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            _check_import(node, facts)
    bound: set[str] = set(facts.aliases)
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                name = a.asname or a.name.split(".")[0]
                if name not in facts.aliases:
                    facts.rejected[name] = node.lineno
            continue
        seen = len(facts.findings)
        names = _binds(node)
        again = names & bound
        if again:
            reason = "static.signature" if facts.op in again else "static.mutable_state"
            facts.add(reason, node, f"{', '.join(sorted(again))} bound again at module level: every module "
                                    "name is bound once")
        bound |= names
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # a docstring or a string comment
        if isinstance(node, ast.FunctionDef):
            _check_def(node, facts)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            _check_constant(node, facts)
        else:
            _module_statement(node, facts)
        if len(facts.findings) > seen:
            facts.rejected.update((n, node.lineno) for n in names if n not in facts.aliases)
    for fn in facts.jit.values():
        static_kernel.check_kernel(fn, facts)
    for fn in facts.launchers.values():
        static_host.check_launcher(fn, facts)
    _check_signature(facts)


def _binds(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else \
        [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For)) else []
    out = set()
    for t in targets:
        for n in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
            if isinstance(n, ast.Name):
                out.add(n.id)
    return out


def _module_statement(node: ast.AST, facts: Facts) -> None:
    """Any other module-level statement is outside the grammar; each gets the code that says why."""
    kind = type(node).__name__
    if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
        facts.add("static.fallback", node, "try at module level: a failure must surface, not fall back")
    elif isinstance(node, (ast.Global, ast.Nonlocal, ast.AugAssign)):
        facts.add("static.mutable_state", node, f"{kind} at module level: module state changes at import")
    elif isinstance(node, ast.Expr):
        what = ast.unparse(node.value)[:60]
        if _mentions_precision(node.value):
            facts.add("static.precision", node, f"{what}: a global precision switch")
        else:
            facts.add("static.forbidden_call", node, f"{what}: code run at import; a kernel file only defines "
                                                     "kernels, constants and the launcher")
    elif isinstance(node, ast.ClassDef):
        facts.add("static.forbidden_syntax", node, f"class {node.name}: a kernel file defines no classes (tensor "
                                                   "subclasses compute lazily behind the checks)")
    else:
        facts.add("static.forbidden_syntax", node, f"{kind} statement at module level: a kernel file holds "
                                                   "imports, constants, @triton.jit kernels and the launcher only")


def _mentions_precision(node: ast.AST) -> bool:
    return any(isinstance(n, (ast.Attribute, ast.Name)) and any(w in (n.attr if isinstance(n, ast.Attribute)
                                                                      else n.id) for w in A.PRECISION_WORDS)
               for n in ast.walk(node))


# --- imports --------------------------------------------------------------------------------------------------------

def _check_import(node: ast.Import | ast.ImportFrom, facts: Facts) -> None:
    if isinstance(node, ast.Import):
        for a in node.names:
            want = A.IMPORTS.get(a.name)
            bound = a.asname or a.name.split(".")[0]
            if want is None:
                facts.add("static.forbidden_import", node, _why_import(a.name))
            elif a.asname is None and "." in a.name:
                facts.aliases["triton"] = "triton"  # `import triton.language` binds triton
            elif bound != want:
                facts.add("static.forbidden_import", node, f"import {a.name} as {bound}: bind it as '{want}'")
            else:
                facts.aliases[bound] = a.name
        return
    mod = node.module or ""
    if node.level:
        where = f"relative import 'from {'.' * node.level}{mod} import {', '.join(a.name for a in node.names)}'"
        facts.add("static.forbidden_import", node, f"{where}: a candidate may import only what the incumbent file "
                                                   "imports, statement for statement" if facts.relative else
                                                   f"{where}: a candidate is one self-contained file")
        return
    names = A.FROM_IMPORTS.get(mod)
    if names is None:
        facts.add("static.forbidden_import", node, _why_import(mod))
        return
    for a in node.names:
        if a.name not in names or (a.asname and a.asname != a.name):
            facts.add("static.forbidden_import", node, f"from {mod} import {a.name}"
                                                       f"{' as ' + a.asname if a.asname else ''}: only "
                                                       "allowlisted names, under their own names")
        elif mod != "__future__":
            facts.aliases[a.name] = f"{mod}.{a.name}"


def _why_import(mod: str) -> str:
    if mod.split(".")[0] in ("kernels", "autokernel"):
        return (f"imports the trusted module '{mod}': a candidate must not reuse, wrap or re-export the trusted "
                "side or the old kernel")
    return f"imports '{mod}': a kernel file imports only torch, triton, triton.language as tl and math"


# --- module-level definitions -----------------------------------------------------------------------------------------

def _launcher_decorators(fn: ast.FunctionDef, facts: Facts) -> None:
    """A target's launcher under decorators (vLLM's `@torch.inference_mode()` on its attention launchers): each is a
    finding keyed on the launcher's name and the decorator's whole expression, so only the incumbent's own decorators
    of that very launcher, verbatim, are excused (static.excused); the body is checked as any launcher's."""
    for d in fn.decorator_list:
        facts.findings.append(Finding("static.signature", d.lineno, f"the launcher {fn.name} is decorated "
                                      f"(@{ast.unparse(d)[:60]}): only the incumbent's own decorators of it, "
                                      "verbatim", f"decorator {fn.name} {ast.dump(d)}"))


def _check_def(fn: ast.FunctionDef, facts: Facts) -> None:
    if fn.decorator_list:
        if static_kernel.is_jit(fn.decorator_list[-1], facts):
            facts.jit[fn.name] = fn
            static_decorators.check_decorators(fn, facts)
        elif (fn.name in facts.reference or fn.name == facts.op) and facts.relative:
            _launcher_decorators(fn, facts)
            facts.launchers[fn.name] = fn
        elif fn.name in facts.reference or fn.name == facts.op:
            facts.add("static.signature", fn, f"the launcher {fn.name} is decorated; it must be a plain function")
        else:
            facts.add("static.forbidden_syntax", fn, f"def {fn.name}: decorated, but not a @triton.jit kernel "
                                                     "(its innermost decorator must be triton.jit)")
        return
    if fn.name in facts.reference or fn.name == facts.op:
        facts.launchers[fn.name] = fn
    elif fn.name in facts.config_sources:
        return  # `def get_autotune_config(): return [...]`, named only in configs=: its configs are checked there
    elif fn.name.startswith("__"):
        facts.add("static.forbidden_attribute", fn, f"def {fn.name}: module hooks change how names resolve")
    else:
        public = ", ".join(sorted(facts.reference)) or facts.op
        facts.add("static.forbidden_syntax", fn, f"def {fn.name}: a plain function that is not the launcher "
                                                 f"({public}); inline it in the launcher or make it @triton.jit")


def _check_constant(node: ast.Assign | ast.AnnAssign, facts: Facts) -> None:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    if isinstance(node, ast.AnnAssign):
        static_common.check_annotation(node.annotation, facts)
    names = [t.id for t in targets if isinstance(t, ast.Name)]
    if len(names) != len(targets):
        text = ast.unparse(targets[0])[:50]
        if _mentions_precision(node):
            facts.add("static.precision", node, f"sets {text}: a global precision switch")
        else:
            facts.add("static.mutable_state", node, f"assigns {text}: module level binds plain names to constants "
                                                    "only (attributes set at import patch torch, triton or the "
                                                    "harness)")
        return
    if node.value is None:
        return
    if len(names) == 1 and names[0] in facts.config_sources:
        return  # `CONFIGS = [triton.Config(...), ...]`, named only in configs=: its configs are checked there
    if any(n.startswith("__") for n in names):
        if names == ["__all__"] and not (isinstance(node.value, (ast.Tuple, ast.List)) and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.value.elts)):
            facts.add("static.mutable_state", node, "__all__ lists string literals")
        return  # other dunders: reported by _dunders
    for n in ast.walk(node.value):
        if isinstance(n, (ast.Attribute, ast.Name)):
            static_common.narrow(n, facts.qual(n), set(), facts)
    if any(isinstance(n, ast.Name) and n.id.startswith("__") or isinstance(n, ast.Attribute) and
           n.attr.startswith("__") for n in ast.walk(node.value)):
        facts.rejected.update((n, node.lineno) for n in names)
        return  # reported by _dunders
    why = _constant_why(node.value, facts)
    if why:
        reason, text = why
        facts.add(reason, node, f"{', '.join(names)} = {ast.unparse(node.value)[:50]}: {text}")
        return
    dtype = facts.qual(node.value) if isinstance(node.value, (ast.Attribute, ast.Name)) else None
    for name in names:
        facts.constants[name] = dtype


def _constant_why(v: ast.AST, facts: Facts) -> tuple[str, str] | None:
    """None when `v` is an immutable literal expression (the only module state a kernel file may have)."""
    if isinstance(v, ast.Constant):
        return None
    if isinstance(v, ast.Tuple):
        return next((w for w in (_constant_why(e, facts) for e in v.elts) if w), None)
    if isinstance(v, ast.UnaryOp):
        return _constant_why(v.operand, facts)
    if isinstance(v, ast.BinOp) and not isinstance(v.op, ast.MatMult):
        return _constant_why(v.left, facts) or _constant_why(v.right, facts)
    if isinstance(v, ast.Name) and v.id in facts.constants:
        return None
    q = facts.qual(v)
    if q and (q in {f"torch.{d}" for d in A.TORCH_DTYPES} | {f"triton.language.{d}" for d in A.TL_DTYPES} or
              q in {f"math.{c}" for c in A.MATH_CONSTANTS}):
        return None
    if q and isinstance(v, ast.Attribute):
        return "static.forbidden_attribute", f"{q} is not an allowlisted name (os, sys, internals reached through " \
                                             "a module)"
    if isinstance(v, ast.Subscript):
        return _constant_why(v.value, facts) or ("static.mutable_state", "module constants are immutable literals")
    if isinstance(v, ast.Call) and not v.keywords:
        fq = facts.qual(v.func)
        pure = {"triton.language.constexpr", "triton.cdiv", "triton.next_power_of_2"} | \
            {f"math.{f}" for f in A.MATH_FUNCTIONS}
        if fq in pure or isinstance(v.func, ast.Name) and v.func.id in ("float", "int"):
            return next((w for w in (_constant_why(a, facts) for a in v.args) if w), None)
        return "static.forbidden_call", "code run at import; module constants are literals"
    if isinstance(v, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return "static.mutable_state", "a mutable module-level object keeps state across calls (caches, counters)"
    if isinstance(v, ast.Lambda):
        return "static.forbidden_syntax", "a module-level function value; kernels are @triton.jit defs"
    return "static.mutable_state", "module constants are immutable literals (numbers, strings, tuples, dtypes)"


# --- the launcher's signature ---------------------------------------------------------------------------------------

def _params(fn: ast.FunctionDef) -> dict:
    a = fn.args
    return {"positional-only": [p.arg for p in a.posonlyargs], "positional": [p.arg for p in a.args],
            "*args": a.vararg.arg if a.vararg else None, "keyword-only": [p.arg for p in a.kwonlyargs],
            "**kwargs": a.kwarg.arg if a.kwarg else None,
            "defaults": [ast.dump(d) for d in a.defaults],
            "kw-defaults": [ast.dump(d) if d is not None else None for d in a.kw_defaults],
            "annotations": {p.arg: p.annotation for p in a.posonlyargs + a.args + a.kwonlyargs}}


def _incumbent(path: Path) -> ast.Module | None:
    """The incumbent kernels/<op>.py at `path`, parsed (trusted); None if there is none."""
    return static_common.parse(path.read_text()) if path.is_file() else None


def _triton_decorator(d: ast.expr) -> bool:
    """`@triton.jit`, `@triton.autotune(...)`, `@triton.heuristics(...)` (by name): a kernel, not a launcher."""
    f = d.func if isinstance(d, ast.Call) else d
    return (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) in ("jit", "autotune", "heuristics")


def _reference(op: str, incumbent: ast.Module | None) -> dict[str, dict]:
    """The public launcher(s) of the incumbent kernels/<op>.py: name -> parameters; else the op spec's reference
    function's signature; else nothing (then only the name is checked)."""
    if incumbent is not None:
        out = {}
        for node in incumbent.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and not any(
                    _triton_decorator(d) for d in node.decorator_list):
                out[node.name] = _params(node)
        if out:
            return out
    try:  # no kernel file yet: the spec's reference has the launcher's signature (OpSpec.reference)
        import inspect

        from autokernel.ops import get
        fn = static_common.parse(inspect.getsource(get(op).reference).lstrip()).body[0]
        return {op: _params(fn)} if isinstance(fn, ast.FunctionDef) else {}
    except (KeyError, OSError, TypeError, ImportError, SyntaxError):
        return {}


def _check_signature(facts: Facts) -> None:
    if facts.op not in facts.launchers:
        facts.add("static.signature", None, f"defines no launcher 'def {facts.op}(...)' at module level")
    for name, fn in facts.launchers.items():
        want = facts.reference.get(name)
        if want is None:
            continue
        mine = _params(fn)
        for key, value in want.items():
            if key != "annotations" and mine[key] != value:
                what = "default values differ" if key.endswith("defaults") else \
                    f"{key} parameters {mine[key]} differ from {value}"
                facts.add("static.signature", fn, f"{name}: {what} (kernels/{facts.op}.py)")
                break
    if not facts.jit:
        facts.add("static.no_triton_kernel", None, "defines no @triton.jit kernel")
    elif facts.op in facts.launchers and not static_host.launches(facts.launchers[facts.op], facts):
        facts.add("static.no_triton_kernel", facts.launchers[facts.op],
                  f"the launcher {facts.op} never launches a kernel as kernel[grid](...)")
