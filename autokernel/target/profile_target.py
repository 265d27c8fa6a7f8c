"""`autokernel profile --repo CHECKOUT` for a target (a checkout with autokernel.toml, docs/targets.md): run the
engine's workload once in the sandbox through the same hook `autokernel init` uses (autokernel/target/discover.py:
every Triton launch, and every call of each declared launcher), map the launches to the declared ops by kernel file,
and write traces/<run-id>/summary.json in the checkout, schema 1 as the embedded profile writes it
(autokernel/profile/trace.py), with a `target` section and, per op:

    ops {op: {file, launchers, protected, status, calls (kernel launches), total_ms, mean_ms, share (of all launch
              time), e2e_share (of the workload's wall time), kernels [{kernel, line, calls, total_ms, share}],
              sites {file:function: {calls, total_ms, mean_ms, share, lines, via [declared launcher | null]}},
              shapes [{launcher, calls, args, dtypes {p: dtype}, sizes {p: [..]}, strides {p: [..]}, scalars {p: v},
                       flops, bytes, dtype (one call's, where the op declares `work`)}],
              launcher_calls [{file, launcher, calls, signatures [[[param, description]]], signature_calls,
                               written, returns}]}}
    not_declared [{kernel, kernel_file, in_checkout, site, calls, total_ms, share}]

`launcher_calls` are discover.LauncherCalls as plain JSON: the layouts the gate builds its cases from. Times are each
launch's wall time: under the CPU interpreter the kernel itself (interpreter time, never a GPU figure); where kernels
compile, between device synchronisations (device time plus launch overhead, labelled so). An op that declares
`work` (autokernel/target/work.py) has each layout's FLOPs and bytes, and the trace the device's peaks (`roofline`),
so rank orders it by roofline headroom; the others rank by time share.

Bad input is one line and exit 2 with nothing written into the checkout: a declaration without [engine] build or
without ops, a missing or outside op file (declaration.load), an engine that raises (discover.run), a declared
launcher the workload never calls (the gate would have no case for it; a protected op's is only reported).
"""
from __future__ import annotations

import datetime
import hashlib
from pathlib import Path

from autokernel.errors import UserError
from autokernel.target import declaration as decl
from autokernel.target import discover

TIMING = {
    True: ("CPU / Triton interpreter",
           "wall time of each Triton launch through the interpreter, at the launch hook: correctness-only timings, "
           "never a GPU speed claim"),
    False: ("CUDA: synchronized launch time",
            "wall time of each Triton launch between device synchronisations before and after it: the kernel's "
            "device time plus its launch overhead (which dominates microsecond kernels); `autokernel bench` measures "
            "device time"),
}


RANKING = {False: "time share alone",  # no op declares `work` (FLOP/byte counts): no roofline headroom
           True: "expected end-to-end gain (share x roofline headroom) for the ops that declare `work`, time share for "
                 "the others"}


def declared(root: Path) -> decl.Declaration:
    """The checkout's declaration with an engine and at least one op; UserError naming what to write otherwise."""
    d = decl.load(root)
    path = root / decl.NAME
    if d is None:
        raise UserError(f"{path}: no declaration: run `autokernel init --repo {root}` first (docs/targets.md)")
    if d.build is None:
        raise UserError(f"{path}: no engine entry: write [engine] build = \"package.module:function\" there "
                        "(docs/targets.md)")
    if not d.ops:
        raise UserError(f"{path}: declares no ops: run `autokernel init --repo {root}` to add them (docs/targets.md)")
    seen: dict[str, str] = {}
    for op in d.ops.values():
        other = seen.setdefault(op.file, op.name)
        if other != op.name:  # launches map to ops by the file that defines the kernel: one op per file
            raise UserError(f"{path}: [ops.{other}] and [ops.{op.name}] both declare file = {op.file!r}; one op per "
                            "kernel file: list both launchers in one op (docs/targets.md)")
    return d


def launcher_map(d: decl.Declaration) -> dict[str, tuple[list[str], str]]:
    """{module: ([launcher names], file)} for discover.run (one op per file: `declared`)."""
    return {decl.module_of(op.file): (list(op.launchers), op.file) for op in d.ops.values()}


def never_called(d: decl.Declaration, found: discover.Discovery) -> list[tuple[decl.Op, str]]:
    """The declared (op, launcher) pairs the workload did not call once."""
    called = {(c.file, c.launcher) for c in found.launcher_calls}
    return [(op, name) for op in d.ops.values() for name in op.launchers if (op.file, name) not in called]


def check_called(d: decl.Declaration, found: discover.Discovery) -> list[str]:
    """UserError for a rewritable op's launcher the workload never called: the gate builds its cases from those
    calls, so a candidate's version of it would go unchecked. A protected op is never rewritten: its uncalled
    launchers come back as warnings."""
    missing = never_called(d, found)
    errors = [(op, n) for op, n in missing if not op.protected]
    if errors:
        op, name = errors[0]
        more = f" (and {len(errors) - 1} more: {', '.join(n for _, n in errors[1:4])})" if len(errors) > 1 else ""
        raise UserError(f"{d.path}: [ops.{op.name}] launchers: {name} ({op.file}) was never called by the workload "
                        f"of {d.build}{more}; the gate builds its cases from those calls: make workload() call it, or "
                        "drop it from launchers (docs/targets.md)")
    return [f"[ops.{op.name}] (protected) launcher {name} was never called by the workload" for op, name in missing]


def profile(root: Path, pol, out: Path | None = None) -> tuple[Path, list[str]]:
    """Profile the target checkout `root` under `pol` (the command's: policy.for_checkout with uses sandbox and
    ops); returns (the run directory, warnings). Nothing is written into the checkout unless the run succeeded (the
    sandbox job's log goes to the user's cache)."""
    from autokernel import paths, sandbox
    from autokernel.profile import trace
    from autokernel.profile.profiler import run_id
    d = declared(root)
    assert d.build is not None  # declared() refused a declaration without [engine] build
    traces = Path(out) if out is not None else paths.Layout(root).traces  # refuses a symlinked traces/ before the run
    sandbox.preflight(pol.sandbox, untrusted_author=True)  # the checkout's engine: trust rule 6
    rid = run_id(f"{root}|{d.build}")
    job_dir = paths.user_cache() / "profile" / rid
    found = discover.run(root, d.build, pol, job_dir, launcher_map(d))
    warnings = check_called(d, found)
    summary = summarize(found, d, pol, root, rid)
    summary["files"]["sandbox_log"] = str(job_dir / sandbox.LOG_NAME)
    run_dir = traces / rid
    run_dir.mkdir(parents=True, exist_ok=False)
    trace.write(summary, run_dir)
    return run_dir, warnings


def status_of(op: decl.Op, policy) -> str:
    """The declaration's `protected`, then the policy's ops section (protected, deny, allow) as for the embedded
    engine's ops (autokernel/profile/rank.py)."""
    from autokernel.profile.rank import status_of as policy_status
    return "protected" if op.protected else policy_status(op.name, policy)


def summarize(found: discover.Discovery, d: decl.Declaration, policy, root: Path, rid: str) -> dict:
    """The summary.json of a target's run (the module docstring), from the checked discovery."""
    from autokernel import device, paths
    from autokernel.bench import roofline
    from autokernel.profile.trace import SCHEMA
    total_ms = 1e3 * sum(x.seconds for x in found.launches)
    workload_ms = 1e3 * found.timings.get("workload_s", 0.0)
    by_file = {op.file: op for op in d.ops.values()}
    ops = {op.name: _op_entry(op, status_of(op, policy), [x for x in found.launches if x.kernel_file == op.file
                                                          and x.in_checkout], found, total_ms, workload_ms)
           for op in d.ops.values()}
    ops = dict(sorted(ops.items(), key=lambda kv: -kv[1]["total_ms"]))
    rest = [x for x in found.launches if not (x.in_checkout and x.kernel_file in by_file)]
    label, note = TIMING[found.interpreted]
    declared_ms = sum(e["total_ms"] for e in ops.values())
    worked = any("flops" in s for e in ops.values() for s in e["shapes"])
    fp = device.fingerprint()
    return {
        "schema": SCHEMA,
        "run_id": rid,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": fp,
        "kernels": "checkout",
        "weights": None,
        "target": {"root": str(root), "build": d.build, "declaration": str(d.path),
                   "declaration_sha256": hashlib.sha256(paths.read_bytes(d.path, root)).hexdigest(),
                   "isolation": found.isolation, "interpreted": found.interpreted,
                   "pinned_autotune": found.pinned, "timings_s": found.timings},
        "workload": {"name": f"{d.build}().workload()", "path": None, "sha256": None},
        "timing": {"source": "launch hook", "label": label, "note": note, "ranking": RANKING[worked]},
        "totals": {"total_op_ms": declared_ms, "launch_ms": total_ms, "workload_ms": workload_ms,
                   "non_launch_ms": max(0.0, workload_ms - total_ms), "e2e_ms": workload_ms,
                   "hook_ms": 1e3 * found.timings.get("hook_s", 0.0),
                   "calls": sum(x.calls for x in found.launches),
                   "not_declared_ms": total_ms - declared_ms},
        "total_op_ms": declared_ms,
        "roofline": roofline.describe(fp) if worked else None,  # the benchmark's peaks, as the embedded trace's
        "files": {"chrome_trace": None},
        "ops": ops,
        "not_declared": _not_declared(rest, total_ms),
    }


def _op_entry(op: decl.Op, status: str, launches: list[discover.Launch], found: discover.Discovery,
              total_ms: float, workload_ms: float) -> dict:
    ms = 1e3 * sum(x.seconds for x in launches)
    calls = sum(x.calls for x in launches)
    sites: dict[str, dict] = {}
    for x in launches:
        key = f"{x.site.file}:{x.site.function}" if x.site is not None else "(no function of the checkout)"
        s = sites.setdefault(key, {"calls": 0, "total_ms": 0.0, "lines": [], "via": []})
        if x.via not in s["via"]:  # the declared launchers these launches ran inside (None: outside any)
            s["via"].append(x.via)
        s["calls"] += x.calls
        s["total_ms"] += 1e3 * x.seconds
        s["lines"] += [n for n in (x.site.lines if x.site else []) if n not in s["lines"]]
    for s in sites.values():
        s["mean_ms"] = s["total_ms"] / s["calls"]
        s["share"] = s["total_ms"] / total_ms if total_ms else 0.0
    records = [c for c in found.launcher_calls if c.file == op.file and c.launcher in op.launchers]
    return {
        "file": op.file, "launchers": op.launchers, "protected": op.protected, "status": status,
        "calls": calls, "total_ms": ms, "mean_ms": ms / calls if calls else 0.0,
        "share": ms / total_ms if total_ms else 0.0, "e2e_share": ms / workload_ms if workload_ms else 0.0,
        "kernels": [{"kernel": x.kernel, "line": x.kernel_line, "calls": x.calls, "total_ms": 1e3 * x.seconds,
                     "share": 1e3 * x.seconds / total_ms if total_ms else 0.0} for x in launches],
        "sites": sites,
        "shapes": [_shape(c.launcher, sig, n, op.work) for c in records
                   for sig, n in zip(c.signatures, c.signature_calls)],
        "launcher_calls": [launcher_calls_json(c) for c in records],
    }


def _shape(launcher: str, sig: list[tuple], calls: int, work: dict[str, str] | None = None) -> dict:
    """One layout a launcher was called with: its tensors (dtype, sizes, strides) and its scalars; with the op's
    declared `work`, the FLOPs and bytes of one such call and the dtype they run in (the first float tensor's)."""
    from autokernel.target import work as work_mod
    tensors = [(p, d) for p, d in sig if d[0] == "tensor"]
    out = {"launcher": launcher, "calls": calls, "args": discover.describe(sig, 16),
           "dtypes": {p: d[1] for p, d in tensors}, "sizes": {p: list(d[2]) for p, d in tensors},
           "strides": {p: list(d[3]) for p, d in tensors},
           "scalars": {p: d[1] for p, d in sig if d[0] in ("bool", "int", "float", "str", "NoneType")}}
    counts = work_mod.counts(work, sig) if work else None
    if counts is not None:
        out.update(counts, dtype=next((d[1] for _, d in tensors if str(d[1]).startswith(("float", "bfloat"))),
                                      "float32"))
    return out


def launcher_calls_json(c: discover.LauncherCalls) -> dict:
    """discover.LauncherCalls as plain JSON (tuples as lists): what `autokernel verify --trace` reads back."""
    return {"file": c.file, "launcher": c.launcher, "calls": c.calls,
            "signatures": [[[p, list(_plain(d))] for p, d in sig] for sig in c.signatures],
            "signature_calls": list(c.signature_calls), "written": list(c.written),
            "returns": [list(_plain(d)) for d in c.returns]}


def _plain(d: tuple) -> list:
    return [list(v) if isinstance(v, tuple) else v for v in d]


def _not_declared(launches: list[discover.Launch], total_ms: float) -> list[dict]:
    out = [{"kernel": x.kernel, "kernel_file": x.kernel_file, "in_checkout": x.in_checkout,
            "site": f"{x.site.file}:{x.site.function}" if x.site is not None else None, "via": [x.via],
            "calls": x.calls,
            "total_ms": 1e3 * x.seconds, "share": 1e3 * x.seconds / total_ms if total_ms else 0.0}
           for x in launches]
    return sorted(out, key=lambda e: -e["total_ms"])
