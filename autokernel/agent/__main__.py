"""`python -m autokernel.agent OP [--agent ...]`: one agent session without profiling or committing (the session
`autokernel run` runs per op, agent.command.start)."""
from __future__ import annotations

import argparse
import sys

from autokernel.agent.command import agent_command
from autokernel.errors import UserError
from autokernel.untrusted import line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autokernel.agent", description=__doc__)
    p.add_argument("op", help="the op whose kernels/<op>.py the agent rewrites")
    p.add_argument("--agent", choices=("search", "anthropic", "openai"), help="default: policies.yaml agent.provider")
    p.add_argument("--model", help="model name (default: the provider's, or the server's first)")
    p.add_argument("--base-url", help="OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp)")
    p.add_argument("--trace", help="traces/<run>/ whose shape corpus to optimise for (default: the spec's shapes)")
    p.add_argument("--run-dir", help="where candidates and transcript.json go (default: sandbox/agent-...)")
    p.add_argument("--seed", type=int, default=0, help="the offline search's seed")
    p.add_argument("--repo", help="the checkout whose kernels/<op>.py is rewritten (default: the one here)")
    a = p.parse_args(argv)
    try:
        return agent_command(a.op, a.agent, a.model, a.base_url, a.trace, a.run_dir, seed=a.seed, repo=a.repo)
    except UserError as e:
        print(f"autokernel: error: {line(e)}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
