"""`autokernel profile` and `autokernel rank`: parse, dispatch, print. The work lives in autokernel/profile/
(profiler.py, rank.py, show.py) and, for a target checkout, autokernel/target/ (profile_target.py, rank_target.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from autokernel import paths
from autokernel.errors import UserError
from autokernel.profile.profiler import CPU_TIMED_PER_SHAPE
from autokernel.profile.show import print_op, print_pyspy, print_rank


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
        model_path=model or pol.target.model, out=out or paths.Layout(Path.cwd()).traces, py_spy=py_spy,
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
    declared ops the same way where they declare `work`, by time share otherwise."""
    from autokernel import ops as opspecs
    from autokernel.profile import rank, trace
    root = _target_root(repo)
    if root is not None:
        return _rank_target(root, trace_path, as_json, plot_file, op, policy_file)
    t = trace.load_trace(trace_path if trace_path is not None else trace.latest())
    if isinstance(t.get("target"), dict):  # a target's trace passed as TRACE: ranked in its own checkout
        return _rank_target(_trace_checkout(t), trace_path, as_json, plot_file, op, policy_file)
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
    from autokernel.target.declaration import checkout_root
    root = checkout_root(repo)
    if repo is not None or (os.path.lexists(root / decl.NAME) and not paths.is_layout(root)):
        return root
    return None


def _trace_checkout(t) -> Path:
    """The checkout a target's trace belongs to: the one whose traces/ holds it (<root>/traces/<run>/summary.json),
    never the root its (checkout-written, committed) contents name; a trace whose recorded root is another
    directory is refused."""
    root = Path(t["_path"]).resolve().parents[2]
    named = t["target"].get("root")
    if not isinstance(named, str) or Path(named).resolve() != root:
        raise UserError(f"{t['_path']}: a target's trace names the checkout {str(named)[:200]!r}, but lies in "
                        f"{root}: rank it with --repo CHECKOUT from its own traces/")
    return root


def _profile_target(root: Path, out: Optional[Path], policy_file: Optional[Path]) -> None:
    from autokernel import policy
    from autokernel.profile import trace
    from autokernel.target import profile_target, rank_target
    pol = policy.for_checkout(root, policy_file, uses=("sandbox", "ops"))
    run_dir, warnings = profile_target.profile(root, pol, out)
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
    t: dict = dict(trace.load_trace(run_dir))  # a target's trace, read as rank_target.load reads it
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
    _show_target(t, pol, as_json, op)


def _show_target(t: dict, policy, as_json: bool, op: Optional[str]) -> None:
    """Rank and print (a table, or JSON); a trace that does not hold up is one line, exit 2."""
    from autokernel.target import rank_target
    if op is not None and op not in t["ops"]:
        raise UserError(f"op {op!r} is not declared in {t['target'].get('declaration')}; declared: "
                        f"{', '.join(t['ops'])}")
    try:
        ranked = rank_target.rank(t, policy)
        if as_json:
            typer.echo(rank_target.to_json(t, ranked, op))
            return
        rank_target.print_rank(t, ranked)
        if op is not None:
            rank_target.print_op(t, op)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:  # a forged or damaged trace
        raise UserError(f"{t.get('_path', 'the trace')}: malformed target trace ({type(e).__name__}: "
                        f"{str(e)[:80]}); re-run `autokernel profile --repo`") from None


def register(app: typer.Typer) -> None:
    app.command("profile")(profile_cmd)
    app.command("rank")(rank_cmd)
