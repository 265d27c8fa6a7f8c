"""The grammar of a kernel's decorators (the static stage, autokernel/gate/static.py): triton.jit with literal
options, triton.heuristics of `lambda args: <arithmetic on args['name']>`, triton.autotune of literal triton.Config
lists (or comprehensions over literals: autokernel/gate/autotune_list.py) keyed on string literals; never a hook
(pre_hook, post_hook, prune_configs_by, reset_to_zero, restore_value, do_bench), which would run arbitrary code around
every launch."""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from autokernel.gate import allowlist as A
from autokernel.gate import autotune_list
from autokernel.gate.static_common import literal, special

if TYPE_CHECKING:
    from autokernel.gate.static_facts import Facts


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
        if isinstance(d, ast.Call) and q == "triton.heuristics":
            _heuristics(d, facts)
        elif isinstance(d, ast.Call) and q == "triton.autotune":
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
        if not isinstance(v, ast.Lambda) or len(v.args.args) != 1 or v.args.defaults or v.args.vararg \
                or v.args.kwarg or v.args.kwonlyargs or v.args.posonlyargs:
            facts.add("static.forbidden_syntax", v, "a heuristic is `lambda args: <expression>`")
            continue
        _heuristic_expr(v.body, v.args.args[0].arg, facts)


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
            ops = [e.left] + e.comparators
            if any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) and (special(a) or special(b))
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
            configs = autotune_list.configs(k.value, facts.config_sources)
            if configs is None:
                facts.add("static.forbidden_syntax", d, "triton.autotune configs=[triton.Config(...), ...]: a "
                                                        "literal list, or a comprehension over literal lists/range()"
                                                        f" (at most {autotune_list.MAX_CONFIGS} configs)")
                continue
            for c in configs:
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
