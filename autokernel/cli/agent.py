"""`autokernel agent OP [--agent search|anthropic|openai] ...`: one agent session on one op (the session `autokernel
run` runs per op: autokernel/agent/command.py). Exit 0 a candidate accepted, 1 none, 2 bad input."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def agent_command(op: str, agent: str | None = None, model: str | None = None, base_url: str | None = None,
                  trace: str | Path | None = None, run_dir: str | Path | None = None, *, policy=None,
                  repo: str | Path | None = None, **kw) -> int:
    """Run one session on `op` in the target checkout (autokernel.paths; `repo` names it), print its summary, and
    return the exit code (0 a win, 1 none). `policy` defaults to policy.for_checkout on that checkout: the user
    config and the checkout's policies.yaml under trust rule 6."""
    from autokernel import paths
    from autokernel import policy as policy_mod
    from autokernel.agent.command import run_session
    layout = paths.target(repo)
    if policy is None:
        policy = policy_mod.for_checkout(layout.root, flags=policy_mod.flags(agent, base_url, model=model))
    return 0 if run_session(op, agent, model, base_url, trace, run_dir, layout=layout, policy=policy, **kw).best else 1


def agent(
    op: str = typer.Argument(..., help="The op whose kernels/<op>.py the agent rewrites."),
    provider: Optional[str] = typer.Option(None, "--agent", help="search | anthropic | openai (default: policies.yaml "
                                                                "agent.provider)."),
    model: Optional[str] = typer.Option(None, help="Model name (default: the provider's, or the server's first)."),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp)."),
    trace: Optional[Path] = typer.Option(None, help="traces/<run>/ whose shape corpus to optimise for (default: the "
                                                    "spec's shapes)."),
    run_dir: Optional[Path] = typer.Option(None, help="Where candidates and transcript.json go (default: "
                                                      "sandbox/agent-...)."),
    seed: int = typer.Option(0, help="The offline search's seed."),
    repo: Optional[Path] = typer.Option(None, help="The checkout whose kernels/<op>.py is rewritten (default: the one "
                                                   "here)."),
):
    """One agent session on one op, without profiling or committing (the session `autokernel run` runs per op).
    Exit 0 if a candidate was accepted, 1 if none, 2 on bad input."""
    raise typer.Exit(agent_command(op, provider, model, base_url, trace, run_dir, seed=seed, repo=repo))


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)
