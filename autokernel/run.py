"""`autokernel run` (interactive) and `autokernel nightly` (the CI bot): profile -> rank -> agent -> gate -> bench ->
git. One pass down the pipe of docs/design.md, on one checkout (autokernel.paths): its kernels are read, its sandbox/
holds the run's state, its traces/ the profile, its branches the commits.

Per op there is one path, work_on(): an agent session (agent.command.start) with an injected Model and Evaluator,
a confirming benchmark (evaluator.confirm), the report (autokernel.git.report) and the delivery
(autokernel.git.deliver: staged, committed, offered as a PR). The commands build the real model and the sandboxed
evaluator; tests inject a scripted model and a stub evaluator and run the same code down to the commit. state.json
records each op's outcome; `--resume RUN` skips finished ops, retries a delivery that failed (git refused) from the
evidence the run already wrote, without a new session, and benchmarks the candidates that passed the gate when the
session's time ran out (out_of_time), without gating them again (finish_unbenched).

The commands themselves (options, the console, Ctrl-C, exit codes) are autokernel/cli/run.py.
"""
from __future__ import annotations

import collections
import contextlib
import datetime
import difflib
import hashlib
import hmac
import itertools
import json
import os
import secrets
import sys
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from rich.console import Console
from rich.table import Table

from autokernel import device, paths
from autokernel import policy as policy_mod
from autokernel.deadline import Deadline
from autokernel.errors import UserError
from autokernel.untrusted import fenced, inert, line, markup, plain

if TYPE_CHECKING:
    from autokernel.agent.evaluate import Evaluator, Feedback
    from autokernel.agent.providers import Model
    from autokernel.candidate import Candidate


@dataclass
class OpOutcome:
    op: str
    status: str  # committed | accepted | declined | no_improvement | delivery_failed | model_error | out_of_time
    #              | no_reply (the session ended before the model's first reply) | already_delivered (the same
    #              kernels/<op>.py is already a branch's tip over this base: not gated or committed again)
    detail: str
    speedup: float | None = None
    speedup_ci: list[float] | None = None
    branch: str | None = None
    sha: str | None = None
    candidate: str | None = None
    pr_body: str | None = None
    delivery: str | None = None  # the directory holding what the commit carries (written before committing)
    error: str | None = None  # the session ended because the model could not be used (Result.error): exit 2
    unbenched: list[dict] | None = None  # out_of_time: the candidates that passed the gate, for --resume to bench
    tried: dict | None = None  # {candidates, reasons {code: n}, best_speedup}: what a no-win report says was tried


@dataclass
class RunState:
    run_dir: Path
    trace: str | None = None
    ops: list[str] = field(default_factory=list)
    done: dict[str, dict] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # op -> why the run did not try it (fits, searchable)

    def save(self) -> None:
        tmp = self.run_dir / "state.json.tmp"
        body = {"trace": self.trace, "ops": self.ops, "done": self.done, "skipped": self.skipped}
        tmp.write_text(json.dumps({**body, "mac": _mac(body)}, indent=1))
        tmp.replace(self.run_dir / "state.json")

    @classmethod
    def load(cls, run_dir: Path) -> "RunState":
        """The state `save` wrote, signed with this user's key: a run directory a checkout ships (its own
        sandbox/run-*, a README saying to resume it) would otherwise have `--resume` commit whatever it says, on
        any branch, with no gate, no benchmark (red team: a workflow that sends GITHUB_TOKEN away, a key file read
        through a link)."""
        f = run_dir / "state.json"
        if f.is_symlink() or not f.is_file():
            raise UserError(f"{run_dir}: not an autokernel run directory (no state.json); runs live in sandbox/run-*")
        try:
            d = json.loads(f.read_text())
            body = {k: d[k] for k in ("trace", "ops", "done", "skipped")}
            ok = hmac.compare_digest(str(d.get("mac", "")), _mac(body))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            ok = False
        if not ok:
            raise UserError(f"{f}: not written by autokernel for this user (its signature does not match "
                            f"{_key_path()}): refusing to resume a run someone else's files describe")
        return cls(run_dir, d.get("trace"), d.get("ops", []), d.get("done", {}), d.get("skipped", {}))


def _key_path() -> Path:
    return paths.user_cache() / "state.key"


def _mac(body: dict) -> str:
    """HMAC-SHA256 of the state with a key only this user's autokernel reads (made on first use, mode 0600)."""
    key_file = _key_path()
    if not key_file.is_file():
        key_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = key_file.with_suffix(f".{os.getpid()}.{threading.get_ident()}")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(secrets.token_bytes(32))
        with contextlib.suppress(FileExistsError):  # another process made it first: its key stands
            os.link(tmp, key_file)
        os.unlink(tmp)
    msg = json.dumps(body, sort_keys=True).encode()
    return hmac.new(key_file.read_bytes(), msg, hashlib.sha256).hexdigest()


@dataclass
class Context:
    """What every op of a run shares: the checkout, the policy, the model, how candidates are judged."""
    layout: paths.Layout
    policy: policy_mod.Policy
    settings: policy_mod.Agent
    llm: Model | list[Model]  # a list: one model per parallel worker (agent.workers), as command.start takes
    make_evaluator: Callable[..., Evaluator]  # (op_dir, policy, trace, layout) -> an Evaluator (agent.evaluate)
    console: Console
    yes: bool = False
    ask: Callable[[str], bool] | None = None  # asked before each commit (`autokernel run`); None: commit only if yes
    # where gate jobs run with agent.workers > 1 (agent/workers.py: RayCluster.pool on a cluster); None: local slots
    executor: futures.Executor | None = None
    # the engine tokens/s A/B of a win (autokernel.bench.engine_ab.measure); None: not run (an injected evaluator's
    # run: a test double's verdicts and timings, no engine to measure against them), and the PR body says so
    engine_ab: Callable | None = None


class Shown:
    """The evaluator, with each verdict printed as it comes (escaped: the detail is the candidate's doing). Parallel
    workers (agent.workers) call it from several threads: one spinner at a time (rich allows one live display)."""

    def __init__(self, inner: Evaluator, console: Console):
        self.inner, self.console, self.n, self.live = inner, console, itertools.count(1), threading.Lock()

    @contextlib.contextmanager
    def status(self, text: str):
        mine = self.live.acquire(blocking=False)
        try:
            with self.console.status(text) if mine else contextlib.nullcontext():
                yield
        finally:
            if mine:
                self.live.release()

    def evaluate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        with self.status(f"[cyan]{candidate.op}[/]: candidate {next(self.n)}: sandbox → gate → bench …"):
            return self.shown(self.inner.evaluate(candidate, deadline))

    def gate(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> Feedback:
        with self.status(f"[cyan]{candidate.op}[/]: candidate {next(self.n)}: sandbox → gate …"):
            fb = self.inner.gate(candidate, deadline)
        return fb if fb.verdict == "accepted" else self.shown(fb)

    def bench(self, candidate: Candidate, feedback: Feedback, deadline: Deadline = Deadline.none()) -> Feedback:
        with self.status(f"[cyan]{candidate.op}[/]: candidate {feedback.sha256[:8]} passed the gate: bench …"):
            return self.shown(self.inner.bench(candidate, feedback, deadline))

    def check(self, candidate: Candidate, deadline: Deadline = Deadline.none()) -> dict | None:
        return self.inner.check(candidate, deadline)

    def shown(self, fb: Feedback) -> Feedback:
        colour = "green" if fb.accepted else "red" if fb.verdict != "accepted" else "yellow"
        self.console.print(f"  [cyan]{fb.op}[/] candidate {fb.sha256[:8]}: [{colour}]{markup(fb.summary, 400)}[/]")
        return fb

    def confirm(self, candidate: Candidate):  # -> bench.measure.Measurement
        with self.console.status(f"[cyan]{candidate.op}[/]: confirming the win with a fresh benchmark …"):
            return self.inner.confirm(candidate)


def sandbox_evaluator(op_dir: Path, policy, trace: str | None, layout: paths.Layout, executor=None):
    from autokernel.agent.evaluate import SandboxEvaluator
    return SandboxEvaluator(op_dir, policy, trace=trace, layout=layout, executor=executor)


def _confirm(console: Console, ask: Callable[[str], bool], question: str) -> bool:
    if not sys.stdin.isatty():
        console.print(f"{question} [dim](no terminal to ask: not committing; pass --yes to commit)[/]")
        return False
    return ask(question)


def _same_as_head(layout: paths.Layout, op: str) -> None:
    """kernels/<op>.py must be HEAD's blob before a session measures it: the win is committed over HEAD's file
    (autokernel.git.same_as_head; a target's op file is checked the same way). A layout outside git has no HEAD to
    commit over (library callers; the commands require a work tree)."""
    from autokernel import git as delivery
    if (layout.root / ".git").exists():
        delivery.same_as_head(layout.root, f"kernels/{op}.py", layout.read_kernel(op).encode())


def work_on(op: str, state: RunState, ctx: Context) -> OpOutcome:
    """One op: an agent session through the gate and bench, a confirming benchmark, a commit if it wins.

    A session the model could not finish (Result.error: the server kept failing) is an environment failure: the
    outcome carries the error (the commands exit 2), after committing any win the session already had. A session
    whose time ran out after the gate accepted a candidate (Result.unbenched) ends out_of_time, its candidates kept
    for `--resume` (exit 3); one that ended before the model's first reply is no_reply (exit 3), not a negative."""
    from autokernel.agent import command
    from autokernel.agent.ledger import Ledger

    incumbent = command.check_op(op, ctx.policy, ctx.layout)
    _same_as_head(ctx.layout, op)
    op_dir = state.run_dir / op
    evaluator = Shown(ctx.make_evaluator(op_dir, ctx.policy, state.trace, ctx.layout), ctx.console)
    result, session = command.start(op, ctx.settings, ctx.llm, evaluator, op_dir, trace=state.trace,
                                    kernel_file=incumbent, echo=lambda s: ctx.console.print(markup(s)),
                                    ledger=Ledger.of(ctx.layout, ctx.policy.git.branch_prefix, ctx.policy),
                                    bench=ctx.policy.bench,
                                    executor=ctx.executor, sandbox=ctx.policy.sandbox)
    u = result.usage
    provenance = {"agent": ctx.settings.provider, "model": session.model.name, "candidates": result.submitted,
                  "tokens": u["input_tokens"] + u["output_tokens"], "usd": f"{u['usd']:.4f}"}
    error = line(result.error, 300) if result.error else None
    if result.best is None and result.unbenched:
        kept = [_keep_unbenched(op_dir, c, provenance, command.rationale(session, c.source))
                for c in result.unbenched]
        return OpOutcome(op, "out_of_time", f"{len(kept)} candidate(s) passed the gate and were not benchmarked "
                         f"({result.status}: {line(result.detail, 200)})", error=error, unbenched=kept,
                         tried=tried([c.feedback for c in session.candidates], session.recalled))
    if result.error and result.best is None:
        return OpOutcome(op, "model_error", f"the model could not be used: {line(result.error, 300)}; "
                         f"{result.submitted} candidate(s) before it failed", error=error)
    if result.best is None and result.delivered:
        return _already(op, result.delivered[0])
    if result.best is None and result.submitted == 0 and result.cut:
        return OpOutcome(op, "out_of_time", f"the wall-clock budget ended during the gate of the first candidate: "
                         f"nothing was judged ({result.status}: {line(result.detail, 200)})", unbenched=[])
    if result.best is None and result.replies == 0:
        return OpOutcome(op, "no_reply", f"the model sent no reply ({result.status}: {line(result.detail, 200)}); "
                         "nothing was tried")
    if result.best is None:
        return OpOutcome(op, "no_improvement", f"{result.status}: {line(result.detail, 200)}; {result.submitted} "
                         "candidate(s), none both passed the gate and won the benchmark",
                         tried=tried([c.feedback for c in session.candidates], session.recalled))
    out = _deliver_best(op, result.best, provenance, command.rationale(session, result.best.source), evaluator,
                        incumbent, op_dir, state, ctx, session.deadline)
    out.error = error
    if out.status == "no_improvement":  # the confirming benchmark lost it: the report still says what was tried
        out.tried = tried([c.feedback for c in session.candidates], session.recalled)
    return out


def verdict_code(fb) -> str:
    """One reason code per judged candidate: the gate's first failure, else how the benchmark judged it."""
    if fb.verdict != "accepted":
        return line((fb.reasons[0].get("code") if fb.reasons else None) or "gate.rejected", 60)
    if fb.accepted:
        return "bench.won"
    return "bench.implausible" if fb.implausible else "bench.no_win" if fb.speedup is not None else "bench.not_run"


def tried(feedbacks: list, recalled: int = 0) -> dict:
    """What a session judged (each distinct source once): how many, why each lost, the best speedup measured; and how
    many submissions were answered from earlier runs' verdicts (the ledger: a resumed run's resubmissions)."""
    fbs = list({fb.sha256: fb for fb in feedbacks}.values())
    speedups = [fb.speedup for fb in fbs if isinstance(fb.speedup, (int, float))]
    out = {"candidates": len(fbs), "reasons": dict(collections.Counter(map(verdict_code, fbs)).most_common()),
           "best_speedup": max(speedups) if speedups else None}
    return {**out, "recalled": recalled} if recalled else out


def _already(op: str, where: dict) -> OpOutcome:
    return OpOutcome(op, "already_delivered", f"already delivered on {line(where['branch'], 200)} (commit "
                     f"{line(where['commit'], 40)[:10]}) over this base: not gated or committed again",
                     branch=line(where["branch"], 200), sha=line(where["commit"], 40))


def _keep_unbenched(op_dir: Path, candidate, provenance: dict, rationale: str) -> dict:
    """What --resume needs to benchmark a candidate the gate accepted: its source, copied where no candidate ever
    wrote (<op_dir>/unbenched/), the gate's verdict, and what the commit would say about where it came from."""
    fb = candidate.feedback
    d = op_dir / "unbenched"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{fb.sha256}.py").write_text(candidate.source)
    return {"sha256": fb.sha256, "source": str(d / f"{fb.sha256}.py"),  # read back only as <op_dir>/unbenched/
            "feedback": {k: v for k, v in fb.to_dict().items() if k != "summary"},
            "provenance": provenance, "rationale": rationale}


def finish_unbenched(op: str, done: dict, state: RunState, ctx: Context) -> OpOutcome:
    """--resume of an op that ran out of time after the gate: each candidate the gate accepted is benchmarked (never
    gated again: the verdict is the run's own, kept in state.json), each judgement goes to the ledger, and the best
    win is confirmed and delivered as a session's would be."""
    from autokernel.agent import command
    from autokernel.agent.evaluate import Feedback
    from autokernel.agent.ledger import Ledger
    from autokernel.agent.loop import Submission
    from autokernel.candidate import Candidate

    incumbent = command.check_op(op, ctx.policy, ctx.layout)
    _same_as_head(ctx.layout, op)
    op_dir = state.run_dir / op
    evaluator = Shown(ctx.make_evaluator(op_dir, ctx.policy, state.trace, ctx.layout), ctx.console)
    ledger, fields = Ledger.of(ctx.layout, ctx.policy.git.branch_prefix, ctx.policy), Feedback.__dataclass_fields__
    timed = []
    for u in done.get("unbenched") or []:
        digest = str(u.get("sha256"))
        kept = op_dir / "unbenched" / f"{digest}.py"
        source = paths.read_text(kept, state.run_dir) if len(digest) == 64 and kept.is_file() else None
        candidate = Candidate.of(op, source) if source is not None else None
        if candidate is None or candidate.sha256 != digest:
            raise UserError(f"{kept}: missing or changed since the gate judged it (its sha256 is in "
                            f"{state.run_dir / 'state.json'})")
        # timed from a fresh copy: never from the directory the candidate itself ran in
        fb = Feedback(**{**{k: v for k, v in u["feedback"].items() if k in fields},
                         "path": str(candidate.write(op_dir / f"resume-{digest[:8]}"))})
        ctx.console.print(f"  [cyan]{op}[/] candidate {fb.sha256[:8]} passed the gate in this run: benchmarking it")
        fb = evaluator.bench(candidate, fb)
        ledger.record(fb, run=state.run_dir.name, candidate=candidate)
        timed.append((Submission(candidate, fb), u))
    wins = [(c, u) for c, u in timed if c.feedback.accepted]
    if not wins:
        return OpOutcome(op, "no_improvement", f"{len(timed)} candidate(s) that passed the gate were benchmarked "
                         "on --resume; none won")
    best, u = max(wins, key=lambda w: w[0].feedback.speedup or 0.0)
    return _deliver_best(op, best, u["provenance"], u["rationale"], evaluator, incumbent, op_dir, state, ctx,
                         Deadline.after(ctx.policy.agent.max_wall_s))  # the resumed run's own budget


def _deliver_best(op: str, best, provenance: dict, rationale: str, evaluator, incumbent: Path, op_dir: Path,
                  state: RunState, ctx: Context, deadline: Deadline = Deadline.none()) -> OpOutcome:
    """The best candidate (loop.Submission, accepted): confirmed by a fresh benchmark, measured end to end where
    the time left (`deadline`, the session's) allows (engine_ab), staged, shown, committed; unless the same
    kernels/<op>.py is already a branch's tip over this base (then nothing is done twice)."""
    from autokernel import git as delivery
    from autokernel.agent.evaluate import gate_record
    from autokernel.git import deliver as deliver_mod
    from autokernel.git import report

    pol, console = ctx.policy, ctx.console
    fb = best.feedback
    assert best.candidate.sha256 == fb.sha256, "the winning source is not the one the gate judged"
    if pol.git.commit and (d := delivery.delivered(ctx.layout.root, f"kernels/{op}.py", best.source.encode(),
                                                   pol.git.branch_prefix)):
        return _already(op, {"branch": d.branch, "commit": d.sha})
    m = evaluator.confirm(best.candidate)
    if not m.files[-1].accepted:
        c = m.files[-1]
        got = f"{c.speedup.est:.3f}x [{c.speedup.lo:.3f}, {c.speedup.hi:.3f}]; " if c.speedup else ""
        return OpOutcome(op, "no_improvement", f"candidate {fb.sha256[:8]} won in the session ({line(fb.summary)}) "
                         f"but not in the confirming benchmark ({got}{c.reason}: {line(c.detail, 200)}): not "
                         "committed", candidate=fb.path)
    s = m.files[-1].speedup
    win = report.Win(op, m, gate_record(fb), provenance, rationale,
                     Path(state.trace).name if state.trace else None,
                     f"traces/autokernel/{state.run_dir.name}/{op}.json",
                     *deliver_mod.profile_paths(op, state.trace, state.run_dir.name, ctx.layout.root, pol),
                     engine_ab=engine_ab(op, best, incumbent, op_dir, state, ctx, deadline))
    out = OpOutcome(op, "accepted", line(fb.summary), s.est, [s.lo, s.hi], candidate=fb.path)
    (op_dir / "measurement.json").write_text(json.dumps(m.to_dict(), indent=1, default=str))
    incumbent_text = paths.read_text(incumbent, ctx.layout.root)
    # what the commit carries, where no candidate ever wrote: a delivery git refuses is retried by --resume from it
    staged = deliver_mod.stage(op_dir / "delivery", win, best.source, ctx.layout.root, state.trace)
    out.delivery, out.pr_body = str(staged), str(staged / "pr.md")
    if not pol.git.commit:
        return out
    console.print(plain("".join(difflib.unified_diff(incumbent_text.splitlines(True),
                                                     best.source.splitlines(True),
                                                     f"a/kernels/{op}.py", f"b/kernels/{op}.py"))), markup=False,
                  soft_wrap=True)
    console.print("\n".join(report.perf_table(m, op)), markup=False, soft_wrap=True)
    branch = f"{pol.git.branch_prefix}{datetime.date.today().isoformat()}-{op}"
    question = f"Commit kernels/{op}.py to branch {branch}?"
    if not ctx.yes and not (ctx.ask is not None and _confirm(console, ctx.ask, question)):
        out.status = "declined"
        return out
    return deliver(out, state, ctx.layout, branch)


def engine_ab(op: str, best, incumbent: Path, op_dir: Path, state: RunState, ctx: Context, deadline: Deadline):
    """The engine's tokens/s with the incumbent and with the win (autokernel.bench.engine_ab: both arms in fresh
    sandboxed processes, interleaved), or NotMeasured with the reason: no time left, a job failed, none in this
    run. It never costs the win: whatever goes wrong becomes the reason the PR body prints. The engine's weights
    are those the gate's end-to-end stage ran it with (dequantized where the quantized model never calls the op)."""
    from autokernel.bench import engine_ab as ab
    from autokernel.git import report
    if ctx.engine_ab is None:
        return ab.NotMeasured("this run's evaluator is not the sandbox's (an injected one): no engine was run")
    from autokernel.profile import trace as trace_mod
    try:
        t = trace_mod.load_trace(state.trace) if state.trace else None
        with ctx.console.status(f"[cyan]{op}[/]: the engine's tokens/s with and without the kernel (A/B) …"):
            e2e = next((st for st in best.feedback.stages if st.get("name") == "e2e"), None) or {}
            weights = (e2e.get("metrics") or {}).get("weights")
            out = ctx.engine_ab(op, incumbent, best.source.encode(), ctx.policy, op_dir / "engine-ab",
                                kernels_dir=ctx.layout.kernels, deadline=deadline, trace=t,
                                weights=weights if isinstance(weights, str) else None)
    except Exception as e:  # noqa: BLE001 -- an informational figure: the verified win is delivered regardless
        out = ab.NotMeasured(f"the A/B failed: {type(e).__name__}: {line(e, 200)}")
    ctx.console.print(f"  [cyan]{op}[/] {markup(report.tokens_line(out), 600)}", soft_wrap=True)
    return out


def deliver(out: OpOutcome, state: RunState, layout: paths.Layout, branch: str) -> OpOutcome:
    """Commit what <delivery>/ holds (autokernel.git.deliver.commit). A refusal by git is one line (exit 2),
    recorded in state.json as delivery_failed so `--resume` retries just this step."""
    from autokernel.git import DeliveryError
    from autokernel.git.deliver import commit
    assert out.delivery is not None  # staged before the first try (_deliver_best), kept in state.json for --resume
    try:
        c = commit(layout.root, Path(out.delivery), out.op, branch)
    except DeliveryError as e:
        out.status, out.detail = "delivery_failed", line(e, 300)
        state.done[out.op] = {**out.__dict__, "branch": branch}
        state.save()
        raise DeliveryError(f"{line(e, 300)} (the win is kept: `autokernel run --resume {state.run_dir}` commits "
                            "it)") from None
    out.status, out.branch, out.sha = "committed", c.branch, c.sha
    return out


# A candidate's gate and benchmark under the CPU Triton interpreter, its end-to-end check aside, measured on a loaded
# 2-core box: the offline search on attention_decode 87 s (runtime 16 + numeric 1 + bench 70 s: six rounds of fresh
# sandboxed processes, past bench.max_time_s's 30) and ~182 s (83 + 29 + ~70: BLOCK_N 128, a slower kernel there);
# an LLM's rmsnorm rewrite 60 s before its bench (runtime 51 + numeric 9; issue 23). The middle of them.
CPU_GATE_AND_BENCH_S = 130.0


def fits(op: str, t: Mapping[str, Any], pol, console: Console, skipped: dict | None = None) -> bool:
    """On the CPU interpreter, can one candidate be gated and benchmarked within its share of the session's wall
    budget (agent.max_wall_s / agent.max_iterations)?

    Its cost: CPU_GATE_AND_BENCH_S, plus the end-to-end check, which runs the model 1 + e2e.max_new_tokens times with
    the op swapped in (every other op on its torch reference); from the trace, one forward costs the op total_ms /
    forwards. On CUDA everything fits.
    """
    if device.is_cuda():
        return True
    ops = t.get("ops", {})
    forwards = max(1, ops.get("lm_head", {}).get("calls", 1))
    e2e_s = ops.get(op, {}).get("total_ms", 0.0) / forwards * (1 + pol.e2e.max_new_tokens) / 1e3
    need_s = CPU_GATE_AND_BENCH_S + e2e_s
    per_candidate_s = pol.agent.max_wall_s / pol.agent.max_iterations
    if need_s > per_candidate_s:
        return _skip(op, f"one candidate would take ~{need_s:.0f} s on the Triton interpreter (gate and bench "
                         f"~{CPU_GATE_AND_BENCH_S:.0f} s measured, its end-to-end check ~{e2e_s:.0f} s) and the budget "
                         f"is {per_candidate_s:.0f} s a candidate (agent.max_wall_s {pol.agent.max_wall_s:g} / "
                         f"agent.max_iterations {pol.agent.max_iterations}); `autokernel run --op {op}` tries it "
                         "anyway", console, skipped)
    return True


def _skip(op: str, why: str, console: Console, skipped: dict | None) -> bool:
    """Say why `op` is not tried (and keep it for the run's report: RunState.skipped); False."""
    console.print(f"[yellow]skipping {op}: {markup(why)}[/]", soft_wrap=True)
    if skipped is not None:
        skipped[op] = why
    return False


def searchable(op: str, provider: str, layout: paths.Layout, console: Console, skipped: dict | None = None) -> bool:
    """Can the agent work on this op? The offline search only retunes launch meta-parameters (agent/search.py
    find_knobs); a kernel with none gives it nothing to try, so the op is skipped (an LLM provider rewrites it) and
    the run's top_k_ops are ops it can work on."""
    if provider != "search":
        return True
    from autokernel.agent.search import find_knobs
    if find_knobs(layout.read_kernel(op), launch_options=device.is_cuda()):
        return True
    return _skip(op, "its kernel has no launch meta-parameters for the offline search to retune; an LLM agent "
                     "(--agent) can rewrite it", console, skipped)


def context(*, layout: paths.Layout, policy: policy_mod.Policy, agent, model, base_url, console, yes=False, ask=None,
            llm=None, make_evaluator=None, nightly: bool = False, cluster: str | None = None) -> Context:
    """Everything checked before any slow step (exit 2, one line), for the checkout and policy the command resolved
    (autokernel/cli/run.py: the layout, a git work tree with kernels/, and policy.for_checkout's policy): the
    provider with its API key and --base-url (one probe of the server), the sandbox's isolation for candidates from
    an untrusted author (an LLM, or the unattended nightly), the Ray cluster if one is named (--cluster,
    RAY_ADDRESS: autokernel/cluster.py; its nodes check their own isolation, and check_candidate still runs here),
    and the model itself."""
    import functools

    from autokernel import cluster as cluster_mod
    from autokernel import sandbox
    from autokernel.agent.command import agent_settings, make_model
    from autokernel.agent.providers import preflight
    settings = agent_settings(policy, agent, model, base_url)
    if llm is None:
        settled = preflight(settings.provider, settings.model, settings.base_url)
        if settings.model is None and settled:  # the model the probe listed: not listed again (make_model, workers)
            settings = settings.model_copy(update={"model": settled})
    if make_evaluator is None:
        sandbox.preflight(policy.sandbox, untrusted_author=nightly or settings.provider != "search" or layout.foreign)
    remote = cluster_mod.connect(cluster, policy)  # None: this machine's slots
    model = llm or make_model(settings, seed=0, bench=policy.bench)
    from autokernel.bench import engine_ab
    return Context(layout, policy, settings, model, make_evaluator or functools.partial(sandbox_evaluator,
                   executor=remote), console, yes, ask, remote.pool if remote is not None else None,
                   engine_ab.measure if make_evaluator is None else None)


@dataclass
class Progress:
    """How far a pipeline got, kept by the caller: what nightly reports (and Ctrl-C names) when it raises midway."""
    state: RunState | None = None
    outcomes: list[OpOutcome] = field(default_factory=list)


def pipeline(ctx: Context, *, op: Optional[str], resume: Optional[Path], trace: Optional[Path],
             progress: Progress | None = None) -> tuple[RunState, list[OpOutcome]]:
    console, pol, layout = ctx.console, ctx.policy, ctx.layout
    progress = progress if progress is not None else Progress()
    if op:
        from autokernel.agent.command import check_op
        check_op(op, pol, layout)  # an unknown or protected op, or no kernel file: bad input, before profiling
    if not device.is_cuda():
        console.print("[bold yellow]CPU machine: kernels run through the Triton interpreter. Every timing below is "
                      "an interpreter timing — a correctness vehicle, never a GPU speedup.[/]")
    if resume:
        state = RunState.load(Path(resume))
        console.print(f"resuming {state.run_dir}: done {', '.join(state.done) or 'nothing yet'}")
    else:
        state = RunState(layout.run_dir("run"))
        state.run_dir.mkdir(parents=True)
        state.trace = str(Path(trace).resolve()) if trace else None
    progress.state = state
    from autokernel.profile import profiler
    from autokernel.profile import rank as rank_mod
    from autokernel.profile import trace as trace_mod
    from autokernel.profile.show import print_rank
    if state.trace is None:
        with console.status("profiling the live engine on the workload (torch.profiler) …"):
            state.trace = str(profiler.profile(workload_path=pol.target.workload, kernels="triton",
                                               weights=pol.target.weights, model_path=pol.target.model,
                                               out=layout.traces))
        state.save()
    t = trace_mod.load_trace(state.trace)
    ranked = rank_mod.rank(t, pol)
    print_rank(t, ranked)
    if not state.ops:
        state.ops = [op] if op else [r.op for r in ranked if r.status == "target"
                                     # what the agent can work on first: it does not vary with the profile's timings
                                     and searchable(r.op, ctx.settings.provider, layout, console, state.skipped)
                                     and fits(r.op, t, pol, console, state.skipped)
                                     ][: pol.agent.top_k_ops]
        state.save()
    outcomes = progress.outcomes
    for name in state.ops:
        done = state.done.get(name)
        if done and (done["status"] in ("model_error", "no_reply") or  # the op was never tried: try it again
                     done["status"] == "out_of_time" and not done.get("unbenched")):
            done = None
        if done and done["status"] == "delivery_failed":
            o = deliver(OpOutcome(**{k: v for k, v in done.items() if k in OpOutcome.__dataclass_fields__}),
                        state, layout, done["branch"])
        elif done and done["status"] == "out_of_time":
            o = finish_unbenched(name, done, state, ctx)
        elif done:
            outcomes.append(OpOutcome(**{k: v for k, v in done.items() if k in OpOutcome.__dataclass_fields__}))
            continue
        else:
            o = work_on(name, state, ctx)
        state.done[name] = o.__dict__
        state.save()
        outcomes.append(o)
    show(console, state, outcomes)
    return state, outcomes


def show(console: Console, state: RunState, outcomes: list[OpOutcome]) -> None:
    table = Table(title=f"autokernel run {state.run_dir.name}")
    for col in ("op", "outcome", "speedup [CI]", "branch / commit", "detail"):
        table.add_column(col)
    for o in outcomes:
        ci = f"{o.speedup:.3f} [{o.speedup_ci[0]:.3f}, {o.speedup_ci[1]:.3f}]" if o.speedup and o.speedup_ci else "—"
        table.add_row(o.op, o.status, ci, markup(f"{o.branch} {o.sha[:10]}") if o.sha else "—", markup(o.detail, 80))
    console.print(table)


def pull_request(ctx: Context, o: OpOutcome, token: str, api: str) -> str:
    """The PR of a committed win (autokernel.git.deliver.pull_request): the open PR of the same op brought up to
    date, else a new one; its URL."""
    from autokernel.git.deliver import pull_request as open_or_update
    assert o.branch is not None and o.pr_body is not None  # a committed win (deliver) has both
    pr = open_or_update(ctx.layout.root, ctx.policy.git.branch_prefix, o.op, o.branch, Path(o.pr_body).read_text(),
                        token, api)
    if pr.updated:
        ctx.console.print(f"{o.op}: updated the open pull request {pr.url} (branch {pr.updated}) instead of opening "
                          "another", markup=False, soft_wrap=True)
    return pr.url


def write_nightly(out: Path, progress: Progress, prs: list[str], failure: BaseException | None,
                  console: Console, roots: tuple[Path, ...] = ()) -> None:
    """--out/summary.json and --out/pr.md, whatever happened; `failure` is what stopped the run (None: it ended).
    Never through a link planted below the current directory or the checkout `roots` (paths.write_outputs)."""
    state, outcomes = progress.state, progress.outcomes
    error = None if failure is None else line(failure if isinstance(failure, UserError) else
                                              f"{type(failure).__name__}: {failure}".rstrip(": "), 300)
    summary = json.dumps({
        "run_dir": state and str(state.run_dir), "trace": state and state.trace, "device": device.fingerprint(),
        "outcomes": [o.__dict__ for o in outcomes], "skipped": state.skipped if state else {},
        "pull_requests": prs, "error": error}, indent=1, default=str)
    paths.write_outputs(out, {"pr.md": nightly_report(state, outcomes, error), "summary.json": summary}, roots)
    committed = sum(o.status == "committed" for o in outcomes)
    console.print(f"nightly: {committed} commit(s); wrote {out / 'summary.json'} and {out / 'pr.md'}", soft_wrap=True,
                  markup=False)


def nightly_report(state: RunState | None, outcomes: list[OpOutcome], error: str | None = None) -> str:
    """pr.md of a nightly: the PR bodies of its wins, else why there is none (what stopped the run, model error, out
    of time, no win)."""
    bodies = [Path(o.pr_body).read_text() for o in outcomes if o.pr_body]
    stopped = f"# autokernel nightly: stopped\n\n{fenced(inert(error))}\n" if error else ""
    if bodies:
        return "\n\n---\n\n".join(bodies + ([stopped] if stopped else []))
    if stopped:
        return stopped
    failed = [f"- {o.op}: {inert(line(o.error, 300))}" for o in outcomes if o.error]
    if failed:
        return "# autokernel nightly: the agent's model failed\n\n" + fenced("\n".join(failed)) + "\n"
    already = [f"- {o.op}: {o.detail}" for o in outcomes if o.status == "already_delivered"]
    if already and not any(o.status in ("out_of_time", "no_reply") for o in outcomes):
        return "# autokernel nightly: already delivered\n\n" + fenced("\n".join(already)) + "\n"
    cut = [f"- {o.op}: {o.status}: " + (f"{len(o.unbenched)} candidate(s) passed the gate and were not "
                                        "benchmarked" if o.unbenched else inert(line(o.detail, 300)))
           + (f"; in all {_tried_text(o.tried)}" if o.tried else "")
           for o in outcomes if o.status in ("out_of_time", "no_reply")]
    if cut:
        assert state is not None  # an op has an outcome only once the run has its state (pipeline)
        return ("# autokernel nightly: out of time\n\n" + fenced("\n".join(cut)) + f"\n\n`autokernel run --resume "
                f"{state.run_dir}` benchmarks what passed the gate (and tries again an op where nothing was judged); "
                "raise `agent.max_wall_s` if this happens every night.\n")
    lines = [f"- {o.op}: {_tried_text(o.tried)}" + (f"; then {inert(line(o.detail, 400))}" if o.candidate else "")
             if o.tried else f"- {o.op}: {o.status}: {inert(line(o.detail, 300))}"
             for o in outcomes]  # o.candidate: a session's winner that lost its confirming benchmark (_deliver_best)
    skipped = [f"- {op}: {why}" for op, why in (state.skipped if state else {}).items()]
    if not outcomes and skipped:
        return ("# autokernel nightly: nothing tried\n\nEvery op the ranking offered was skipped before a session "
                "started:\n\n" + "\n".join(skipped) + "\n")
    if skipped:
        lines += ["", "Skipped, not tried:", *skipped]
    return ("# autokernel nightly: no improvement\n\nNo candidate both passed the gate and won the benchmark. "
            "What was tried (op: candidates judged, the verdict reason codes, the best weighted speedup measured):"
            "\n\n" + "\n".join(lines or ["- no op was tried"]) + "\n")


def _tried_text(t: dict) -> str:
    """'N candidate(s) judged: code xn, ...; best speedup seen X' (tried())."""
    reasons = ", ".join(f"{inert(line(k, 60))} x{n}" for k, n in (t.get("reasons") or {}).items())
    best = t.get("best_speedup")
    recalled = t.get("recalled") if type(t.get("recalled")) is int else 0
    return (f"{t.get('candidates', 0)} candidate(s) judged{': ' + reasons if reasons else ''}"
            + (f" (and {recalled} answered from earlier runs' verdicts)" if recalled else "") + "; "
            + (f"best speedup seen {best:.3f}x" if isinstance(best, (int, float)) else "best speedup seen: none"))


def unfinished(console: Console, state: RunState, outcomes: list[OpOutcome]) -> bool:
    """One line per op the budget cut short: candidates the gate accepted and the bench never timed, or a session
    that ended before the model's first reply. True if any: exit 3, never "no improvement"."""
    cut = [o for o in outcomes if o.status in ("out_of_time", "no_reply")]
    for o in cut:
        if o.status == "out_of_time" and o.unbenched:
            what = (f"out of time: {o.op}: {len(o.unbenched)} candidate(s) passed the gate and were not benchmarked; "
                    f"`autokernel run --resume {state.run_dir}` benches them")
        else:
            what = (f"{'out of time' if o.status == 'out_of_time' else 'no reply'}: {o.op}: {line(o.detail, 300)}; "
                    f"raise agent.max_wall_s, or `autokernel run --resume {state.run_dir}` tries it again")
        console.print(f"[bold yellow]{markup(what, 1000)}[/]", soft_wrap=True)
    return bool(cut)


def model_errors(console: Console, outcomes: list[OpOutcome]) -> bool:
    """One loud line per op whose session ended on a model error (escaped: a server's reply is quoted in it).
    True if there was any: the run did not do what was asked, and says so with exit 2, never as no improvement."""
    failed = [o for o in outcomes if o.error]
    for o in failed:
        console.print(f"[bold red]error: {o.op}: the agent's model failed: {markup(line(o.error), 300)}[/]"
                      + (" (its win was kept)" if o.status in ("committed", "accepted", "declined") else ""),
                      soft_wrap=True)
    return bool(failed)

