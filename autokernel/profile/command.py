"""`autokernel profile` and `autokernel rank`: parse, dispatch, print. The work lives in profiler.py and rank.py."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from autokernel.errors import UserError
from autokernel.profile.profiler import CPU_TIMED_PER_SHAPE
from autokernel.profile.show import console as _console
from autokernel.profile.show import pct as _pct


def _policy(path: Optional[Path]):
    """--policy FILE, else the checkout's policies.yaml under trust rule 6 (policy.for_checkout): its target.model
    and target.workload must be files inside it."""
    from autokernel import paths, policy
    return policy.for_checkout(paths.target().root, path, uses=("target", "ops"))  # no agent, no sandbox here


def profile_cmd(
    workload: Optional[Path] = typer.Option(None, help="Workload YAML/JSON (prompts, chat, batch, decode_steps); "
                                                       "default: policies.yaml target.workload, else the packaged "
                                                       "autokernel/workloads/default.yaml."),
    kernels: str = typer.Option("triton", help="Op implementations: reference (torch) or triton."),
    weights: Optional[str] = typer.Option(None, help="quant: keep Q4_1/Q8_0 blocks; dequant: expand at load "
                                                     "(default: policies.yaml target.weights)."),
    model: Optional[Path] = typer.Option(None, help="A llama-architecture GGUF; default: policies.yaml target.model, "
                                                    "else the embedded SmolLM2-135M."),
    out: Optional[Path] = typer.Option(None, help="Where the run directory <run-id>/ is written (default: traces/; "
                                                  "for a target, the checkout's traces/)."),
    py_spy: bool = typer.Option(False, "--py-spy", help="Also sample the engine's Python with py-spy."),
    timed_calls: Optional[int] = typer.Option(None, min=0, help="Timed calls per (op, shape); later ones run the "
                                                                "reference and are charged the mean. 0: time every "
                                                                "call. Default: every call on CUDA, "
                                                                f"{CPU_TIMED_PER_SHAPE} on the CPU interpreter."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="policies.yaml (default: the checkout's"
                                                                      ", under trust rule 6)."),
    repo: Optional[Path] = typer.Option(None, help="A target checkout (autokernel.toml, docs/targets.md): run its "
                                                   "engine's workload in the sandbox; default: the git work tree "
                                                   "here when it has an autokernel.toml."),
):
    """Replay a workload on the live engine under torch.profiler; write traces/<run-id>/ (summary.json, trace.json).
    For a target checkout (--repo): its engine's workload under the launch hook, mapped to the declared ops."""
    from autokernel.profile import profiler, rank, trace
    root = _target_root(repo)
    if root is not None:
        given = [f for f, v in (("--workload", workload), ("--weights", weights), ("--model", model),
                                ("--py-spy", py_spy), ("--timed-calls", timed_calls)) if v]
        if given:
            raise UserError(f"{given[0]} applies to the embedded engine; a target's workload is its engine's "
                            f"workload() ({root / 'autokernel.toml'})")
        return _profile_target(root, out, policy_file)
    pol = _policy(policy_file)
    run_dir = profiler.profile(
        workload_path=workload or pol.target.workload, kernels=kernels, weights=weights or pol.target.weights,
        model_path=model or pol.target.model, out=out or Path("traces"), py_spy=py_spy,
        timed_per_shape=-1 if timed_calls is None else timed_calls)
    t = trace.load_trace(run_dir)
    print_rank(t, rank.rank(t, pol))
    if py_spy:
        print_pyspy(t.get("py_spy") or {}, t.get("timing") or {})
    typer.echo(f"trace: {run_dir}/summary.json · Chrome trace (open in Perfetto): {run_dir}/trace.json")


def rank_cmd(
    trace_path: Optional[Path] = typer.Argument(None, metavar="TRACE",
                                                help="A traces/<run-id>/ directory or its summary.json; default: "
                                                     "the latest under traces/."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for machines instead of a table."),
    plot_file: Optional[Path] = typer.Option(None, "--plot", help="Also draw time-share bars and a roofline chart "
                                                                  "to this PNG."),
    op: Optional[str] = typer.Option(None, help="Show one op's call sites and shape corpus."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="policies.yaml (default: the checkout's"
                                                                      ", under trust rule 6)."),
    repo: Optional[Path] = typer.Option(None, help="A target checkout (autokernel.toml): rank its declared ops "
                                                   "from its latest traces/<run-id>/ (or TRACE); default: the git "
                                                   "work tree here when it has an autokernel.toml."),
):
    """Rank the trace's kernels by expected end-to-end gain (time share x headroom to the roofline); a target's
    declared ops by time share alone."""
    from autokernel import ops as opspecs
    from autokernel.profile import rank, trace
    root = _target_root(repo)
    if root is not None:
        return _rank_target(root, trace_path, as_json, plot_file, op, policy_file)
    t = trace.load_trace(trace_path if trace_path is not None else trace.latest())
    if isinstance(t.get("target"), dict):  # a target's trace passed as TRACE
        return _rank_target(Path(t["target"].get("root", ".")), trace_path, as_json, plot_file, op, policy_file)
    if op is not None and op not in opspecs.OPS:
        raise UserError(f"unknown op {op!r}; known ops: {', '.join(opspecs.OPS)}")
    if op is not None and op not in t["ops"]:
        raise UserError(f"op {op!r} was never called in {t['_path']}; called: {', '.join(t['ops'])}")
    pol = _policy(policy_file)
    ranked = rank.rank(t, pol)
    if plot_file is not None:
        from autokernel.profile.plot import plot
        plot(t, ranked, plot_file)
    if as_json:
        doc = {"trace": t["_path"], "run_id": t.get("run_id"), "device": t.get("device"), "timing": t.get("timing"),
               "roofline": t.get("roofline"), "totals": t.get("totals"),
               "targets": [r.to_json() for r in ranked if r.status == "target"],
               "excluded": [r.to_json() for r in ranked if r.status != "target"]}
        if op is not None:
            doc["op"] = {"name": op, **t["ops"][op]}
        typer.echo(json.dumps(doc, indent=1))
        return
    print_rank(t, ranked)
    if op is not None:
        print_op(t, op)
    if plot_file is not None:
        typer.echo(f"plot: {plot_file}")


def _target_root(repo: Optional[Path]) -> Optional[Path]:
    """The target checkout: --repo PATH, else the git work tree here when it has an autokernel.toml and is not an
    autokernel layout (kernels/<op>.py); None: the embedded engine."""
    from autokernel import paths
    from autokernel.target import declaration as decl
    from autokernel.target.init_command import checkout_root
    root = checkout_root(repo)
    if repo is not None or (os.path.lexists(root / decl.NAME) and not paths.is_layout(root)):
        return root
    return None


def _profile_target(root: Path, out: Optional[Path], policy_file: Optional[Path]) -> None:
    from autokernel.profile import trace
    from autokernel.target import profile_target, rank_target
    run_dir, warnings = profile_target.profile(root, out, policy_file)
    profile_target.echo_warnings(warnings)
    t = trace.load_trace(run_dir)
    rank_target.print_rank(t, rank_target.rank(t))
    typer.echo(f"trace: {run_dir}/summary.json (no Chrome trace: the workload ran in the sandbox; its log: "
               f"{t['files'].get('sandbox_log')})")


def _rank_target(root: Path, trace_path: Optional[Path], as_json: bool, plot_file: Optional[Path],
                 op: Optional[str], policy_file: Optional[Path]) -> None:
    from autokernel import policy
    from autokernel.target import rank_target
    if plot_file is not None:
        raise UserError("--plot draws the roofline of the embedded engine's ops; a target's ops have no FLOP/byte "
                        "counts (drop --plot)")
    t = rank_target.load(root, trace_path)
    pol = policy.for_checkout(root, policy_file, uses=("ops",))
    rank_target.show(t, pol, as_json, op)


def print_rank(t: dict, ranked, top: int | None = None) -> None:
    from rich.table import Table
    console = _console()
    timing, totals, roof = t.get("timing", {}), t.get("totals", {}), t.get("roofline", {})
    wl = t.get("workload", {})
    console.print(f"[bold]{t.get('run_id')}[/] · {t.get('kernels')} kernels, {t.get('weights')} weights · workload "
                  f"{wl.get('name')} ({wl.get('sha256', '')[:12]}) · {totals.get('calls')} op calls")
    console.print(f"timing: [bold yellow]{timing.get('label')}[/] — {timing.get('note')}")
    if timing.get("extrapolated_calls"):
        console.print(f"        {timing['timed_calls']} calls timed, {timing['extrapolated_calls']} charged their "
                      f"shape's mean")
    gf = (roof.get("gflops") or {})
    flops = ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in gf.items() if k in ("float32", "bfloat16")
                      and (k == "float32" or v != gf.get("float32")))
    console.print(f"roofline: {roof.get('gbps') or 0:.0f} GB/s, {flops} — {roof.get('source')}; {roof.get('note')}")
    tps = totals.get("decode_tokens_per_s")
    console.print(f"end to end: {totals.get('e2e_ms', 0):.0f} ms = ops {totals.get('total_op_ms', 0):.0f} ms + "
                  f"outside ops {totals.get('non_op_ms', 0):.0f} ms · {totals.get('prefill_tokens')} prefill + "
                  f"{totals.get('decode_tokens')} decode tokens"
                  + (f", decode {tps:.3g} tok/s ({totals.get('decode_tokens_per_s_basis')})" if tps else "")
                  + f" · this run's wall {totals.get('wall_ms', 0) / 1e3:.1f} s")
    table = Table(show_lines=False)
    for col, just in [("#", "right"), ("op", "left"), ("calls", "right"), ("total ms", "right"),
                      ("share", "right"), ("GB/s", "right"), ("GFLOP/s", "right"), ("% peak", "right"),
                      ("bound", "left"), ("headroom", "right"), ("gain", "right"), ("e2e ×", "right")]:
        table.add_column(col, justify=just)
    shown = ranked if top is None else ranked[:top]
    n = 0
    for r in shown:
        mark = "" if r.status == "target" else f" [dim]({r.status})[/]"
        n += r.status == "target"
        peak = r.pct_peak_gflops if r.bound == "compute" else r.pct_peak_gbps
        table.add_row(str(n) if r.status == "target" else "—", r.op + mark, str(r.calls), f"{r.total_ms:.1f}",
                      _pct(r.share), f"{r.gbps:.3g}", f"{r.gflops:.3g}",
                      "—" if peak is None else f"{peak:.2g}%", r.bound or "—", _pct(r.headroom),
                      _pct(r.gain), "—" if r.e2e_speedup is None else f"{r.e2e_speedup:.2f}",
                      style=None if r.status == "target" else "dim")
    console.print(table)
    if top is not None and len(ranked) > top:
        console.print(f"[dim]… {len(ranked) - top} more: autokernel rank {t['_path']}[/]")
    console.print("[dim]share: of op time · gain: share of end-to-end time a roofline kernel would save · e2e ×: "
                  "Amdahl speedup if the op reached its roofline · protected/denied ops are listed, never targets[/]")


def print_op(t: dict, op: str) -> None:
    from rich.table import Table
    console = _console()
    e = t["ops"][op]
    console.print(f"\n[bold]{op}[/]: {e['calls']} calls, {e['total_ms']:.1f} ms, mean {e['mean_ms']:.3f} ms, "
                  f"p50 {e['p50_ms']:.3f} ms, p95 {e['p95_ms']:.3f} ms")
    shapes = Table(title=f"{op}: shape corpus")
    for col in ("shape", "calls", "timed", "mean ms", "timed min–max ms", "MFLOP", "KB", "dtypes", "sites"):
        shapes.add_column(col)
    for s in e["shapes"]:
        spread = f"{s['min_ms']:.3g}–{s['max_ms']:.3g}" if "min_ms" in s else "—"
        shapes.add_row(", ".join(f"{k}={v}" for k, v in s["shape"].items()), str(s["calls"]), str(s["timed_calls"]),
                       f"{s['mean_ms']:.3f}", spread, f"{s['flops'] / 1e6:.3g}", f"{s['bytes'] / 1e3:.4g}",
                       " ".join(sorted({v for d in s["dtypes"] for v in d.values()})), " ".join(s["sites"]))
    console.print(shapes)


def print_pyspy(spy: dict, timing: dict) -> None:
    from rich.table import Table
    console = _console()
    if not spy.get("ok"):
        console.print(f"[yellow]py-spy: no samples: {spy.get('reason')}[/]")
        return
    table = Table(title=f"py-spy: top Python frames by self time ({spy['samples']} samples)",
                  caption="autokernel/ops/*.py reference frames are the stand-ins for calls charged their shape's "
                          "mean" if timing.get("extrapolated_calls") else None)
    table.add_column("self", justify="right")
    table.add_column("frame")
    for f in spy["top_self"]:
        table.add_row(_pct(f["share"]), f["frame"])
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("profile")(profile_cmd)
    app.command("rank")(rank_cmd)
