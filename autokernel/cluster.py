"""Where gate and bench jobs run: local sandbox slots on this machine, or Ray tasks on a cluster.

    executor(address, policy) -> Executor            --cluster ADDRESS, else RAY_ADDRESS, else policy cluster.address
                                                      (Local or RayCluster: both implement the Executor protocol)
    connect(address, policy) -> RayCluster | None      the same, None for local (autokernel run keeps its own path)
    ex.verify(op, candidate, **kw) -> Verdict                 drop-in for autokernel.gate.verify
    ex.measure(op, candidates, cases, policy, job_root, incumbent) -> Measurement   drop-in for bench.measure.measure
    ex.gate_jobs([GateJob]) -> [JobResult]                    many gate jobs at once; one lost job never raises
    ray_cluster.pool                                          a submit(fn, ...) -> Future executor as wide as the
                                                              cluster: agent/workers.py's gate pool on a cluster

Trust. A Ray task runs TRUSTED autokernel code on its node, the same gate.verify / bench.measure the local path calls,
and that code starts bubblewrap on the node: candidate code never runs in the Ray worker process. A task is given
bytes (the candidate, the target checkout's kernels/*.py) and a Policy, writes them to a node-local temporary
directory, and returns the Verdict (or Measurement) with the files of its job directory (verdict.json, sandbox.log:
written by the trusted parent on the node, never by the candidate), which the driver writes into its own run
directory, so the evidence is where a local run leaves it. A node must give jobs full isolation (bwrap + cgroup +
seccomp) unless the policy opts out with sandbox.isolation: none: the driver's preflight cannot see a node's.

Secrets never travel: a local instance this module starts is started with the secret-looking variables removed from
the environment its processes inherit, no runtime_env carries environment variables, and each task drops such
variables from its worker's environment before doing anything (the sandbox's own environment is an allowlist).

A private local instance ('local') runs its workers at the caller's priority (Ray's default is nice 15, which any
nice-0 load on the machine starves: the jobs are the user's foreground work, not background).

Resources: a gate job takes one GPU where the cluster has GPUs, else one CPU; a bench job takes a whole GPU (so no
other job shares its device while it times), or on a CPU-only cluster every CPU of the smallest node.

Failures: a job whose worker or node dies is run again by Ray up to policy cluster.retries times, then reported as
cluster.worker_lost; one that outlives cluster.job_timeout_s is cancelled and reported as cluster.timeout. gate_jobs
returns these as JobResults; the drop-ins raise ClusterError (a UserError: exit 2, it is the environment's failure,
never a verdict on the candidate).
"""
from __future__ import annotations

import os
import queue
import re
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from autokernel.deadline import Deadline
from autokernel.errors import UserError
from autokernel.policy import Policy

if TYPE_CHECKING:
    from autokernel.bench.measure import Measurement
    from autokernel.gate.verdict import Verdict

REASONS = ("cluster.worker_lost", "cluster.timeout", "cluster.error")
INSTALL = "pip install -e '.[ray]'"
SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|COOKIE|SESSION", re.I)
EVIDENCE_CAP = 16 << 20  # bytes of job-directory files one task brings back


class ClusterError(UserError):
    """A job the cluster could not run (worker lost, timed out): the environment's failure, exit 2."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass
class GateJob:
    """One candidate through gate.verify: its keyword arguments (shapes, seed, policy, run_dir, dtypes, dists,
    stages, kernels_dir) exactly as verify takes them. A job for a Ray cluster names its policy: the node checks
    that policy's isolation before anything runs (gate_on_node)."""
    op: str
    candidate: Path
    kwargs: dict = field(default_factory=dict)


@dataclass
class JobResult:
    ok: bool
    value: Any = None  # the Verdict (gate) or Measurement (bench) when ok
    reason: str | None = None  # one of REASONS when not ok
    detail: str = ""
    meta: dict = field(default_factory=dict)  # where and when it ran: node, pid, started, ended (node clock)


class Executor(Protocol):
    """Where gate and bench jobs run (Local: this machine's sandbox slots; RayCluster: Ray tasks). Its callers
    (autokernel verify, agent.evaluate.SandboxEvaluator) call these in place of gate.verify and bench.measure."""

    def verify(self, op: str, candidate: str | Path, **kw: Any) -> Verdict:
        """gate.verify(op, candidate, **kw), run here or on a node: the same Verdict, its evidence landed locally."""
        ...

    def measure(self, op: str, candidates: list[Path], cases: list[dict], policy: Policy, job_root: Path,
                incumbent: Path) -> Measurement:
        """bench.measure.measure with the same arguments: one benchmark at a time on a device."""
        ...

    def gate_jobs(self, jobs: list[GateJob]) -> list[JobResult]:
        """Many gate jobs at once, each result in order; a lost job is a JobResult, never an exception."""
        ...


def secret_names(env=os.environ) -> list[str]:
    """Environment variables that look like credentials (Ray's own RAY_* settings excepted)."""
    return sorted(k for k in env if SECRET.search(k) and not k.startswith("RAY_"))


@contextmanager
def _without_secrets():
    """os.environ without secret-looking variables for the block (a local Ray instance's processes inherit it)."""
    saved = {k: os.environ.pop(k) for k in secret_names()}
    try:
        yield
    finally:
        os.environ.update(saved)


def _ray():
    try:
        import ray
    except ImportError:
        raise UserError(f"--cluster / RAY_ADDRESS needs Ray, which is not installed: {INSTALL}") from None
    return ray


def connect(address: str | None, policy: Policy) -> "RayCluster | None":
    """The Ray cluster named by the argument, else RAY_ADDRESS, else policy cluster.address; None when none is."""
    address = address or os.environ.get("RAY_ADDRESS") or policy.cluster.address or None
    return RayCluster(address, policy) if address else None


def executor(address: str | None, policy: Policy) -> Executor:
    """Ray when an address is given (see connect), else local slots."""
    return connect(address, policy) or Local(policy)


class Local:
    """This machine: gate jobs in parallel, one per sandbox slot and pinned to it (autokernel/sandbox/slots.py:
    its GPU, its threads); benches one at a time, since two timings sharing the device would disturb each other."""

    def __init__(self, policy: Policy):
        from autokernel.sandbox.slots import default_slots
        self.policy, self.slots = policy, default_slots(policy.sandbox)
        self._bench = threading.Lock()

    def verify(self, op: str, candidate: str | Path, **kw: Any) -> Verdict:
        from autokernel.gate import verify
        return verify(op, candidate, **kw)

    def measure(self, op: str, candidates: list[Path], cases: list[dict], policy: Policy, job_root: Path,
                incumbent: Path) -> Measurement:
        from autokernel.bench.measure import measure
        with self._bench:
            return measure(op, candidates, cases, policy, job_root, incumbent=incumbent)

    def gate_jobs(self, jobs: list[GateJob]) -> list[JobResult]:
        from autokernel.sandbox.slots import pinned
        free: queue.Queue = queue.Queue()
        for slot in self.slots:
            free.put(slot)

        def one(job: GateJob) -> JobResult:
            slot = free.get()
            try:
                with pinned(slot):
                    t0 = time.time()
                    v = self.verify(job.op, job.candidate, **job.kwargs)
            finally:
                free.put(slot)
            return JobResult(True, v, meta={"node": "local", "pid": os.getpid(), "started": t0, "ended": time.time()})
        with ThreadPoolExecutor(max_workers=max(1, len(self.slots))) as pool:
            return list(pool.map(one, jobs))


class RayCluster:
    """Ray tasks on the cluster at `address` ('local' starts a private instance here; extra keyword arguments go to
    ray.init, e.g. num_cpus). Connects once; an already initialised Ray (a test's, a notebook's) is used as it is."""

    def __init__(self, address: str | None, policy: Policy, **init: Any):
        ray = _ray()
        self.policy = policy
        if not ray.is_initialized():
            kw = {"include_dashboard": False, "_system_config": {"worker_niceness": 0}, **init} \
                if address in (None, "local") else init
            try:
                _probe(address)
                with _without_secrets():
                    ray.init(address=None if address == "local" else address, **kw)
            except (OSError, RuntimeError, ValueError) as e:  # unreachable, refused, malformed
                raise UserError(f"cannot use the Ray cluster at {address!r} (--cluster / RAY_ADDRESS / policy "
                                f"cluster.address): {_first_line(e)}") from None
        self.resources = dict(ray.cluster_resources())
        self.node_cpus = [n["Resources"].get("CPU", 1.0) for n in ray.nodes() if n.get("Alive")]
        self._pool: ThreadPoolExecutor | None = None

    @property
    def pool(self) -> ThreadPoolExecutor:
        """Threads that wait on gate tasks, as many as the cluster runs at once (its GPUs, else its CPUs): the
        executor agent/workers.py submits gate jobs to, in place of the local slots."""
        if self._pool is None:
            width = int(self.resources.get("GPU", 0)) or int(self.resources.get("CPU", 1))
            self._pool = ThreadPoolExecutor(max_workers=max(1, width), thread_name_prefix="autokernel-ray")
        return self._pool

    def _options(self, kind: str) -> dict:
        return {**task_resources(kind, self.resources, self.node_cpus), "max_retries": self.policy.cluster.retries,
                "retry_exceptions": False}

    def gate_jobs(self, jobs: list[GateJob]) -> list[JobResult]:
        if any(k not in j.kwargs for j in jobs for k in ("policy", "run_dir", "kernels_dir")):
            raise ValueError("a gate job for the cluster names its policy, run_dir and kernels_dir (GateJob.kwargs), "
                             "as gate.verify's caller does")
        ray = _ray()
        task = ray.remote(gate_on_node).options(**self._options("gate"))
        refs = [task.remote(j.op, j.candidate.name, j.candidate.read_bytes(), _kernels(j.kwargs["kernels_dir"]),
                            {k: v for k, v in j.kwargs.items() if k not in ("run_dir", "kernels_dir")})
                for j in jobs]
        out = self._gather(refs, "gate")
        for job, res in zip(jobs, out):
            if res.ok:
                res.value = _land_verdict(job, res.value, res.meta.pop("evidence"))
        return out

    def verify(self, op: str, candidate: str | Path, **kw: Any) -> Verdict:
        res = self.gate_jobs([GateJob(op, Path(candidate), kw)])[0]
        if not res.ok:
            raise res.meta.get("exception") or ClusterError(res.reason or "cluster.error", f"gate job for {op} "
                                                            f"({Path(candidate).name}): {res.detail}")
        return res.value

    def measure(self, op: str, candidates: list[Path], cases: list[dict], policy: Policy, job_root: Path,
                incumbent: Path) -> Measurement:
        ray = _ray()
        incumbent = Path(incumbent)
        files = [(Path(c).name, Path(c).read_bytes()) for c in candidates]
        task = ray.remote(bench_on_node).options(**self._options("bench"))
        res = self._gather([task.remote(op, files, incumbent.read_bytes(), cases, policy)], "bench")[0]
        if not res.ok:  # IncumbentFailed and the like come back as raised by the trusted code on the node
            raise res.meta.get("exception") or ClusterError(res.reason or "cluster.error", f"bench job for {op}: "
                                                            f"{res.detail}")
        return _land_measurement(res.value, res.meta, Path(job_root), [Path(c) for c in candidates], incumbent)

    def _gather(self, refs: list, kind: str) -> list[JobResult]:
        """Every job's result, in order; a lost, cancelled or failed job becomes a JobResult, never an exception
        (except a UserError raised by the trusted code, e.g. a node's weak isolation: exit 2)."""
        ray = _ray()
        deadline = Deadline.after(self.policy.cluster.job_timeout_s)
        pending, out = list(refs), {}
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=deadline.left())
            if not done:
                for ref in pending:
                    ray.cancel(ref, force=True)
                    out[ref] = JobResult(False, None, "cluster.timeout", f"{kind} job not finished within "
                                         f"cluster.job_timeout_s = {self.policy.cluster.job_timeout_s:g} s; cancelled")
                break
            out[done[0]] = self._collect(ray, done[0], kind)
        return [out[r] for r in refs]

    def _collect(self, ray, ref, kind: str) -> JobResult:
        tries = self.policy.cluster.retries + 1
        try:
            value, meta = ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # the trusted code raised on the node
            cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else None
            if isinstance(cause, UserError):
                raise cause from None
            return JobResult(False, None, "cluster.error", f"{kind} job raised on its node: {_first_line(cause or e)}",
                             {"exception": cause})
        except ray.exceptions.TaskCancelledError:
            return JobResult(False, None, "cluster.timeout", f"{kind} job cancelled")
        except ray.exceptions.RayError as e:  # worker crashed, node died, object lost, Ray's OOM killer
            return JobResult(False, None, "cluster.worker_lost", f"{type(e).__name__} on each of {tries} attempt(s) "
                             f"(cluster.retries = {tries - 1}): {_first_line(e)}")
        return JobResult(True, value, meta=meta)


def _probe(address: str | None, timeout_s: float = 10.0) -> None:
    """ConnectionError now if a host:port address (ray:// or a GCS) takes no TCP connection: Ray itself keeps
    retrying an unreachable address for minutes. Other forms ('auto', None, 'local') are left to Ray."""
    import socket
    m = re.fullmatch(r"(?:ray://)?\[?([^\]/]+?)\]?:(\d+)/?", address or "")
    if m:
        socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout_s).close()


def task_resources(kind: str, resources: dict, node_cpus: list[float]) -> dict:
    """What one Ray task of `kind` asks for: a GPU each where the cluster has GPUs (a bench owns its device, no job
    shares it), else one CPU for a gate job and a whole node's CPUs (the smallest node's) for a bench."""
    if resources.get("GPU", 0) >= 1:
        return {"num_gpus": 1, "num_cpus": 1}
    if kind == "bench":
        return {"num_cpus": max(1.0, min(node_cpus or [1.0]))}
    return {"num_cpus": 1}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def _kernels(kernels_dir) -> dict[str, bytes]:
    """The target checkout's kernels/*.py (the signature the gate checks, the engine's other kernels in the
    end-to-end stage), shipped so that a node needs no copy of the checkout."""
    from autokernel import paths  # each a regular file inside the checkout (trust rule 6), else exit 2
    root = Path(kernels_dir).absolute().parent
    return {p.name: paths.read_bytes(p, root) for p in sorted(Path(kernels_dir).glob("*.py"))}


# --- on the node: trusted code in the Ray worker, which starts the sandbox there ------------------------------------

def _node_start() -> dict:
    """Drop secret-looking variables from this worker's environment first; return the job's metadata."""
    seen = secret_names()
    for k in seen:
        os.environ.pop(k, None)
    try:
        import ray
        node = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 -- called outside Ray (tests): the host name is as good
        import socket
        node = socket.gethostname()
    return {"node": node, "pid": os.getpid(), "started": time.time(), "secrets_in_worker_env": seen}


def _node_tmp() -> Path:
    """A private temporary directory for one job, autokernel-cluster-<worker pid>-*. A worker killed mid-job never
    removes its own, so each worker process first removes those of workers that are gone (as sandbox.run does)."""
    from autokernel.sandbox.orphans import sweep_once
    sweep_once("autokernel-cluster", [Path(tempfile.gettempdir())])
    return Path(tempfile.mkdtemp(prefix=f"autokernel-cluster-{os.getpid()}-"))


def _evidence(root: Path) -> dict[str, bytes]:
    """The regular files under `root` (written by the trusted parent on the node), up to EVIDENCE_CAP bytes."""
    out, total = {}, 0
    for p in sorted(root.rglob("*")):
        if p.is_symlink() or not p.is_file():
            continue
        size = p.stat().st_size
        if total + size > EVIDENCE_CAP:
            continue
        out[str(p.relative_to(root))] = p.read_bytes()
        total += size
    return out


def _preflight(policy: Policy) -> None:
    """This node must isolate jobs fully (its isolation is not the driver's), unless the policy opted out."""
    from autokernel import sandbox
    try:
        sandbox.preflight(policy.sandbox, untrusted_author=True)
    except UserError as e:
        import socket
        raise UserError(f"cluster node {socket.gethostname()}: {e}") from None


def gate_on_node(op: str, name: str, source: bytes, kernels: dict, kw: dict) -> tuple:
    """gate.verify on this node, in a private temporary directory: (Verdict, meta with the job dir's evidence)."""
    meta = _node_start()
    from autokernel.gate import verify
    _preflight(kw["policy"])  # RayCluster.gate_jobs sends only jobs that name their policy
    tmp = _node_tmp()
    try:
        kdir = tmp / "kernels"  # the driver's checkout's, shipped (_kernels)
        kdir.mkdir()
        for k, data in kernels.items():
            (kdir / Path(k).name).write_bytes(data)
        (tmp / "candidate").mkdir()
        cand = tmp / "candidate" / Path(name).name
        cand.write_bytes(source)
        v = verify(op, cand, run_dir=tmp / "run", kernels_dir=kdir, **kw)
        meta["ended"] = time.time()
        meta["evidence"] = _evidence(Path(v.run_dir or tmp / "run"))  # the verdict records the run_dir it was given
        return v, meta
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_on_node(op: str, files: list, incumbent: bytes, cases: list, policy: Policy) -> tuple:
    """bench.measure on this node (the device is this task's alone): (Measurement, meta with the evidence)."""
    meta = _node_start()
    from autokernel.bench.measure import measure
    _preflight(policy)
    tmp = _node_tmp()
    try:
        paths = []
        for i, (name, data) in enumerate(files):
            (tmp / f"c{i}").mkdir()
            paths.append(tmp / f"c{i}" / Path(name).name)
            paths[-1].write_bytes(data)
        (tmp / "incumbent").mkdir()
        inc = tmp / "incumbent" / f"{op}.py"
        inc.write_bytes(incumbent)
        m = measure(op, paths, cases, policy, tmp / "job", incumbent=inc)
        meta["ended"] = time.time()
        meta["evidence"] = _evidence(tmp / "job")
        meta["job_root"] = str(tmp / "job")
        return m, meta
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- back on the driver: the evidence lands in the run directory, paths name the driver's files --------------------

def _write_evidence(root: Path, evidence: dict[str, bytes]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    base = root.resolve()
    for rel, data in evidence.items():
        dest = (root / rel).resolve()
        if base not in dest.parents:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)


def _land_verdict(job: GateJob, v, evidence: dict[str, bytes]):
    root = Path(job.kwargs["run_dir"]) / f"{job.op}-{v.candidate_sha256[:12]}"  # the caller's, as gate.verify's
    _write_evidence(root, evidence)
    v.candidate, v.run_dir = str(job.candidate), str(root)
    v.write(root / "verdict.json")
    return v


def _land_measurement(m, meta: dict, job_root: Path, candidates: list[Path], incumbent: Path):
    """The node's temporary paths replaced by the driver's: files by position (the incumbent first), job
    directories by prefix."""
    _write_evidence(job_root, meta.pop("evidence"))
    for f, path in zip(m.files, [incumbent, *candidates]):
        f.path = str(path)
    node_root = meta.pop("job_root")
    m.job_dirs = [str(job_root) + d[len(node_root):] if d.startswith(node_root) else d for d in m.job_dirs]
    return m
