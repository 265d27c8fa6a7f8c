"""The offline agent: coordinate descent over a kernel's launch meta-parameters, speaking the Model protocol.

It needs no key and no network, and runs through the same loop, tools and evaluator as an LLM: it calls
read_kernel, finds the tunable knobs in the source's AST (UPPER_CASE *BLOCK* keywords of `kernel[grid](...)`
launches whose value is an int literal, or a name the launcher or the module binds once to one; the literal *BLOCK*
entries of each @triton.autotune `triton.Config`; and, on CUDA only,
num_warps / num_stages, added where a launch leaves them to Triton's default: the Triton interpreter ignores both,
so on CPU they are never proposed), then submits complete files that differ from the incumbent only in those
literals (so every proposal stays inside the gate's static grammar). From the incumbent it steps one knob at a time
to its power-of-two neighbour, keeps going in a direction while the step pays, and sweeps the knobs (in a seeded
order) until a sweep finds nothing better: tens of evaluations where the full grid is tens of thousands (matmul's 5
knobs: 33,275 configs; the synthetic bowl in tests/agent/test_agent_search.py is solved in under 40). A step pays only
when the candidate's speedup interval clears the policy's bar over the best so far (its lower bound > best x
bench.min_speedup): a noisy 1.005 is not a direction. It stops proposing when the wall-clock time left cannot fit
another evaluation as long as the longest one so far. Blocks computed by the launcher (e.g.
`BLOCK_N=triton.next_power_of_2(N)`) are not literals and are left alone. Illegal proposals beyond the bounds below
are never made; anything else the gate rejects counts as a failed step.
"""
from __future__ import annotations

import ast
import json
import math
import random
import time
from dataclasses import dataclass, replace
from typing import Generator, TypeGuard

from autokernel import paths
from autokernel.deadline import Deadline
from autokernel.policy import Bench

POW2_BLOCKS = tuple(2 ** i for i in range(4, 15))  # 16 .. 16384: tl.dot needs every dim >= 16
NUM_WARPS = (1, 2, 4, 8, 16)
NUM_STAGES = (1, 2, 3, 4, 5)
TRITON_DEFAULTS = {"num_warps": 4, "num_stages": 3}  # what a CUDA launch uses when the keyword is absent
# Cap on the product of one launch's blocks (= a 128 x 128 x 64 matmul tile). A bound to keep the search where GPU
# compiles succeed and interpreter runs finish, not a measurement; the gate still judges whatever is proposed.
MAX_TILE_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class Knob:
    name: str  # unique in the file: the keyword, with "@<launch>" when several launches have it
    kwarg: str  # BLOCK_N, num_warps, ...
    launch: int  # index of the kernel[grid](...) call in source order
    value: int | None  # the literal in the source; None where the keyword is absent
    start: int  # character offsets of the literal; start == end is the insertion point of an absent keyword
    end: int
    choices: tuple[int, ...]

    @property
    def default(self) -> int:
        return self.value if self.value is not None else TRITON_DEFAULTS[self.kwarg]


def _offsets(source: str) -> list[int]:
    starts, pos = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(pos)
        pos += len(line)
    return starts + [pos]


def _char(source_lines: list[str], starts: list[int], lineno: int | None, col_bytes: int | None) -> int:
    """AST (line, UTF-8 byte column) -> character offset in the source."""
    assert lineno is not None and col_bytes is not None, "a parsed node has its position"
    line = source_lines[lineno - 1]
    return starts[lineno - 1] + len(line.encode()[:col_bytes].decode(errors="ignore"))


def _kernels(tree: ast.AST) -> tuple[set[str], bool]:
    """(names of the file's Triton kernels, whether any is @triton.autotune'd: its configs own num_warps/stages)."""
    names, autotuned = set(), False
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                text = ast.unparse(d)
                if "jit" in text or "autotune" in text or "heuristics" in text:
                    names.add(node.name)
                autotuned |= "autotune" in text
    return names, autotuned


def _is_block(kwarg: str) -> bool:
    return kwarg.isupper() and "BLOCK" in kwarg


def _int_literal(node: ast.AST | None) -> TypeGuard[ast.Constant]:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _bound_literal(name: str, scopes: list[ast.AST]) -> ast.Constant | None:
    """The int literal `name` is bound to, innermost scope first: one `name = <int>` and no other binding there
    (a parameter, a loop target, a second assignment all make it something the launcher computes)."""
    for scope in scopes:
        if isinstance(scope, ast.Module):
            nodes = [n for top in scope.body if not isinstance(top, (ast.FunctionDef, ast.ClassDef))
                     for n in ast.walk(top)]
        else:
            nodes = list(ast.walk(scope))
        stores = [n for n in nodes if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)]
        if any(isinstance(n, ast.arg) and n.arg == name for n in nodes) or len(stores) > 1:
            return None
        if stores:
            assign = next((n for n in nodes if isinstance(n, ast.Assign) and n.targets == [stores[0]]), None)
            return assign.value if assign is not None and _int_literal(assign.value) else None
    return None


def find_knobs(source: str, launch_options: bool = True) -> list[Knob]:
    """The launch meta-parameters a search may change, in source order. launch_options: num_warps / num_stages too
    (False under the Triton interpreter, which ignores them)."""
    tree = paths.parse(source)
    jit, autotuned = _kernels(tree)
    lines, starts = source.splitlines(keepends=True), _offsets(source)
    enclosing: dict[ast.AST, ast.FunctionDef] = {}
    for fn in ast.walk(tree):  # breadth-first: an inner function's nodes are claimed last, by the inner one
        if isinstance(fn, ast.FunctionDef):
            enclosing.update({n: fn for n in ast.walk(fn)})
    launches = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
                and isinstance(n.func.value, (ast.Name, ast.Attribute))
                and (not jit or ast.unparse(n.func.value).split(".")[-1] in jit)]
    launches.sort(key=lambda n: (n.lineno, n.col_offset))
    found: list[Knob] = []
    for i, call in enumerate(launches):
        present = {kw.arg for kw in call.keywords}
        for kw in call.keywords:
            v: ast.expr | None = kw.value
            if not kw.arg or not (_is_block(kw.arg) or (launch_options and kw.arg in TRITON_DEFAULTS)):
                continue
            if isinstance(v, ast.Name):  # BLOCK_N=BLOCK_N, bound once to a literal by the launcher or the module
                v = _bound_literal(v.id, [s for s in (enclosing.get(call), tree) if s is not None])
            if not _int_literal(v):
                continue
            knob = _literal_knob(kw.arg, kw.arg, i, v, lines, starts)
            if all(k.start != knob.start for k in found):  # one literal shared by several launches is one knob
                found.append(knob)
        ends: list[ast.expr | ast.keyword] = [*call.args, *call.keywords]
        last = max(ends, key=lambda n: (n.end_lineno or 0, n.end_col_offset or 0), default=None)
        if last is not None and not autotuned and launch_options:
            at = _char(lines, starts, last.end_lineno, last.end_col_offset)
            for kwarg in ("num_warps", "num_stages"):
                if kwarg not in present:
                    found.append(Knob(kwarg, kwarg, i, None, at, at,
                                      NUM_WARPS if kwarg == "num_warps" else NUM_STAGES))
    found += _config_knobs(tree, lines, starts, len(launches), launch_options)
    counts: dict[str, int] = {}
    for k in found:
        counts[k.kwarg] = counts.get(k.kwarg, 0) + 1
    return [replace(k, name=f"{k.kwarg}@{k.launch}") if counts[k.kwarg] > 1 and k.name == k.kwarg else k
            for k in found]


def _config_knobs(tree: ast.AST, lines: list[str], starts: list[int], first: int, launch_options: bool) -> list[Knob]:
    """The int literals of each `triton.Config({...}, num_warps=..., num_stages=...)` in a @triton.autotune list:
    its UPPER_CASE *BLOCK* entries (and, where launches compile, num_warps / num_stages given as literals). Each
    config is its own group (`launch` first + j: MAX_TILE_ELEMENTS bounds its blocks' product), so the search reshapes
    the configs the autotuner chooses among; the gate judges every config at every shape."""
    configs = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1] == "Config"]
    configs.sort(key=lambda n: (n.lineno, n.col_offset))
    found: list[Knob] = []
    for j, call in enumerate(configs):
        pairs: list[tuple[str, ast.expr]] = []
        if call.args and isinstance(call.args[0], ast.Dict):
            pairs += [(k.value, v) for k, v in zip(call.args[0].keys, call.args[0].values)
                      if isinstance(k, ast.Constant) and isinstance(k.value, str) and _is_block(k.value)]
        if launch_options:
            pairs += [(kw.arg, kw.value) for kw in call.keywords if kw.arg in TRITON_DEFAULTS]
        for name, v in pairs:
            if not _int_literal(v):
                continue
            found.append(_literal_knob(f"{name}@config{j}", name, first + j, v, lines, starts))
    return found


def _literal_knob(name: str, kwarg: str, group: int, v: ast.Constant, lines: list[str], starts: list[int]) -> Knob:
    """The knob of one int literal in the source: its offsets, and the power-of-2 (or launch option) choices."""
    value = v.value
    assert isinstance(value, int)  # _int_literal
    base = POW2_BLOCKS if _is_block(kwarg) else NUM_WARPS if kwarg == "num_warps" else NUM_STAGES
    a, b = _char(lines, starts, v.lineno, v.col_offset), _char(lines, starts, v.end_lineno, v.end_col_offset)
    return Knob(name, kwarg, group, value, a, b, tuple(sorted(set(base) | {value})))


def apply(source: str, knobs: list[Knob], config: dict[str, int]) -> str:
    """The source with each knob set to config[name]; absent keywords equal to Triton's default stay absent."""
    edits = []
    for k in knobs:
        v = config.get(k.name, k.default)
        if k.value is None:
            if v != TRITON_DEFAULTS[k.kwarg]:
                edits.append((k.start, k.end, f", {k.kwarg}={v}"))
        elif v != k.value:
            edits.append((k.start, k.end, str(v)))
    for a, b, text in sorted(reversed(edits), key=lambda e: e[0], reverse=True):  # back to front, knob order kept
        source = source[:a] + text + source[b:]
    return source


def legal(knobs: list[Knob], config: dict[str, int]) -> bool:
    tiles: dict[int, int] = {}
    for k in knobs:
        if _is_block(k.kwarg):
            tiles[k.launch] = tiles.get(k.launch, 1) * config[k.name]
    return all(t <= MAX_TILE_ELEMENTS for t in tiles.values())


def coordinate_descent(knobs: list[Knob], seed: int = 0, min_gain: float = 1.0,
                       up_first: bool = False) -> Generator[dict[str, int], object, None]:
    """Yields configs {knob: value}; is sent each one's score over the incumbent: a speedup, (speedup, its
    interval's lower bound), or None (rejected). A step is taken only when the lower bound beats the best score by
    min_gain (the bench's bar); starts at the incumbent (score 1 by definition), never yields a config twice.
    up_first: try the larger value of each knob first (else a seeded coin decides the direction)."""
    rng = random.Random(seed)
    best = {k.name: k.default for k in knobs}
    best_score, seen = 1.0, {tuple(sorted(best.items()))}
    order = list(knobs)
    rng.shuffle(order)
    improved = True
    while improved:
        improved = False
        for k in order:
            for direction in (1, -1) if up_first else rng.sample((1, -1), 2):
                while True:  # a line search: keep stepping while it pays
                    i = k.choices.index(best[k.name]) + direction
                    if not 0 <= i < len(k.choices):
                        break
                    cand = {**best, k.name: k.choices[i]}
                    key = tuple(sorted(cand.items()))
                    if key in seen or not legal(knobs, cand):
                        break
                    seen.add(key)
                    score = yield cand
                    est, lo = (score, score) if not isinstance(score, tuple) else score
                    if est is None or not lo > best_score * min_gain:
                        break
                    best, best_score, improved = cand, est, True


def grid_size(knobs: list[Knob]) -> int:
    return math.prod(len(k.choices) for k in knobs)


class SearchModel:
    """The offline search as a Model: reads the kernel through the read_kernel tool, then proposes candidates.

    interpreter: whether kernels run through the Triton interpreter (default: this machine's device), where
    num_warps / num_stages do nothing and are not searched. min_speedup: the step bar (default bench.min_speedup's
    default; agent.command.make_model passes the policy's). clock: for the evaluation times that bound the wall
    budget."""

    def __init__(self, seed: int = 0, *, interpreter: bool | None = None, min_speedup: float | None = None,
                 clock=time.monotonic):
        if interpreter is None:
            from autokernel import device
            interpreter = device.kind() == "cpu-interpreter"
        self.seed, self.name, self.prices = seed, f"search:seed={seed}", None
        self.model: str | None = None  # no server
        self.interpreter, self.clock = interpreter, clock
        self.min_speedup = Bench().min_speedup if min_speedup is None else min_speedup
        self.source: str | None = None
        self.knobs: list[Knob] = []
        self.search: Generator[dict[str, int], object, None] | None = None
        self.pending: str | None = None  # the tool_call_id of the last proposal
        self.proposed_at: float | None = None
        self.eval_s: list[float] = []  # how long each proposal took to come back judged
        self.n = 0

    def query(self, messages: list[dict], tools: list[dict], deadline: Deadline = Deadline.none()) -> dict:
        if self.proposed_at is not None:
            self.eval_s.append(self.clock() - self.proposed_at)
        if self.source is None:
            self.source = _tool_result(messages, "read_kernel")
            if self.source is None:
                return _reply("Reading the kernel to find its launch meta-parameters.",
                              {"id": "search_read", "name": "read_kernel", "arguments": {}})
            self.knobs = find_knobs(self.source, launch_options=not self.interpreter)
            # Under the interpreter every tl op of every loop iteration is a round of numpy calls: larger blocks
            # (fewer iterations) are the likelier win, and a smaller one the costlier evaluation, so up goes first.
            self.search = coordinate_descent(self.knobs, self.seed, self.min_speedup, up_first=self.interpreter)
            if not self.knobs:
                return _finish("no tunable launch meta-parameters (UPPER_CASE *BLOCK* literals" +
                               (")" if self.interpreter else ", num_warps, num_stages)") + " in this kernel's "
                               "launches: nothing for the offline search to try")
        if self.eval_s and max(self.eval_s) > (left := deadline.left()):
            return _finish(f"stopped after {self.n} candidates: another evaluation takes ~{max(self.eval_s):.0f} s "
                           f"(the longest so far) and {left:.0f} s of the wall-clock budget are left")
        assert self.search is not None  # made with the knobs, above
        try:
            config = next(self.search) if self.pending is None else self.search.send(_score(messages, self.pending))
        except StopIteration:
            return _finish(f"coordinate descent converged after {self.n} candidates over {len(self.knobs)} knobs "
                           f"({', '.join(k.name for k in self.knobs)}; full grid {grid_size(self.knobs)})")
        self.n += 1
        self.pending, self.proposed_at = f"search_{self.n}", self.clock()
        changed = ", ".join(f"{k.name} {k.default}->{config[k.name]}" for k in self.knobs
                            if config[k.name] != k.default)
        return _reply(f"Candidate {self.n}: {changed} (coordinate descent from the incumbent, seed {self.seed}).",
                      {"id": self.pending, "name": "submit_candidate",
                       "arguments": {"source": apply(self.source, self.knobs, config)}})


def _reply(text: str, call: dict) -> dict:
    return {"role": "assistant", "content": text, "tool_calls": [call],
            "usage": {"input_tokens": 0, "output_tokens": 0, "usd": 0.0, "estimated": False}}


def _finish(summary: str) -> dict:
    return _reply(summary, {"id": "search_finish", "name": "finish", "arguments": {"summary": summary}})


def _tool_result(messages: list[dict], name: str) -> str | None:
    return next((m["content"] for m in reversed(messages) if m["role"] == "tool" and m["name"] == name), None)


def _score(messages: list[dict], call_id: str) -> tuple[float, float] | None:
    """The search's objective from the evaluator's JSON feedback: (speedup, its interval's lower bound) if the gate
    accepted and the bench measured a plausible speedup, else None."""
    text = next((m["content"] for m in reversed(messages) if m["role"] == "tool" and m["tool_call_id"] == call_id),
                None)
    try:
        fb = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(fb, dict) or fb.get("verdict") != "accepted" or fb.get("implausible"):
        return None
    est, ci = fb.get("speedup"), fb.get("speedup_ci")
    if not isinstance(est, (int, float)):
        return None
    return float(est), float(ci[0]) if isinstance(ci, list) and ci and isinstance(ci[0], (int, float)) else float(est)
