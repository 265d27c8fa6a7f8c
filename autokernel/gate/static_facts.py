"""The static stage's shared types: a Finding, and the Facts a module binds, which every checker of the stage
(autokernel/gate/static.py and its static_*.py grammars) reads and adds findings to. Down here so that the
grammars import it and never static.py, which imports them.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    reason: str
    line: int
    detail: str
    node: str = field(default="", compare=False)  # what a target's incumbent must share to excuse it (_node_key)

    def text(self) -> str:
        return f"line {self.line}: {self.detail}" if self.line else self.detail


def _node_key(node) -> str:
    """What an incumbent's finding must share with a candidate's to excuse it (static.excused): the node, position-free;
    for a call, its callee (the incumbent calls its helper `calculate_settings` or libdevice's `rsqrt`: a candidate
    may call them, on other arguments too); for a `with`, its header (the body's statements are checked one by
    one)."""
    if not isinstance(node, ast.AST):
        return ""
    if isinstance(node, ast.Call):
        return "call " + ast.dump(node.func)
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return "with " + ast.dump(ast.Tuple(elts=[i.context_expr for i in node.items], ctx=ast.Load()))
    return ast.dump(node)


@dataclass
class Facts:
    """What the module level binds, shared by the kernel and host checkers."""
    op: str
    allow_inline_asm: bool
    reference: dict[str, dict]  # launcher name -> its parameters in the incumbent (see static._params)
    relative: bool = False  # a target's file, judged relative to its incumbent (excused): `with` bodies are checked
    reinterpret: frozenset[str] = frozenset()  # bit reinterpretation the incumbent uses (static_common.reinterpret)
    aliases: dict[str, str] = field(default_factory=dict)  # local name -> qualified: tl -> triton.language
    jit: dict[str, ast.FunctionDef] = field(default_factory=dict)
    launchers: dict[str, ast.FunctionDef] = field(default_factory=dict)
    constants: dict[str, str | None] = field(default_factory=dict)  # name -> qualified dtype it names, else None
    findings: list[Finding] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)  # names bound by a rejected statement -> its line
    # module names that stand for an autotune config list (autokernel/gate/autotune_list.py sources) -> the list
    config_sources: dict[str, ast.expr] = field(default_factory=dict)

    def add(self, reason: str, node: ast.AST | None, detail: str) -> None:
        self.findings.append(Finding(reason, getattr(node, "lineno", 0) or 0, detail, _node_key(node)))

    def qual(self, node: ast.AST) -> str | None:
        """`tl.sum` -> "triton.language.sum" when rooted in an import; a dtype constant -> its dtype."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id) or self.constants.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.qual(node.value)
            return f"{base}.{node.attr}" if base else None
        return None
