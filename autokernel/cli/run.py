"""`autokernel run` (interactive) and `autokernel nightly` (the CI bot): options, the console, and the exit code of a
pipeline (autokernel/run.py; a target checkout's: autokernel/target/run.py).

Exit codes of `run` and `nightly` (README): 0 done (a win, or for nightly also none), 1 no improvement (run), 2 bad
input or a model that could not be used, 3 out of time: work was left undone that `--resume` picks up (candidates
that passed the gate and were not benchmarked, or a session that ended before the model ever replied), 130
interrupted (Ctrl-C).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from autokernel import run
from autokernel.errors import UserError
from autokernel.untrusted import line

OUT_OF_TIME = 3  # the exit code of a run that left work for --resume (module doc)


def _console() -> Console:
    from autokernel.cli import console
    return console.make()


def interrupted(progress: run.Progress) -> int:
    """Ctrl-C: one line on stderr naming the run to resume (sandbox jobs are already killed where they were waited
    for: autokernel.sandbox); the exit code, 130."""
    where = progress.state.run_dir if progress.state is not None else None
    typer.echo("autokernel: interrupted" + (f"; resume with `autokernel run --resume {where}`" if where else ""),
               err=True)
    return 130


def _ask(question: str) -> bool:
    """The yes/no question `autokernel run` asks at a terminal before each commit (run.Context.ask)."""
    return typer.confirm(question, default=False)


def _target_root(repo: Optional[Path]) -> Optional[Path]:
    """The target checkout (docs/targets.md, section 7): `--repo`, else the work tree here, when it has an
    autokernel.toml and no kernels/ of ours; None: autokernel's own layout (autokernel/run.py)."""
    from autokernel.target import run as target_run
    from autokernel.target.declaration import checkout_root
    try:
        root = checkout_root(repo)
    except UserError:
        return None
    return root if target_run.is_target(root) else None


def context(*, repo, policy_file, agent, base_url, cluster: str | None = None, **kw) -> run.Context:
    """run.context for autokernel's own layout: the one place `run` and `nightly` resolve the checkout (`--repo`,
    else the work tree here: paths.target), which must be a git work tree, and its policy (policy.for_checkout
    under the command's flags); `kw` as run.context takes them (model, console, yes, ...)."""
    from autokernel import paths
    from autokernel import policy as policy_mod
    from autokernel.git import toplevel
    layout = paths.target(repo)
    toplevel(layout.root)  # not a git work tree: exit 2 now, not after the session
    policy = policy_mod.for_checkout(layout.root, policy_file,
                                     flags=policy_mod.flags(agent, base_url, cluster, model=kw.get("model")))
    return run.context(layout=layout, policy=policy, agent=agent, base_url=base_url, cluster=cluster, **kw)


def _target_context(root: Path, agent, model, base_url, policy_file, yes: bool, console):
    """A target run's Ctx (autokernel/target/run.py): a git work tree, its policy under trust rule 6, and the
    profile's (sections sandbox and ops of the same file: --policy, else the checkout's policies.yaml)."""
    from autokernel import policy as policy_mod
    from autokernel.git import toplevel
    from autokernel.target import run as target_run
    toplevel(root)
    pol = policy_mod.for_checkout(root, policy_file, flags=policy_mod.flags(agent, base_url, None, model=model))
    profile_pol = policy_mod.for_checkout(root, policy_file, uses=("sandbox", "ops"))
    return target_run.context(pol, profile_pol, agent, model, base_url, yes, console)


def _run_target(root: Path, op: str | None, agent: str | None, model: str | None, base_url: str | None,
                policy_file: Path | None, yes: bool, console) -> int:
    """`autokernel run --repo` on a target: exit 0 a win (committed, or accepted and not committed), 1 no
    improvement, 2 bad input or a model that could not be used."""
    from autokernel.target import run as target_run
    try:
        ctx = _target_context(root, agent, model, base_url, policy_file, yes, console)
        outcomes = target_run.pipeline(ctx, root, op)
    except UserError as e:
        console.print(f"autokernel run: error: {line(e, 1000)}", markup=False)
        return 2
    target_run.show(console, outcomes)
    if any(o.status == "model_error" for o in outcomes):
        return 2
    if any(o.status in ("committed", "accepted", "already_delivered") for o in outcomes):
        return 0
    console.print("no improvement: every kernel stays as it is")
    return 1


def _nightly_target(root: Path, op: str | None, agent, model, base_url, policy_file, out: Path, push: bool,
                    open_pr: bool, github_api: str, console) -> int:
    """`autokernel nightly --repo` on a target: the same loop, non-interactive (commits), then --push / --open-pr;
    --out gets summary.json and pr.md whatever happened. Exit 0 with or without a win; 2 a model that could not be
    used, bad input or environment (written to the artifacts too)."""
    import os

    from autokernel import git as delivery
    from autokernel.target import run as target_run
    outcomes: list[target_run.TargetOutcome] = []
    prs: list[str] = []
    error = None
    try:
        token = os.environ.get("GITHUB_TOKEN")
        if open_pr and not token:
            raise UserError("--open-pr needs GITHUB_TOKEN in the environment")
        ctx = _target_context(root, agent, model, base_url, policy_file, True, console)
        outcomes = target_run.pipeline(ctx, root, op)
        for o in outcomes:
            if o.status != "committed" or not (push or open_pr):
                continue
            urls = delivery.push(root, o.branch)
            console.print(f"pushed {o.branch} to {line(', '.join(urls), 300)}", markup=False, soft_wrap=True)
            if open_pr:
                assert token is not None  # checked above: --open-pr needs GITHUB_TOKEN
                base = delivery.git(root, "rev-parse", "--abbrev-ref", "HEAD")
                title, _, body = o.message.partition("\n\n")
                prs.append(delivery.open_pull_request(delivery.github_slug(root), o.branch, base, title, body,
                                                      token, github_api))
    except UserError as e:
        error = line(e, 1000)
        console.print(f"autokernel nightly: error: {error}", markup=False)
    finally:
        target_run.write_nightly(out, outcomes, prs, error, root)
    target_run.show(console, outcomes)
    console.print(f"nightly: {sum(o.status == 'committed' for o in outcomes)} commit(s); wrote {out / 'summary.json'} "
                  f"and {out / 'pr.md'}", markup=False, soft_wrap=True)
    return 2 if error or any(o.status == "model_error" for o in outcomes) else 0


def run_cmd(
    op: Optional[str] = typer.Option(None, help="Work on this op only (default: the top-ranked unprotected ops)."),
    agent: Optional[str] = typer.Option(None, help="search | anthropic | openai (default: policies.yaml agent)."),
    model: Optional[str] = typer.Option(None, help="LLM model name for anthropic/openai."),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible server URL (vLLM, SGLang, Ollama, …)."),
    repo: Optional[Path] = typer.Option(None, help="The checkout to work on and commit into (default: the git work "
                                                   "tree here if it has kernels/, else the installed project)."),
    trace: Optional[Path] = typer.Option(None, help="Reuse a trace (traces/<run>/) instead of profiling again."),
    yes: bool = typer.Option(False, "--yes", help="Commit accepted kernels without asking."),
    resume: Optional[Path] = typer.Option(None, help="Continue an interrupted run (its sandbox/run-* directory)."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="policies.yaml (default: the checkout's)."),
    cluster: Optional[str] = typer.Option(None, help="Run gate and bench jobs as Ray tasks on this cluster (ray://"
                                                     "host:10001; default: RAY_ADDRESS, else this machine's slots; "
                                                     "needs pip install -e '.[ray]')."),
):
    """The main job: profile, rank, let an agent rewrite the top kernels, gate, benchmark, commit wins."""
    console = _console()
    target = _target_root(repo)
    if target is not None:  # a checkout with autokernel.toml (docs/targets.md, section 7)
        given = [f for f, v in (("--resume", resume), ("--trace", trace), ("--cluster", cluster)) if v]
        if given:  # silently ignored before: a user resuming a target run got a new run from scratch
            raise UserError(f"{given[0]} applies to autokernel's own layout; a target's run "
                            f"({target / 'autokernel.toml'}) profiles its engine afresh and runs on this machine")
        raise typer.Exit(_run_target(target, op, agent, model, base_url, policy_file, yes, console))
    progress = run.Progress()
    try:
        ctx = context(agent=agent, model=model, base_url=base_url, repo=repo, policy_file=policy_file,
                      console=console, yes=yes, ask=_ask, cluster=cluster)
        state, outcomes = run.pipeline(ctx, op=op, resume=resume, trace=trace, progress=progress)
    except KeyboardInterrupt:
        raise typer.Exit(interrupted(progress)) from None
    if run.model_errors(console, outcomes):
        raise typer.Exit(2)
    if run.unfinished(console, state, outcomes):
        raise typer.Exit(OUT_OF_TIME)
    if not any(o.status in ("committed", "accepted", "declined", "already_delivered") for o in outcomes):
        console.print("no improvement: every kernel stays as it is")
        raise typer.Exit(1)


def nightly_cmd(
    out: Path = typer.Option(Path("autokernel-nightly"), help="Where summary.json and pr.md are written."),
    op: Optional[str] = typer.Option(None, help="Work on this op only."),
    agent: Optional[str] = typer.Option(None, help="search | anthropic | openai."),
    model: Optional[str] = typer.Option(None, help="LLM model name for anthropic/openai."),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible server URL."),
    repo: Optional[Path] = typer.Option(None, help="The checkout to work on and commit into."),
    trace: Optional[Path] = typer.Option(None, help="Reuse a trace instead of profiling."),
    push: bool = typer.Option(False, "--push", help="Push the branch to origin."),
    open_pr: bool = typer.Option(False, "--open-pr", help="Open a pull request (GITHUB_TOKEN; repo from origin)."),
    github_api: str = typer.Option("https://api.github.com", help="GitHub REST API base URL."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="policies.yaml (default: the checkout's)."),
    cluster: Optional[str] = typer.Option(None, help="Run gate and bench jobs on this Ray cluster (default: "
                                                     "RAY_ADDRESS, else this machine)."),
):
    """The CI bot: the same pipeline, non-interactive, under the policy's budgets. Exit 0 with or without a win; 2 if
    any session ended on a model error (the win of another op is still committed and reported), or on bad input or
    environment (a key the server refuses at the first completion, git or GitHub refusing); 3 out of time. --out
    gets summary.json and pr.md for every one of these outcomes, a crash included (the CI's upload step finds
    them), written before the exit."""
    import os

    from autokernel import git as delivery
    console = _console()
    target = _target_root(repo)
    if target is not None:  # a checkout with autokernel.toml (docs/targets.md, section 7)
        raise typer.Exit(_nightly_target(target, op, agent, model, base_url, policy_file, out, push, open_pr,
                                         github_api, console))
    progress, prs, failure = run.Progress(), [], None
    try:
        token = os.environ.get("GITHUB_TOKEN")
        if open_pr and not token:
            raise UserError("--open-pr needs GITHUB_TOKEN in the environment")
        ctx = context(agent=agent, model=model, base_url=base_url, repo=repo, policy_file=policy_file,
                      console=console, yes=True, nightly=True, cluster=cluster)
        run.pipeline(ctx, op=op, resume=None, trace=trace, progress=progress)
        for o in progress.outcomes:
            if o.status != "committed":
                continue
            if open_pr:
                assert token is not None  # checked above: --open-pr needs GITHUB_TOKEN
                prs.append(run.pull_request(ctx, o, token, github_api))
            elif push:
                assert o.branch is not None  # a committed outcome names its branch (run.deliver)
                urls = delivery.push(ctx.layout.root, o.branch)
                console.print(f"pushed {o.branch} to {line(', '.join(urls), 300)}", markup=False, soft_wrap=True)
    except BaseException as e:  # reported in the artifacts, then raised on (the CLI's exit code)
        failure = e
        raise
    finally:
        run.write_nightly(out, progress, prs, failure, console, (repo,) if repo else ())
        if isinstance(failure, KeyboardInterrupt):
            raise typer.Exit(interrupted(progress)) from None
    if run.model_errors(console, progress.outcomes):
        raise typer.Exit(2)
    assert progress.state is not None  # the pipeline returned: it set the run's state first
    if run.unfinished(console, progress.state, progress.outcomes):
        raise typer.Exit(OUT_OF_TIME)


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)
    app.command("nightly")(nightly_cmd)
