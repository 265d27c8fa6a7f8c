"""Discovery: run a checkout's engine workload once in the sandbox, and turn the Triton launches it recorded
(autokernel/target/launches.py) into ops: one per kernel file of the checkout, with the functions that launched its
kernels, their call counts, launch time and argument layouts.

What comes back was produced next to the checkout's code, so it is untrusted data (trust rule 6): every field is
type-checked, names must be identifiers, files must be regular files inside the checkout, and sizes are capped
before anything is shown or written.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from autokernel.errors import UserError
from autokernel.target import declaration as decl

PROBE_IDS = [[1, 2, 3]]  # the logits() check: one short row of token ids any vocabulary has
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_<>][A-Za-z0-9_<>]*)*\Z")
DTYPE = re.compile(r"^[a-z0-9_]{1,24}\Z")
# A recorded tensor's sizes, strides and element count: past what any machine holds, a record is forged (trust rule 7:
# the parent's work on the records, e.g. the sweep's sizes, stays bounded).
MAX_DIM = 1 << 40
MAX_LAUNCHES = 512
VIA = re.compile(r"^[^:\x00-\x1f]+:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")  # "file:launcher"


@dataclass
class Site:
    file: str  # relative to the checkout
    function: str
    def_line: int
    lines: list[int]
    params: list[str]
    plain: bool = True  # a module-level function of its file, undecorated: declarable (launches.NOT_PLAIN)


@dataclass
class Launch:
    """One (kernel, launch site) pair of the workload."""
    kernel: str
    kernel_file: str  # relative to the checkout when in_checkout, else as recorded (shown only)
    in_checkout: bool
    kernel_line: int
    site: Site | None
    calls: int
    seconds: float
    grids: list[tuple[int, ...]]
    signatures: list[list[tuple]]  # per distinct signature: (name, description) pairs
    signature_calls: list[int]
    via: str | None = None  # "file:launcher": the declared launcher the launches ran inside (innermost), if any


@dataclass
class FoundOp:
    name: str
    file: str
    launches: list[Launch] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return sum(x.calls for x in self.launches)

    @property
    def seconds(self) -> float:
        return sum(x.seconds for x in self.launches)

    def launchers(self) -> list[Site]:
        """The launch sites in the op's own file, each function once: what a candidate for this file replaces."""
        seen: dict[str, Site] = {}
        for x in self.launches:
            if x.site is not None and x.site.file == self.file:
                seen.setdefault(x.site.function, x.site)
        return list(seen.values())


@dataclass
class LauncherCalls:
    """A declared launcher's calls in the workload (autokernel/target/launches.py, LauncherRecorder): the layouts
    the gate's cases are made in."""
    file: str
    launcher: str
    calls: int
    signatures: list[list[tuple]]  # per distinct layout: (parameter, description) pairs, in signature order
    signature_calls: list[int]
    written: list[str]  # tensor parameters some call wrote in place
    returns: list[tuple]  # what the first call returned, described


@dataclass
class Discovery:
    build: str
    launches: list[Launch]
    ops: list[FoundOp]
    timings: dict[str, float]
    interpreted: bool
    pinned: dict[str, int]
    isolation: str
    job_dir: Path
    launcher_calls: list[LauncherCalls] = field(default_factory=list)


def run(root: Path, build: str, policy, job_dir: Path, launchers: dict | None = None) -> Discovery:
    """Run the engine's workload in the sandbox (pythonpath: the checkout, bound read-only) and collect its launches.
    launchers: {module: ([names], file)} of declared ops, whose calls are recorded at the launcher (LauncherCalls).
    UserError (exit 2, one line) when the job fails, the engine breaks the contract, or nothing was launched."""
    from autokernel import device, sandbox
    from autokernel.target import launches
    env = {} if device.is_cuda() else {"TRITON_INTERPRET": "1"}
    t0 = time.perf_counter()
    payload = {"root": str(root), "build": build, "probe_ids": PROBE_IDS,
               "launchers": {m: [list(names), rel] for m, (names, rel) in (launchers or {}).items()}}
    res = sandbox.run(launches.discover, payload, job_dir, policy.sandbox, pythonpath=[root], env=env)
    wall_s = time.perf_counter() - t0
    log = job_dir / sandbox.LOG_NAME
    if not res.ok:
        raise UserError(f"{build}: the engine's job failed in the sandbox ({res.reason}: {res.detail}); its log: {log}")
    data = _dict(res.data)
    if "failed" in data:
        stage, where = str(data.get("failed")), str(data.get("where") or "")
        if stage == "launchers":  # the declaration names something the recorder cannot wrap (launches.NOT_PLAIN)
            raise UserError(f"{decl.NAME} launchers: {str(data.get('detail'))[:1500]}; fix the declaration or the "
                            f"engine and rerun (log: {log})")
        what = {"build": f"{build}() raised", "workload": f"{build}(): its workload() raised",
                "logits": f"{build}(): its logits(ids) raised"}.get(stage, f"{build}()")
        raise UserError(f"engine {what}: {data.get('detail')}" + (f" (at {where})" if where else "")
                        + f"; fix the engine and rerun (log: {log})")
    shape = data.get("logits_shape")
    if not (isinstance(shape, (list, tuple)) and len(shape) == 2 and shape[0] == len(PROBE_IDS)):
        raise UserError(f"[engine] build = {build}: logits({PROBE_IDS}) returned shape {shape}, not (1, vocab): it "
                        "must return next-token logits, one row per list of token ids (docs/targets.md)")
    found = [x for x in (_launch(g, root) for g in _list(data.get("launches"))[:MAX_LAUNCHES]) if x is not None]
    if not found:
        raise UserError(f"[engine] build = {build}: its workload() launched no Triton kernel; autokernel tunes Triton "
                        "kernels the workload runs (is the Triton path switched on in the engine?)")
    timings = {k: float(data[k]) for k in ("build_s", "workload_s", "hook_s", "logits_s")
               if type(data.get(k)) in (int, float)}
    timings["job_s"] = wall_s
    pinned = {k: v for k, v in _dict(data.get("pinned")).items() if IDENT.match(str(k)) and type(v) is int}
    calls = [c for c in (_launcher_calls(g, root) for g in _list(data.get("launcher_calls"))[:MAX_LAUNCHES])
             if c is not None]
    # how the kernels ran is the parent's own knowledge (the job's environment above), never the job's claim: the
    # checkout's code can rewrite any object of the job (a forged False labelled CPU interpreter times as CUDA's)
    return Discovery(build, found, group(found), timings, "TRITON_INTERPRET" in env, pinned, res.isolation,
                     job_dir, calls)


def _list(v) -> list:
    """A list (or tuple) the job returned, else []: the checkout's code can rewrite any object of the job, so a
    field is data of any type (a `pinned` list made discovery fail on `.items()`, a traceback)."""
    return list(v) if isinstance(v, (list, tuple)) else []


def _dict(v) -> dict:
    return v if isinstance(v, dict) else {}


def _launcher_calls(g, root: Path) -> LauncherCalls | None:
    """One declared launcher's record, checked like a launch group; None when it does not hold up."""
    if not isinstance(g, dict):
        return None
    file, name, calls = g.get("file"), g.get("launcher"), _int(g.get("calls"), 1)
    if not (isinstance(file, str) and _inside(root, file) and isinstance(name, str) and IDENT.match(name) and calls):
        return None
    sigs, counts = [], []
    for sig, n in zip(_list(g.get("signatures"))[:32], _list(g.get("signature_calls"))[:32]):
        s = _signature(sig)
        if s is not None and _int(n, 1):
            sigs.append(s)
            counts.append(n)
    params = {p for s in sigs for p, _ in s}
    written = [w for w in _list(g.get("written"))[:32] if isinstance(w, str) and w in params]
    returns = _signature([[f"r{i}", d] for i, d in enumerate(_list(g.get("returns"))[:16])]) or []
    return LauncherCalls(file, name, calls, sigs, counts, written, [d for _, d in returns])


def group(found: list[Launch]) -> list[FoundOp]:
    """One op per kernel file of the checkout, named by the file's stem (its folder's name too when two files share
    a stem), most launch time first."""
    by_file: dict[str, FoundOp] = {}
    for x in found:
        if x.in_checkout:
            by_file.setdefault(x.kernel_file, FoundOp("", x.kernel_file)).launches.append(x)
    stems: dict[str, int] = {}
    for f in by_file:
        stems[Path(f).stem] = stems.get(Path(f).stem, 0) + 1
    for f, op in by_file.items():
        p = Path(f)
        name = p.stem if stems[p.stem] == 1 else f"{p.parent.name}_{p.stem}"
        op.name = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "op"
    return sorted(by_file.values(), key=lambda op: -op.seconds)


def _int(v, lo: int = 0, hi: int = 1 << 62) -> int | None:
    return v if type(v) is int and lo <= v <= hi else None


def _launch(g, root: Path) -> Launch | None:
    """One recorded group, checked; None when it does not hold up (a forged or malformed record is dropped)."""
    if not isinstance(g, dict):
        return None
    kernel, kfile, calls = g.get("kernel"), g.get("kernel_file"), _int(g.get("calls"), 1)
    if not (isinstance(kernel, str) and IDENT.match(kernel) and isinstance(kfile, str) and calls):
        return None
    in_checkout = g.get("kernel_in_checkout") is True and _inside(root, kfile)
    seconds = g.get("seconds")
    seconds = float(seconds) if (type(seconds) is int or type(seconds) is float) and 0 <= seconds < 1e7 else 0.0
    site = _site(g.get("site"), g.get("lines"), root)
    grids = [tuple(x) for x in _list(g.get("grids"))[:16]
             if isinstance(x, (list, tuple)) and 0 < len(x) <= 3 and all(_int(v) is not None for v in x)]
    sigs, counts = [], []
    for sig, n in zip(_list(g.get("signatures"))[:32], _list(g.get("signature_calls"))[:32]):
        s = _signature(sig)
        if s is not None and _int(n, 1):
            sigs.append(s)
            counts.append(n)
    via = g.get("via")
    via = via if isinstance(via, str) and len(via) <= 400 and VIA.match(via) else None
    return Launch(kernel, kfile[:300], in_checkout, _int(g.get("kernel_line")) or 0, site, calls, seconds, grids,
                  sigs, counts, via)


def _inside(root: Path, rel: str) -> bool:
    from autokernel.target.launches import installed
    if not rel.endswith(".py") or rel.startswith("/") or ".." in Path(rel).parts or installed(rel):
        return False
    try:
        decl.checkout_file(root, root / rel, rel)
        return True
    except UserError:
        return False


def _site(s, lines, root: Path) -> Site | None:
    if not isinstance(s, dict):
        return None
    file, fn, params = s.get("file"), s.get("function"), s.get("params") or []
    if not (isinstance(file, str) and _inside(root, file) and isinstance(fn, str) and IDENT.match(fn)):
        return None
    params = [p for p in params if isinstance(p, str) and IDENT.match(p)][:32] if isinstance(params, list) else []
    lines = [v for v in (lines if isinstance(lines, list) else [])[:8] if _int(v, 1)]
    return Site(file, fn, _int(s.get("def_line"), 1) or 0, lines, params, s.get("plain") is not False)


def _signature(sig) -> list[tuple] | None:
    """[(name, ("tensor", dtype, shape, strides) | (type, value))] with names, dtypes and values checked."""
    if not isinstance(sig, (list, tuple)):
        return None
    out: list[tuple] = []
    for item in sig[:64]:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
                and IDENT.match(item[0]) and isinstance(item[1], (list, tuple)) and item[1]):
            return None
        name, d = item
        if d[0] == "tensor" and len(d) == 4 and isinstance(d[1], str) and DTYPE.match(d[1]) and all(
                isinstance(t, (list, tuple)) and len(t) <= 8 and all(_int(v, 0, MAX_DIM) is not None for v in t)
                for t in d[2:]) and len(d[2]) == len(d[3]) and math.prod(d[2]) <= MAX_DIM:
            out.append((name, ("tensor", d[1], tuple(d[2]), tuple(d[3]))))
        elif d[0] in ("bool", "int", "float", "NoneType") and len(d) == 2 and (
                type(d[1]) in (bool, int, float) or d[1] is None) and type(d[1]).__name__ == d[0] and not (
                type(d[1]) is int and abs(d[1]) > MAX_DIM):
            out.append((name, (d[0], d[1])))
        elif d[0] == "str" and len(d) == 2 and isinstance(d[1], str) and len(d[1]) <= 64:
            out.append((name, ("str", d[1])))
        elif d[0] == "dtype" and len(d) == 2 and isinstance(d[1], str) and DTYPE.match(d[1]):
            out.append((name, ("dtype", d[1])))
        elif d[0] == "other":  # what the gate cannot rebuild: its type, named where it is refused (contract.spec)
            kind = d[1] if len(d) == 2 and isinstance(d[1], str) and IDENT.match(d[1]) and len(d[1]) <= 64 else "?"
            out.append((name, ("other", kind)))
        else:  # a known kind out of bounds (a forged size, strides of another rank), or an unknown one
            return None
    return out


def describe(sig: list[tuple], limit: int = 6) -> str:
    """'X float32 (14, 64) · n_cols=64 · eps=1e-05' for the first tensors and scalars of a signature."""
    parts = []
    for name, d in sig:
        if d[0] == "tensor":
            parts.append(f"{name} {d[1]} {tuple(d[2])}")
        elif d[0] in ("int", "float", "bool"):
            parts.append(f"{name}={d[1]!r}")
    return " · ".join(parts[:limit]) + (" · …" if len(parts) > limit else "")
