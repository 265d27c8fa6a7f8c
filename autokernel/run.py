"""`autokernel run` (interactive) and `autokernel nightly` (the CI bot): profile -> rank -> agent -> gate -> bench ->
git. One pass down the pipe of DESIGN.md; every stage's output is on disk under the run directory, and the run's
state.json records finished ops so `--resume RUN` picks up where an interrupted run stopped.
"""
from __future__ import annotations

import datetime
import difflib
import json
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from autokernel import device
from autokernel import policy as policy_mod
from autokernel.errors import UserError

PROJECT = Path(__file__).resolve().parents[1]


@dataclass
class OpOutcome:
    op: str
    status: str  # committed | accepted | declined | no_improvement
    detail: str
    speedup: float | None = None
    speedup_ci: list[float] | None = None
    branch: str | None = None
    sha: str | None = None
    candidate: str | None = None
    pr_body: str | None = None


@dataclass
class RunState:
    run_dir: Path
    trace: str | None = None
    ops: list[str] = field(default_factory=list)
    done: dict[str, dict] = field(default_factory=dict)

    def save(self) -> None:
        tmp = self.run_dir / "state.json.tmp"
        tmp.write_text(json.dumps({"trace": self.trace, "ops": self.ops, "done": self.done}, indent=1))
        tmp.replace(self.run_dir / "state.json")

    @classmethod
    def load(cls, run_dir: Path) -> "RunState":
        f = run_dir / "state.json"
        if not f.is_file():
            raise UserError(f"{run_dir}: not an autokernel run directory (no state.json); runs live in sandbox/run-*")
        d = json.loads(f.read_text())
        return cls(run_dir, d.get("trace"), d.get("ops", []), d.get("done", {}))


def _verdict_of(candidate: Path) -> dict:
    found = sorted(candidate.parent.glob("*/verdict.json"))
    return json.loads(found[-1].read_text()) if found else {}


def perf_table(m, op: str) -> list[str]:
    """Markdown rows: per shape before/after, speedup with CI, GB/s and % of peak, and the weighted speedup."""
    inc, cand = m.files[0], m.files[-1]
    rows = [f"Timings: **{m.label}**" + ("" if device.is_cuda() else " — interpreter timings, not GPU speed."), "",
            "| shape | dtype | calls | before ms | after ms | speedup [CI] | after GB/s | after % peak |",
            "|---|---|---:|---:|---:|---|---:|---:|"]
    for a, b in zip(inc.shapes, cand.shapes):
        shape = " ".join(f"{k}={v}" for k, v in a.shape.items())
        pct = "—" if b.fraction_of_peak is None else f"{100 * b.fraction_of_peak:.2f}"
        rows.append(f"| {shape} | {a.dtype} | {a.calls} | {a.median_ms.est:.4g} | {b.median_ms.est:.4g} | "
                    f"{b.speedup.est:.3f} [{b.speedup.lo:.3f}, {b.speedup.hi:.3f}] | {b.gbps:.3g} | {pct} |")
    s = cand.speedup
    rows += ["", f"Weighted (by calls) geometric-mean speedup of `{op}`: **{s.est:.3f}x** "
                 f"[{s.lo:.3f}, {s.hi:.3f}] at {100 * m.policy['confidence']:.0f} % confidence "
                 f"(policy minimum: lower bound > {m.policy['min_speedup']})."]
    return rows


def report(op: str, m, verdict: dict, provenance: dict, trace: str | None, candidate_rel: str) -> str:
    """The commit message body and PR body: perf diff, e2e stats, gate stages, device, provenance, repro line."""
    stages = verdict.get("stages", [])
    e2e = next((s for s in stages if s["name"] == "e2e"), None)
    lines = perf_table(m, op) + ["", "End to end (teacher-forced KL vs the unmodified engine, then a greedy run):"]
    if e2e:
        mt = e2e.get("metrics", {})
        lines.append(f"- KL mean {mt.get('kl_mean', 0):.3g} / p99 {mt.get('kl_p99', 0):.3g} / max "
                     f"{mt.get('kl_max', 0):.3g} nats over {mt.get('positions')} tokens; top-1 agreement "
                     f"{mt.get('top1', 0):.4f}; longest token runs (baseline, candidate) {mt.get('repeat_runs')}; "
                     f"noise floor {mt.get('noise_floor')}")
    else:
        lines.append("- (no end-to-end stage in this verdict)")
    lines += ["", "Gate stages passed: " + ", ".join(f"{s['name']} ({s.get('elapsed_s', 0):.1f} s)" for s in stages)
              + f"; seed {verdict.get('seed')}; candidate sha256 {verdict.get('candidate_sha256', '')[:16]}",
              "", "Device: " + json.dumps(m.fingerprint, sort_keys=True),
              "", "Provenance: " + ", ".join(f"{k} {v}" for k, v in provenance.items()),
              "", "Reproduce: `autokernel verify " + op + " " + candidate_rel + f" --seed {verdict.get('seed')}"
              + (f" --trace {trace}" if trace else "") + "` and `autokernel bench " + op + " " + candidate_rel
              + (f" --trace {trace}" if trace else "") + "`"]
    return "\n".join(lines)


def _confirm(console: Console, question: str) -> bool:
    if not sys.stdin.isatty():
        console.print(f"{question} [dim](no terminal to ask: not committing; pass --yes to commit)[/]")
        return False
    return typer.confirm(question, default=False)


def work_on(op: str, state: RunState, pol, console: Console, *, agent: Optional[str], model: Optional[str],
            base_url: Optional[str], repo: Path, yes: bool, interactive: bool) -> OpOutcome:
    """One op: an agent session through the gate and bench, a confirming benchmark, a commit if it wins."""
    from autokernel.agent.command import agent_settings, check_op, make_model
    from autokernel.agent.evaluate import SandboxEvaluator
    from autokernel.agent.loop import Session
    from autokernel.agent import prompt as prompt_mod
    from autokernel.bench.measure import measure
    from autokernel.git import commit_files

    check_op(op, pol)
    settings = agent_settings(pol, agent, model, base_url)
    op_dir = state.run_dir / op
    trace_data = None
    if state.trace:
        from autokernel.profile.trace import load_trace
        trace_data = load_trace(state.trace)
    inner = SandboxEvaluator(op_dir, pol, trace=state.trace)

    class Echo:  # the agent's steps as they stream: one line per candidate verdict
        def evaluate(self, op_: str, source: str):
            with console.status(f"[cyan]{op_}[/]: candidate {len(inner.seen) + 1}: sandbox → gate → bench …"):
                fb = inner.evaluate(op_, source)
            console.print(f"  [cyan]{op_}[/] candidate {fb.sha256[:8]}: "
                          + ("[green]" if fb.accepted else "[red]" if fb.verdict != "accepted" else "[yellow]")
                          + fb.summary + "[/]")
            return fb

    llm = make_model(settings, seed=0)
    console.print(f"[bold]{op}[/]: agent {llm.name}; budget {settings.max_iterations} candidates, "
                  f"{settings.max_wall_s:g} s, ${settings.max_usd:g}")
    result = Session(op, llm, Echo(), prompt_mod.build(op, settings, trace_data), settings, op_dir).run()
    u = result.usage
    provenance = {"agent": settings.provider, "model": llm.name, "candidates": result.submitted,
                  "tokens": u["input_tokens"] + u["output_tokens"], "usd": f"{u['usd']:.4f}",
                  "transcript": str(result.transcript)}
    if result.best is None:
        return OpOutcome(op, "no_improvement", f"{result.status}: {result.detail}; {result.submitted} candidate(s), "
                         "none both passed the gate and won the benchmark")
    fb = result.best.feedback
    cand = Path(fb.path)
    with console.status(f"[cyan]{op}[/]: confirming the win with a fresh benchmark …"):
        m = measure(op, [cand], inner.cases(op), pol, op_dir / "confirm")
    if not m.files[-1].accepted:
        return OpOutcome(op, "no_improvement", f"candidate {fb.sha256[:8]} won in the session ({fb.summary}) but "
                         f"not in the confirming benchmark ({m.files[-1].reason}): not committed",
                         candidate=str(cand))
    s = m.files[-1].speedup
    verdict = _verdict_of(cand)
    old = (repo / "kernels" / f"{op}.py").read_text() if (repo / "kernels" / f"{op}.py").is_file() else ""
    new = cand.read_text()
    body = report(op, m, verdict, provenance, state.trace, f"kernels/{op}.py")
    title = f"autokernel: faster {op} ({s.est:.3f}x [{s.lo:.3f}, {s.hi:.3f}], {m.label})"
    (op_dir / "pr.md").write_text(f"# {title}\n\n{body}\n")
    (op_dir / "measurement.json").write_text(json.dumps(m.to_dict(), indent=1, default=str))
    out = OpOutcome(op, "accepted", fb.summary, s.est, [s.lo, s.hi], candidate=str(cand), pr_body=str(op_dir / "pr.md"))
    if not pol.git.commit:
        return out
    console.print("".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                               f"a/kernels/{op}.py", f"b/kernels/{op}.py")), markup=False)
    console.print("\n".join(perf_table(m, op)), markup=False)
    branch = f"{pol.git.branch_prefix}{datetime.date.today().isoformat()}-{op}"
    if not yes and not (interactive and _confirm(console, f"Commit kernels/{op}.py to branch {branch}?")):
        out.status = "declined"
        return out
    files = {f"kernels/{op}.py": new,
             f"traces/autokernel-{state.run_dir.name}/{op}/measurement.json": (op_dir / "measurement.json").read_text(),
             f"traces/autokernel-{state.run_dir.name}/{op}/verdict.json": json.dumps(verdict, indent=1)}
    if state.trace:
        files[f"traces/autokernel-{state.run_dir.name}/before-summary.json"] = Path(
            state.trace if state.trace.endswith(".json") else Path(state.trace) / "summary.json").read_text()
    d = commit_files(repo, branch, files, f"{title}\n\n{body}\n")
    out.status, out.branch, out.sha = "committed", d.branch, d.sha
    return out


def fits(op: str, t: dict, pol, console: Console) -> bool:
    """On the CPU interpreter, can one candidate's end-to-end check finish within its share of the wall budget?

    The check runs the model 1 + e2e.max_new_tokens times with the op swapped in (every other op on its torch
    reference); from the trace, one forward costs the op total_ms / forwards. On CUDA everything fits.
    """
    if device.is_cuda():
        return True
    ops = t.get("ops", {})
    forwards = max(1, ops.get("lm_head", {}).get("calls", 1))
    est_s = ops.get(op, {}).get("total_ms", 0.0) / forwards * (1 + pol.e2e.max_new_tokens) / 1e3
    per_candidate_s = pol.agent.max_wall_s / pol.agent.max_iterations
    if est_s > per_candidate_s:
        console.print(f"[yellow]skipping {op}: one end-to-end check would take ~{est_s:.0f} s on the Triton "
                      f"interpreter (budget {per_candidate_s:.0f} s per candidate); `autokernel run --op {op}` "
                      "tries it anyway[/]")
        return False
    return True


def pipeline(*, op: Optional[str], agent: Optional[str], model: Optional[str], base_url: Optional[str],
             repo: Optional[Path], yes: bool, interactive: bool, resume: Optional[Path], trace: Optional[Path],
             policy_file: Optional[Path], console: Console) -> tuple[RunState, list[OpOutcome]]:
    pol = policy_mod.load(policy_file or (Path("policies.yaml") if Path("policies.yaml").is_file() else None))
    repo = Path(repo or PROJECT).resolve()
    from autokernel.git import open_repo
    open_repo(repo)  # fail early (exit 2) when the target is not a git repository
    if op:
        from autokernel.agent.command import check_op
        check_op(op, pol)  # an unknown or protected op is bad input: say so before profiling
    if not device.is_cuda():
        console.print("[bold yellow]CPU machine: kernels run through the Triton interpreter. Every timing below is "
                      "an interpreter timing — a correctness vehicle, never a GPU speedup.[/]")
    if resume:
        state = RunState.load(Path(resume))
        console.print(f"resuming {state.run_dir}: done {', '.join(state.done) or 'nothing yet'}")
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        state = RunState(PROJECT / "sandbox" / f"run-{stamp}-{secrets.token_hex(2)}")
        state.run_dir.mkdir(parents=True)
        state.trace = str(trace) if trace else None
    from autokernel.profile import profiler, rank as rank_mod, trace as trace_mod
    from autokernel.profile.command import print_rank
    if state.trace is None:
        with console.status("profiling the live engine on the workload (torch.profiler) …"):
            state.trace = str(profiler.profile(workload_path=pol.target.workload, kernels="triton",
                                               weights=pol.target.weights, model_path=pol.target.model,
                                               out=PROJECT / "traces"))
        state.save()
    t = trace_mod.load_trace(state.trace)
    ranked = rank_mod.rank(t, pol)
    print_rank(t, ranked)
    if not state.ops:
        state.ops = [op] if op else [r.op for r in ranked if r.status == "target" and fits(r.op, t, pol, console)
                                     ][: pol.agent.top_k_ops]
        state.save()
    outcomes = []
    for name in state.ops:
        if name in state.done:
            outcomes.append(OpOutcome(**state.done[name]))
            continue
        o = work_on(name, state, pol, console, agent=agent, model=model, base_url=base_url, repo=repo, yes=yes,
                    interactive=interactive)
        state.done[name] = o.__dict__
        state.save()
        outcomes.append(o)
    table = Table(title=f"autokernel run {state.run_dir.name}")
    for col in ("op", "outcome", "speedup [CI]", "branch / commit", "detail"):
        table.add_column(col)
    for o in outcomes:
        ci = f"{o.speedup:.3f} [{o.speedup_ci[0]:.3f}, {o.speedup_ci[1]:.3f}]" if o.speedup else "—"
        table.add_row(o.op, o.status, ci, f"{o.branch} {o.sha[:10]}" if o.sha else "—", o.detail[:80])
    console.print(table)
    return state, outcomes


def run_cmd(
    op: Optional[str] = typer.Option(None, help="Work on this op only (default: the top-ranked unprotected ops)."),
    agent: Optional[str] = typer.Option(None, help="search | anthropic | openai (default: policies.yaml agent)."),
    model: Optional[str] = typer.Option(None, help="LLM model name for anthropic/openai."),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible server URL (vLLM, SGLang, Ollama, …)."),
    repo: Optional[Path] = typer.Option(None, help="Git repository to commit into (default: this project)."),
    trace: Optional[Path] = typer.Option(None, help="Reuse a trace (traces/<run>/) instead of profiling again."),
    yes: bool = typer.Option(False, "--yes", help="Commit accepted kernels without asking."),
    resume: Optional[Path] = typer.Option(None, help="Continue an interrupted run (its sandbox/run-* directory)."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="policies.yaml (default: ./policies.yaml)."),
):
    """The main job: profile, rank, let an agent rewrite the top kernels, gate, benchmark, commit wins."""
    console = Console()
    _, outcomes = pipeline(op=op, agent=agent, model=model, base_url=base_url, repo=repo, yes=yes,
                           interactive=True, resume=resume, trace=trace, policy_file=policy_file, console=console)
    if not any(o.status in ("committed", "accepted", "declined") for o in outcomes):
        console.print("no improvement: every kernel stays as it is")
        raise typer.Exit(1)


def nightly_cmd(
    out: Path = typer.Option(Path("autokernel-nightly"), help="Where summary.json and pr.md are written."),
    op: Optional[str] = typer.Option(None, help="Work on this op only."),
    agent: Optional[str] = typer.Option(None, help="search | anthropic | openai."),
    repo: Optional[Path] = typer.Option(None, help="Git repository to commit into (default: this project)."),
    trace: Optional[Path] = typer.Option(None, help="Reuse a trace instead of profiling."),
    push: bool = typer.Option(False, "--push", help="Push the branch to origin."),
    open_pr: bool = typer.Option(False, "--open-pr", help="Open a pull request (GITHUB_TOKEN; repo from origin)."),
    github_api: str = typer.Option("https://api.github.com", help="GitHub REST API base URL."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="policies.yaml (default: ./policies.yaml)."),
):
    """The CI bot: the same pipeline, non-interactive, under the policy's budgets. Exit 0 with or without a win."""
    import os

    from autokernel import git as delivery
    console = Console()
    state, outcomes = pipeline(op=op, agent=agent, model=None, base_url=None, repo=repo, yes=True,
                               interactive=False, resume=None, trace=trace, policy_file=policy_file, console=console)
    out.mkdir(parents=True, exist_ok=True)
    committed = [o for o in outcomes if o.status == "committed"]
    prs = []
    for o in committed:
        if push or open_pr:
            delivery.push(repo or PROJECT, o.branch)
        if open_pr:
            token = os.environ.get("GITHUB_TOKEN")
            if not token:
                raise UserError("--open-pr needs GITHUB_TOKEN in the environment")
            body = Path(o.pr_body).read_text()
            base = delivery.open_repo(repo or PROJECT).active_branch.name
            prs.append(delivery.open_pull_request(delivery.github_slug(repo or PROJECT), o.branch, base,
                                                  body.splitlines()[0].lstrip("# "), body, token, github_api))
    pr_md = "\n\n---\n\n".join(Path(o.pr_body).read_text() for o in outcomes if o.pr_body) or \
        "# autokernel nightly: no improvement\n\nNo candidate both passed the gate and won the benchmark.\n"
    (out / "pr.md").write_text(pr_md)
    (out / "summary.json").write_text(json.dumps({
        "run_dir": str(state.run_dir), "trace": state.trace, "device": device.fingerprint(),
        "outcomes": [o.__dict__ for o in outcomes], "pull_requests": prs}, indent=1, default=str))
    console.print(f"nightly: {len(committed)} commit(s); wrote {out / 'summary.json'} and {out / 'pr.md'}")


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)
    app.command("nightly")(nightly_cmd)
