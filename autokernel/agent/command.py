"""One agent session for one op: the piece `autokernel run` (autokernel.run.work_on) and `autokernel agent` share, so
the session a commit comes from is the session the tests drive.

    agent_settings(policy, agent, model, base_url) -> the policy's agent section with the command line on top
    make_model(settings, seed, bench=policy.bench) -> the Model; building it checks the provider, the API key and
        --base-url (exit 2), so callers build it before any slow step (profiling)
    start(op, ...) -> (Result, Session): the session itself (or agent.workers of them: agent/workers.py), with the
                            model(s) and evaluator injected
    run_session(...) -> Result, with a printed summary (`autokernel agent`, autokernel/cli/agent.py, exits 0 on a
        win, 1 on none)
Bad input or environment (no key, unreachable server, protected op, missing kernel file, bad trace) is a UserError
(exit 2).
"""
from __future__ import annotations

from concurrent import futures
from pathlib import Path

from autokernel import ops as opspecs
from autokernel import paths
from autokernel import policy as policy_mod
from autokernel.agent import prompt as prompt_mod
from autokernel.agent.evaluate import Evaluator, SandboxEvaluator
from autokernel.agent.ledger import Ledger
from autokernel.agent.loop import Result, Session
from autokernel.agent.providers import Model, make
from autokernel.agent.search import SearchModel
from autokernel.errors import UserError
from autokernel.untrusted import plain


def check_op(op: str, policy: policy_mod.Policy, layout: paths.Layout) -> Path:
    """The target's kernels/<op>.py (`layout`: the checkout the command resolved, autokernel.paths), if `op`
    exists, may be rewritten, and has a kernel file there that parses; every kernels/*.py must be a regular file
    inside the checkout (the gate's end-to-end stage reads them all), else UserError (exit 2)."""
    if op not in opspecs.OPS:
        raise UserError(f"unknown op {op!r}; known ops: {', '.join(opspecs.OPS)}")
    ops = policy.ops
    if op in ops.protected or op in ops.deny or (ops.allow is not None and op not in ops.allow):
        raise UserError(f"op {op!r} may not be rewritten: see ops.protected / ops.deny / ops.allow in policies.yaml")
    layout.read_kernel(op)
    layout.checked_kernels()
    return layout.kernel_file(op)


def make_model(agent: policy_mod.Agent, seed: int = 0, *, bench: policy_mod.Bench | None = None,
               interpreter: bool | None = None) -> Model:
    """The provider's Model. The offline search steps only on a win that clears `bench` (the policy's bench
    section: its min_speedup is the bar a commit must clear too); `interpreter` None means this machine's device
    decides (under the Triton interpreter num_warps / num_stages do nothing and are not searched)."""
    if agent.provider == "search":
        return SearchModel(seed, interpreter=interpreter,
                           min_speedup=(bench or policy_mod.Bench()).min_speedup)
    reasoning = ({"thinking_budget_tokens": agent.thinking_budget_tokens} if agent.provider == "anthropic" else
                 {"reasoning_effort": agent.reasoning_effort, "reasoning_room_tokens": agent.reasoning_room_tokens})
    return make(agent.provider, agent.model, agent.base_url, max_output_tokens=agent.max_output_tokens,
                prices=dict(agent.prices), **reasoning)


def agent_settings(policy: policy_mod.Policy, agent: str | None, model: str | None,
                   base_url: str | None) -> policy_mod.Agent:
    """The policy's agent section with the command line's --agent/--model/--base-url on top."""
    update = {"provider": agent, "model": model, "base_url": base_url}
    try:
        return policy_mod.Agent.model_validate({**policy.agent.model_dump(),
                                                **{k: v for k, v in update.items() if v is not None}})
    except ValueError as e:
        why = str(e).splitlines()[-1].strip()
        raise UserError(f"--agent {agent!r}: use search, anthropic or openai ({why})") from None


def worker_models(llm: Model | list[Model], settings: policy_mod.Agent,
                  bench: policy_mod.Bench | None = None) -> list[Model]:
    """One model per worker (agent.workers): the given one(s) first (a list: tests), then make_model with seed i,
    naming the model the first one settled on (a server's first: its models are listed once per run, not per
    worker)."""
    given = list(llm) if isinstance(llm, (list, tuple)) else [llm]
    settled = given[0].model
    if settings.model is None and settings.provider != "search" and settled is not None:
        settings = settings.model_copy(update={"model": settled})
    return given[:settings.workers] + [make_model(settings, seed=i, bench=bench)
                                       for i in range(len(given), settings.workers)]


def start(op: str, settings: policy_mod.Agent, llm: Model | list[Model], evaluator: Evaluator, run_dir: Path, *,
          trace: str | Path | None = None, kernel_file: Path, echo=print,
          ledger: Ledger | None = None, bench: policy_mod.Bench | None = None,
          executor: futures.Executor | None = None,
          sandbox: policy_mod.Sandbox) -> tuple[Result, Session]:
    """Run one session, or agent.workers sessions at once (agent/workers.py: `executor` takes the gate jobs, default
    this machine's sandbox slots under `sandbox`, the run's sandbox policy); the Session that found the best
    candidate comes back too (its messages hold the model's own account of its work). `kernel_file`: the target
    checkout's kernels/<op>.py, the incumbent the prompt shows."""
    trace_data = None
    if trace is not None:
        from autokernel.profile.trace import load_trace
        trace_data = load_trace(trace)
    prompt = prompt_mod.build(op, settings, trace_data, kernel_file=kernel_file)
    models = worker_models(llm, settings, bench)
    if len(models) > 1:
        from autokernel.agent import workers
        names = ", ".join(plain(m.name, 200) for m in models)  # a server's model id: no escapes on the terminal
        echo(f"agent: {len(models)} workers ({names}) on {op}; budget per worker {settings.max_iterations} "
             f"candidates, {settings.max_tokens} tokens, ${settings.max_usd:g}; {settings.max_wall_s:g} s; "
             f"transcripts {run_dir}/worker-*/")
        return workers.run(op, models, evaluator, prompt, settings, run_dir, ledger=ledger, executor=executor,
                           sandbox=sandbox)
    echo(f"agent: {plain(models[0].name, 200)} on {op}; budget {settings.max_iterations} candidates, "
         f"{settings.max_tokens} tokens, ${settings.max_usd:g}, {settings.max_wall_s:g} s; "
         f"transcript {run_dir / 'transcript.json'}")
    session = Session(op, models[0], evaluator, prompt, settings, run_dir, ledger=ledger)
    return session.run(), session


def rationale(session: Session, source: str) -> str:
    """The model's words about the winning candidate: the text of the turn that submitted it, and its finish()
    summary. Untrusted text: the report fences it (autokernel.git.report)."""
    said = []
    for m in session.messages:
        calls = (m.get("tool_calls") or []) if m.get("role") == "assistant" else []
        if any(c.get("name") == "submit_candidate" and isinstance(c.get("arguments"), dict)
               and c["arguments"].get("source") == source for c in calls) and (m.get("content") or "").strip():
            said.append(m["content"].strip())
    if session.finished:
        said.append(session.finished.strip())
    return "\n\n".join(dict.fromkeys(s for s in said if s))


def run_session(op: str, agent: str | None = None, model: str | None = None, base_url: str | None = None,
                trace: str | Path | None = None, run_dir: str | Path | None = None, *, layout: paths.Layout,
                policy: policy_mod.Policy, seed: int = 0, evaluator: Evaluator | None = None,
                llm: Model | None = None, echo=print, ledger: Ledger | None = None) -> Result:
    """One session on `op` in the target checkout `layout` with its summary printed; the Result carries the best
    accepted candidate.

    `agent` (search | anthropic | openai), `model` and `base_url` override policies.yaml's agent section; `policy`
    is the command's (autokernel/cli/agent.py: policy.for_checkout on `layout`, the user config and the checkout's
    policies.yaml under trust rule 6). `evaluator`
    and `llm` replace the sandboxed gate + bench and the provider (tests). `ledger` (agent/ledger.py) defaults to
    the target's sandbox/ledger.jsonl when the real evaluator judges, else none (an injected evaluator's verdicts
    are not the gate's)."""
    kernel_file = check_op(op, policy, layout)
    settings = agent_settings(policy, agent, model, base_url)
    run_dir = Path(run_dir) if run_dir else layout.run_dir("agent", op, settings.provider)
    the_model = llm or make_model(settings, seed, bench=policy.bench)
    if evaluator is None:
        from autokernel import sandbox  # a model's candidates, another checkout's kernels: trust rules 3 and 6
        sandbox.preflight(policy.sandbox, untrusted_author=settings.provider != "search" or layout.foreign)
        evaluator = SandboxEvaluator(run_dir, policy, trace=trace, layout=layout)
        ledger = ledger or Ledger.of(layout, policy=policy)
    result, _ = start(op, settings, the_model, evaluator, run_dir, trace=trace, kernel_file=kernel_file, echo=echo,
                      ledger=ledger, bench=policy.bench, sandbox=policy.sandbox)
    echo(summary(result))
    return result


def summary(r: Result) -> str:
    """The session in a few lines; the status detail may quote the model (finish summary): control chars go."""
    u = r.usage
    lines = [f"agent: {r.op}: {r.status} ({plain(r.detail, 300)}); {r.submitted} candidate(s); "
             f"{u['input_tokens']} input + {u['output_tokens']} output tokens, ${u['usd']:.4f}"]
    if r.best is None:
        lines.append("agent: no accepted candidate: kernels/%s.py stays as it is" % r.op)
    else:
        f = r.best.feedback
        lines.append(f"agent: best {f.sha256[:8]}: {plain(f.summary, 300)}" + (f" [{plain(f.note)}]" if f.note else ""))
        if f.path:
            lines.append(f"agent: candidate file {f.path}")
    lines.append(f"agent: transcript {r.transcript}")
    return "\n".join(lines)
