"""A target's declaration: `autokernel.toml` at the root of the checkout (field by field: docs/targets.md).

    [engine]
    build = "llama_liger.engine:build"        # () -> an object with workload() and logits(ids)

    [ops.rms_norm]                             # one table per op the loop may rewrite; the name is the file's stem
    file = "llama_liger/ops/rms_norm.py"       # a regular file inside the checkout, not a symlink
    launchers = ["rms_norm_forward"]           # functions of that file the engine calls (the public signature)
    reference = "llama_liger.reference:rms_norm_forward"   # torch, with the launcher's signature ("TODO": not yet)
    outputs = [0, 2]                           # optional: which return values are compared (default: all tensors)
    # a launcher that returns no tensor (vLLM's decode_attention_fwd(q, k, v, o, ..., attn_logits, ...)) names the
    # written arguments that are its result: outputs = ["o"]; the others it writes are scratch, never compared
    # an op whose file has several launchers the engine calls declares each, with one reference (and outputs) per
    # launcher: reference = { fwd = "pkg.ref:fwd", bwd = "pkg.ref:bwd" }, outputs = { fwd = [0] }; the gate
    # judges every one of them (a candidate for the file replaces them all)
    tolerance = { atol = 1e-5, rtol = 1e-5 }   # optional: replaces the derived tolerance
    protected = false                          # optional: true = never rewritten
    work = { flops = "4 * X.numel", bytes = "2 * X.nbytes + W.nbytes" }   # optional: per call, for roofline ranking
    inputs = { eps = { low = 1e-6, high = 1e-5, common = [1e-6, 1e-5] } }  # optional: what random values respect
    sizes = { hidden = { of = ["X.shape[-1]", "W.shape[0]"], low = 1, high = 8192, also = [431] } }  # optional
    doc = "RMSNorm of each row of X, scaled by W"   # optional: what it computes, for the prompt and the verdict
    dtypes = ["float32", "bfloat16"]           # optional: the float dtypes production runs, besides the workload's

The file is untrusted input (docs/design.md, trust rule 6): it is read as a regular file inside the checkout, every
module and file it names must be one too, and nothing in it is imported or run here: its code runs in the sandbox.
"""
from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autokernel import paths
from autokernel.errors import UserError
from autokernel.policy import parse_untrusted

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

NAME = "autokernel.toml"
TODO = "TODO"
ENTRY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*\Z")
QUALNAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
OP_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
# an op's `file`: reaches a commit message's subject, a PR body and a shell line, so no spaces, `#`, `@`, quotes
FILE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*\.py\Z")
OP_FIELDS = {"file", "launchers", "reference", "outputs", "tolerance", "protected", "inputs", "work", "sizes", "doc",
             "dtypes"}
DTYPES = ("float16", "bfloat16", "float32", "float64")  # what `dtypes` may name: the gate's float case dtypes
INPUT_FIELDS = {"repeat", "low", "high", "common"}  # per launcher parameter: what the gate's random values respect
MAX_COMMON = 16  # values in a scalar's `common` list, or a size's `also` list
MAX_DOC = 2000  # characters of an op's `doc`
SIZE_COLUMN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\.shape\[(-?[0-9])\])?\Z")  # X.shape[-1], or an int n_cols
MAX_SIZE = 1 << 20
HELP = "(docs/targets.md)"


@dataclass(frozen=True)
class Size:
    """A size of the launcher's inputs other than the token count, free in production (a hidden or head size: the
    workload's model has one, the engine serves others): the columns that carry it move together, to `low`, `high`
    and a secret size between them (autokernel/target/contract.py)."""
    of: tuple[tuple[str, int | None], ...]  # (parameter, dimension) of a tensor, or (parameter, None) of an int
    low: int
    high: int
    also: tuple[int, ...] = ()  # exact sizes checked besides (odd widths a kernel's tiling must handle)


@dataclass
class Op:
    name: str
    file: str  # relative to the checkout
    launchers: list[str]
    references: dict[str, str]  # launcher -> "module:function" or TODO, one per launcher
    # launcher -> compared return values (else all), or for one returning no tensor the written arguments compared
    outputs: dict[str, list[int] | list[str]] = field(default_factory=dict)
    tolerance: dict[str, float] | None = None
    protected: bool = False
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # parameter -> {repeat | low | high | common}
    work: dict[str, str] | None = None  # {flops, bytes}: expressions per launcher call (autokernel/target/work.py)
    sizes: dict[str, Size] = field(default_factory=dict)  # sizes besides the token count the gate also moves
    doc: str = ""  # what the op computes, in the declaration's words: the agent's prompt and the verdict show it
    dtypes: list[str] = field(default_factory=list)  # float dtypes production runs besides the workload's

    @property
    def reference(self) -> str:
        """The references as the declaration wrote them, for people: one entry, or `launcher=entry, ...`."""
        if len(self.references) == 1:
            return next(iter(self.references.values()))
        return ", ".join(f"{k}={v}" for k, v in self.references.items())

    @property
    def incomplete(self) -> list[str]:
        """The launchers whose reference is still TODO."""
        return [k for k, v in self.references.items() if v == TODO]


@dataclass
class Declaration:
    path: Path
    build: str | None  # the engine's "module:function"
    ops: dict[str, Op] = field(default_factory=dict)


def module_of(file: str) -> str:
    """The module a checkout file is imported as, from the checkout's root: a/b.py -> a.b, a/__init__.py -> a."""
    parts = list(Path(file).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_file(root: Path, module: str, what: str) -> Path:
    """The file of `module` in the checkout (a.b -> a/b.py or a/b/__init__.py): a regular file inside it, not a
    symlink; else UserError naming `what` (the field) and the module."""
    base = Path(root, *module.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if os.path.lexists(cand):
            return checkout_file(root, cand, what)
    raise UserError(f"{what}: module {module!r} is not a file of the checkout {root} (looked for "
                    f"{base.relative_to(root)}.py and {base.relative_to(root)}/__init__.py) {HELP}")


def checkout_file(root: Path, path: Path, what: str) -> Path:
    """`path` when it is a regular file inside the checkout and not a symlink; else UserError naming `what`."""
    if not Path(os.path.abspath(path)).is_relative_to(Path(root).resolve()):
        raise UserError(f"{what}: {path} is outside the checkout {root}; autokernel reads and rewrites only files "
                        f"inside it {HELP}")
    if Path(path).is_symlink():
        raise UserError(f"{what}: {path} is a symlink; autokernel reads and rewrites only regular files of the "
                        f"checkout (replace the link with the file) {HELP}")
    try:
        return paths.regular_inside(path, root)
    except UserError as e:
        raise UserError(f"{what}: {e}") from None


def checkout_root(repo: Path | None) -> Path:
    """--repo PATH (a directory), else the git work tree of the current directory, else the current directory."""
    if repo is not None:
        if not Path(repo).expanduser().is_dir():
            raise UserError(f"--repo {repo}: no such directory")
        return Path(repo).expanduser().resolve()
    here = Path.cwd().resolve()
    return next((d for d in (here, *here.parents) if (d / ".git").exists()), here)


def load(root: Path) -> Declaration | None:
    """The checkout's declaration, checked field by field; None when there is none."""
    path = root / NAME
    if not os.path.lexists(path):
        return None
    checkout_file(root, path, NAME)
    text = paths.read_text(path, root, limit=1 << 20)
    data = parse_untrusted(path, text, tomllib.loads, "TOML", HELP)
    unknown = sorted(set(data) - {"engine", "ops"})
    if unknown:
        raise UserError(f"{path}: unknown table [{unknown[0]}]; a declaration has [engine] and [ops.<name>] {HELP}")
    engine = _table(data, "engine", path)
    build = engine.get("build")
    if build is not None:
        entry(build, f"{path}: [engine] build", root)
    ops = {name: _op(name, spec, path, root) for name, spec in _table(data, "ops", path).items()}
    return Declaration(path, build, ops)


def _table(data: dict, key: str, path: Path) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise UserError(f"{path}: {key} must be a table ([{key}]) {HELP}")
    return value


def entry(value, what: str, root: Path) -> str:
    if not isinstance(value, str) or not ENTRY.match(value):
        raise UserError(f"{what}: expected \"package.module:function\", got {str(value)[:80]!r} {HELP}")
    module_file(root, value.partition(":")[0], what)
    return value


def _op(name: str, spec, path: Path, root: Path) -> Op:
    where = f"{path}: [ops.{name}]"
    if not OP_NAME.match(name) or not isinstance(spec, dict):
        raise UserError(f"{where}: an op is a table named with letters, digits, _ or - {HELP}")
    unknown = sorted(set(spec) - OP_FIELDS)
    if unknown:
        raise UserError(f"{where}: unknown field {unknown[0]!r}; fields: {', '.join(sorted(OP_FIELDS))} {HELP}")
    file = spec.get("file")
    if not isinstance(file, str) or not file.endswith(".py"):
        raise UserError(f"{where} file: a .py path relative to the checkout is required {HELP}")
    checkout_file(root, root / file, f"{where} file")
    if not FILE.match(file):
        raise UserError(f"{where} file: name the file with letters, digits, _ . - and / only (it goes into commit "
                        f"messages, pull requests and shell lines): rename it {HELP}")
    from autokernel.target.launches import installed
    if installed(file):
        raise UserError(f"{where} file: {file} is an installed package's file (a virtual environment inside the "
                        f"checkout), not the checkout's own code: vendor the kernel into the checkout {HELP}")
    launchers = spec.get("launchers")
    if not (isinstance(launchers, list) and launchers and all(isinstance(x, str) and QUALNAME.match(x)
                                                               for x in launchers)):
        raise UserError(f"{where} launchers: a list of the file's function names is required {HELP}")
    references = _per_launcher(spec.get("reference", TODO), launchers, f"{where} reference", _reference(root))
    outputs = _per_launcher(spec.get("outputs", {}), launchers, f"{where} outputs", _outputs, partial=True)
    tol = spec.get("tolerance")
    if tol is not None and not (isinstance(tol, dict) and set(tol) <= {"atol", "rtol"} and tol and all(
            type(v) in (int, float) and 0 <= v < 1 for v in tol.values())):
        raise UserError(f"{where} tolerance: {{ atol = ..., rtol = ... }}, each in [0, 1) {HELP}")
    protected = spec.get("protected", False)
    if type(protected) is not bool:
        raise UserError(f"{where} protected: true or false {HELP}")
    from autokernel.target import work
    counts = work.table(spec["work"], f"{where} work") if "work" in spec else None
    return Op(name, file, list(launchers), references, outputs, tol and {k: float(v) for k, v in tol.items()},
              protected, _inputs(spec.get("inputs", {}), where), counts, _sizes(spec.get("sizes", {}), where),
              _doc(spec.get("doc", ""), where), _dtypes(spec.get("dtypes", []), where))


def _dtypes(value, where: str) -> list[str]:
    """`dtypes = ["float32", "bfloat16"]`: the float dtypes production runs the op in (a CPU workload records
    float32; a GPU serves bf16): the gate makes cases in each, besides the recorded ones."""
    if not (isinstance(value, list) and all(isinstance(d, str) and d in DTYPES for d in value)):
        raise UserError(f"{where} dtypes: a list of {', '.join(DTYPES)} {HELP}")
    return list(dict.fromkeys(value))


def _doc(value, where: str) -> str:
    """`doc = "..."`: one paragraph of printable text (no control characters), at most MAX_DOC characters."""
    if not (isinstance(value, str) and len(value) <= MAX_DOC and value.isprintable()):
        raise UserError(f"{where} doc: one line of printable text, at most {MAX_DOC} characters {HELP}")
    return value.strip()


def _per_launcher(value, launchers: list[str], where: str, check, partial: bool = False) -> dict:
    """`reference` / `outputs` for each launcher: one value when the op has one launcher, else a table keyed by
    launcher (every launcher for a reference; those with a choice for outputs). A single value for several launchers
    is refused, "TODO" aside (what `init` writes): each launcher has its own signature and returns."""
    if value == TODO:
        return {k: TODO for k in launchers}
    if not isinstance(value, dict):
        if len(launchers) > 1:
            raise UserError(f"{where}: the op has {len(launchers)} launchers ({', '.join(launchers)}); give one per "
                            f"launcher as a table: {{ {launchers[0]} = ..., {launchers[1]} = ... }} {HELP}")
        return {launchers[0]: check(value, where)}
    unknown = [k for k in value if k not in launchers]
    if unknown:
        raise UserError(f"{where}: {unknown[0]!r} is not one of the op's launchers ({', '.join(launchers)}) {HELP}")
    missing = [k for k in launchers if k not in value]
    if missing and not partial:
        raise UserError(f"{where}: no entry for the launcher {missing[0]} (every launcher needs one; \"TODO\" "
                        f"while you write it) {HELP}")
    return {k: check(value[k], f"{where} {k}") for k in launchers if k in value}


def _reference(root: Path):
    def check(value, where: str) -> str:
        return value if value == TODO else entry(value, where, root)
    return check


def _outputs(value, where: str) -> list[int] | list[str]:
    """Indices into the launcher's return values, or for a launcher returning no tensor the names of the arguments it
    writes that are its result (the others it writes are scratch: autokernel/target/contract.py `inplace`)."""
    if isinstance(value, list) and value and len(value) <= 64 and all(
            isinstance(i, str) and QUALNAME.match(i) and "." not in i for i in value):
        return list(dict.fromkeys(value))
    if not (isinstance(value, list) and value and all(type(i) is int and 0 <= i < 64 for i in value)):
        raise UserError(f"{where}: a list of indices into the launcher's return values, or of the names of the "
                        f"arguments it writes for a launcher that returns none {HELP}")
    return list(value)


def indices(outputs: list[int] | list[str] | None) -> list[int] | None:
    """Declared `outputs` as indices into the return values; None where every returned tensor is compared or the
    outputs are written arguments (`named`)."""
    return None if outputs is None or named(outputs) else [int(i) for i in outputs]


def named(outputs: list[int] | list[str] | None) -> list[str] | None:
    """Declared `outputs` as the written arguments compared (a launcher that returns no tensor); else None."""
    return [str(i) for i in outputs] if outputs and isinstance(outputs[0], str) else None


def _inputs(value, where: str) -> dict[str, dict]:
    """`inputs = { cos = { repeat = 2 }, position_ids = { low = 0, high = 256 }, eps = { low = 1e-6, high = 1e-5,
    common = [1e-5, 1e-6] } }`: the last dimension is its first 1/repeat repeated (rope's duplicated cos/sin halves);
    an integer tensor's values in [low, high); a float argument's range and the values production commonly sends
    (checked against the launcher's calls: autokernel/target/contract.py)."""
    def number(k, x) -> bool:
        if k == "common":
            return isinstance(x, list) and 0 < len(x) <= MAX_COMMON and all(
                number("", c) or type(c) is bool for c in x)
        return (type(x) is int and 0 <= x < 1 << 31) or (k != "repeat" and type(x) is float and math.isfinite(x))
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and QUALNAME.match(k) and isinstance(v, dict) and v and set(v) <= INPUT_FIELDS
            and all(number(f, x) for f, x in v.items()) and v.get("low", 0) < v.get("high", math.inf)
            for k, v in value.items()):
        raise UserError(f"{where} inputs: {{ <parameter> = {{ repeat = N }} | {{ low = A, high = B, common = [C, "
                        f"...] }} }}, A < B (integers for an integer tensor, numbers for a float argument; common: "
                        f"1 to {MAX_COMMON} numbers) {HELP}")
    return {k: {f: list(x) if isinstance(x, list) else x for f, x in v.items()} for k, v in value.items()}


def _sizes(value, where: str) -> dict[str, Size]:
    """`sizes = { hidden = { of = ["X.shape[-1]", "W.shape[0]"], low = 16, high = 8192 } }`: every column listed
    carries the size (a tensor's dimension, or an int parameter), low <= high."""
    usage = (f"{where} sizes: {{ <name> = {{ of = [\"X.shape[-1]\", \"W.shape[0]\", \"n_cols\"], low = 1, "
             f"high = 8192, also = [431] }} }}: the columns that carry one size, its range, and (optional) up to "
             f"{MAX_COMMON} exact sizes besides {HELP}")
    if not isinstance(value, dict):
        raise UserError(usage)
    out = {}
    for name, v in value.items():
        ok = isinstance(name, str) and QUALNAME.match(name) and "." not in name and name not in ("M", "layout") \
            and isinstance(v, dict) and {"of", "low", "high"} <= set(v) <= {"of", "low", "high", "also"} \
            and isinstance(v["of"], list) and isinstance(v.get("also", []), list) \
            and len(v.get("also", [])) <= MAX_COMMON and all(type(a) is int and 1 <= a <= MAX_SIZE
                                                             for a in v.get("also", [])) \
            and 0 < len(v["of"]) <= 16 and all(isinstance(c, str) and SIZE_COLUMN.match(c) for c in v["of"]) \
            and all(type(v[k]) is int and 1 <= v[k] <= MAX_SIZE for k in ("low", "high")) and v["low"] <= v["high"]
        if not ok:
            raise UserError(usage)
        cols = []
        for c in v["of"]:
            m = SIZE_COLUMN.match(c)
            cols.append((m.group(1), int(m.group(2)) if m.group(2) is not None else None))  # type: ignore[union-attr]
        out[name] = Size(tuple(cols), v["low"], v["high"], tuple(sorted(set(v.get("also", [])))))
    return out


def quote(s: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's, \\uXXXX included)."""
    import json
    return json.dumps(s, ensure_ascii=True)
