"""One agent session for one op, with a printed summary: what `autokernel run` calls per op.

    agent_command(op, agent, model, base_url, trace, run_dir) -> exit code
    0: an accepted candidate (gate passed, measured win); 1: none (a clean negative); UserError (exit 2): bad input
    or environment (no key, unreachable server, protected op, missing kernel file, bad trace).
    run_session(...) -> Result: the same, returning the best candidate (source, feedback, file) for the caller.

Until `autokernel run` exists: `python -m autokernel.agent OP [--agent search|anthropic|openai] ...`.
"""
from __future__ import annotations

import secrets
import time
from pathlib import Path

from autokernel import ops as opspecs
from autokernel import policy as policy_mod
from autokernel.agent import prompt as prompt_mod
from autokernel.agent.evaluate import Evaluator, SandboxEvaluator
from autokernel.agent.loop import Result, Session
from autokernel.agent.providers import Model, make
from autokernel.agent.search import SearchModel
from autokernel.errors import UserError

PROJECT = Path(__file__).resolve().parents[2]


def check_op(op: str, policy: policy_mod.Policy) -> None:
    if op not in opspecs.OPS:
        raise UserError(f"unknown op {op!r}; known ops: {', '.join(opspecs.OPS)}")
    ops = policy.ops
    if op in ops.protected or op in ops.deny or (ops.allow is not None and op not in ops.allow):
        raise UserError(f"op {op!r} may not be rewritten: see ops.protected / ops.deny / ops.allow in policies.yaml")
    prompt_mod.kernel_path(op)


def make_model(agent: policy_mod.Agent, seed: int = 0) -> Model:
    if agent.provider == "search":
        return SearchModel(seed)
    return make(agent.provider, agent.model, agent.base_url, max_output_tokens=agent.max_output_tokens,
                prices=dict(agent.prices))


def agent_command(op: str, agent: str | None = None, model: str | None = None, base_url: str | None = None,
                  trace: str | Path | None = None, run_dir: str | Path | None = None, **kw) -> int:
    """Run one session on `op`, print its summary, and return the exit code (0 a win, 1 none)."""
    return 0 if run_session(op, agent, model, base_url, trace, run_dir, **kw).best else 1


def agent_settings(policy: policy_mod.Policy, agent: str | None, model: str | None,
                   base_url: str | None) -> policy_mod.Agent:
    """The policy's agent section with the command line's --agent/--model/--base-url on top."""
    update = {"provider": agent, "model": model, "base_url": base_url}
    try:
        return policy_mod.Agent.model_validate({**policy.agent.model_dump(),
                                                **{k: v for k, v in update.items() if v is not None}})
    except ValueError as e:
        raise UserError(f"--agent {agent!r}: use search, anthropic or openai ({str(e).splitlines()[-1].strip()})")


def run_session(op: str, agent: str | None = None, model: str | None = None, base_url: str | None = None,
                trace: str | Path | None = None, run_dir: str | Path | None = None, *,
                policy: policy_mod.Policy | None = None, seed: int = 0, evaluator: Evaluator | None = None,
                llm: Model | None = None, echo=print) -> Result:
    """One session on `op` with its summary printed; the Result carries the best accepted candidate (its source,
    and feedback.path: the file under sandbox/<run>/<sha8>/ that `autokernel run` hands to git).

    `agent` (search | anthropic | openai), `model` and `base_url` override policies.yaml's agent section; `policy`
    defaults to ./policies.yaml when present. `evaluator` and `llm` replace the sandboxed gate + bench and the
    provider (tests)."""
    if policy is None:
        policy = policy_mod.load("policies.yaml" if Path("policies.yaml").is_file() else None)
    check_op(op, policy)
    settings = agent_settings(policy, agent, model, base_url)
    trace_data = None
    if trace is not None:
        from autokernel.profile.trace import load_trace
        trace_data = load_trace(trace)
    run_dir = Path(run_dir) if run_dir else (
        PROJECT / "sandbox" / f"agent-{time.strftime('%Y%m%d-%H%M%S')}-{op}-{settings.provider}-{secrets.token_hex(2)}")
    the_model = llm or make_model(settings, seed)
    prompt = prompt_mod.build(op, settings, trace_data)
    evaluator = evaluator or SandboxEvaluator(run_dir, policy, trace=trace)
    echo(f"agent: {the_model.name} on {op}; budget {settings.max_iterations} candidates, {settings.max_tokens} "
         f"tokens, ${settings.max_usd:g}, {settings.max_wall_s:g} s; transcript {run_dir / 'transcript.json'}")
    result = Session(op, the_model, evaluator, prompt, settings, run_dir).run()
    echo(summary(result))
    return result


def summary(r: Result) -> str:
    u = r.usage
    lines = [f"agent: {r.op}: {r.status} ({r.detail}); {r.submitted} candidate(s); "
             f"{u['input_tokens']} input + {u['output_tokens']} output tokens, ${u['usd']:.4f}"]
    if r.best is None:
        lines.append("agent: no accepted candidate: kernels/%s.py stays as it is" % r.op)
    else:
        f = r.best.feedback
        lines.append(f"agent: best {f.sha256[:8]}: {f.summary}" + (f" [{f.note}]" if f.note else ""))
        if f.path:
            lines.append(f"agent: candidate file {f.path}")
    lines.append(f"agent: transcript {r.transcript}")
    return "\n".join(lines)
