"""How `autokernel run --cluster` reaches the cluster, without Ray: the evaluator sends its gate and bench jobs to the
executor (and never to this machine's gate or bench), run.context wires the cluster into the evaluator and the
workers' gate pool, and a bench job's files and paths travel to the node and back."""
from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest
from agent_helpers import GOOD
from rich.console import Console

import autokernel.bench.measure as bench_measure
from autokernel import cluster, gate, paths
from autokernel.agent.evaluate import SandboxEvaluator
from autokernel.bench.measure import FileResult, Measurement
from autokernel.candidate import Candidate
from autokernel.cli import run as run_cli
from autokernel.gate.verdict import StageResult, Verdict
from autokernel.policy import Policy
from autokernel.sandbox import orphans

ROOT = Path(__file__).parents[2]


class FakeCluster:
    """An Executor (autokernel/cluster.py) that records what it is asked to run; accepts every candidate with a 2x
    win."""

    def __init__(self):
        self.calls, self.pool = [], object()

    def verify(self, op, path, **kw):
        self.calls.append(("verify", op, Path(path), kw))
        sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        return Verdict(op, str(path), sha, "accepted", [StageResult.ok("static", "parsed")], seed=1,
                       device={"kind": "cpu-interpreter"}, elapsed_s=0.1)

    def measure(self, op, candidates, cases, policy, job_root, incumbent=None):
        self.calls.append(("measure", op, list(candidates), Path(job_root)))
        from autokernel.bench.stats import Interval
        inc = FileResult(str(incumbent), "incumbent", "ok")
        cand = FileResult(str(candidates[0]), "candidate", "ok", speedup=Interval(2.0, 1.9, 2.1), accepted=True)
        return Measurement(op, "CPU / Triton interpreter", {}, None, {}, [inc, cand], [], "bwrap")

    def gate_jobs(self, jobs):
        return [cluster.JobResult(True, self.verify(j.op, j.candidate, **j.kwargs)) for j in jobs]


@pytest.fixture
def no_local_jobs(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("a job ran on this machine instead of the cluster")
    monkeypatch.setattr(gate, "verify", refuse)
    monkeypatch.setattr(bench_measure, "measure", refuse)


def test_evaluator_sends_gate_and_bench_to_the_cluster(tmp_path, no_local_jobs):
    fake = FakeCluster()
    ev = SandboxEvaluator(tmp_path, Policy(), executor=fake, layout=paths.Layout(ROOT))
    fb = ev.evaluate(Candidate.of("rmsnorm", GOOD))
    assert fb.accepted and fb.speedup == 2.0
    assert [c[0] for c in fake.calls] == ["verify", "measure"]
    assert fake.calls[0][3]["kernels_dir"] == ROOT / "kernels" and fake.calls[1][2][0].read_text() == GOOD
    ev.confirm(Candidate.of("rmsnorm", GOOD))  # the confirming benchmark too
    assert [c[0] for c in fake.calls] == ["verify", "measure", "measure"]


def test_run_context_wires_the_cluster(monkeypatch, tmp_path):
    fake = FakeCluster()
    seen = []
    monkeypatch.setattr(cluster, "connect", lambda address, policy: seen.append(address) or fake)
    ctx = run_cli.context(agent="search", model=None, base_url=None, repo=ROOT, policy_file=None,
                          console=Console(file=io.StringIO()), cluster="ray://head:10001")
    assert seen == ["ray://head:10001"] and ctx.executor is fake.pool  # agent/workers.py gates on the cluster
    ev = ctx.make_evaluator(tmp_path, ctx.policy, None, ctx.layout)
    assert ev.executor is fake


def test_bench_job_files_travel_to_the_node_and_paths_come_back(monkeypatch, tmp_path):
    seen = {}

    def node_measure(op, candidates, cases, policy, job_root, incumbent=None):  # what runs on the node
        seen.update(candidates=[Path(c).read_text() for c in candidates], incumbent=Path(incumbent).read_text())
        (Path(job_root) / "r0").mkdir(parents=True)
        (Path(job_root) / "r0" / "sandbox.log").write_text("timed")
        files = [FileResult(str(incumbent), "incumbent", "ok"), FileResult(str(candidates[0]), "candidate", "ok")]
        return Measurement(op, "cpu", {}, None, {}, files, [str(Path(job_root) / "r0")], "bwrap")

    monkeypatch.setattr(bench_measure, "measure", node_measure)
    monkeypatch.setattr(cluster, "_preflight", lambda policy: None)
    m, meta = cluster.bench_on_node("rmsnorm", [("rmsnorm.py", GOOD.encode())], b"# incumbent\n", [], Policy())
    assert seen == {"candidates": [GOOD], "incumbent": "# incumbent\n"}
    assert not Path(meta["job_root"]).exists()  # the node's temporary directory is gone
    cand, inc, job_root = tmp_path / "c" / "rmsnorm.py", tmp_path / "inc.py", tmp_path / "bench"
    m = cluster._land_measurement(m, meta, job_root, [cand], inc)
    assert [f.path for f in m.files] == [str(inc), str(cand)] and m.job_dirs == [str(job_root / "r0")]
    assert (job_root / "r0" / "sandbox.log").read_text() == "timed"


def test_secret_names_and_their_removal(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    monkeypatch.setenv("GITHUB_TOKEN", "y")
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    names = cluster.secret_names()
    assert {"OPENAI_API_KEY", "GITHUB_TOKEN"} <= set(names) and "RAY_ADDRESS" not in names
    with cluster._without_secrets():
        assert "OPENAI_API_KEY" not in os.environ
    assert os.environ["OPENAI_API_KEY"] == "x"  # the driver keeps its own


def test_a_killed_workers_job_directory_is_swept(monkeypatch, tmp_path):
    monkeypatch.setattr(cluster.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(orphans, "_swept", set())  # as in a fresh worker process
    dead = tmp_path / "autokernel-cluster-999999999-abc"  # no such pid: its worker is gone
    live = tmp_path / f"autokernel-cluster-{os.getpid()}-def"
    dead.mkdir(), live.mkdir()
    new = cluster._node_tmp()
    assert new.parent == tmp_path and new.name.startswith(f"autokernel-cluster-{os.getpid()}-")
    assert not dead.exists() and live.exists()


def test_local_gate_jobs_run_one_per_slot_pinned(monkeypatch, tmp_path):
    import threading
    import time

    from autokernel.sandbox.slots import pinned_env
    lock, running, seen = threading.Lock(), [0], []

    def fake_verify(op, path, **kw):
        with lock:
            running[0] += 1
            seen.append((running[0], pinned_env().get("OMP_NUM_THREADS")))
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return Path(path).name

    monkeypatch.setattr(gate, "verify", fake_verify)
    local = cluster.Local(Policy(sandbox={"slots": 2}))
    out = local.gate_jobs([cluster.GateJob("rmsnorm", tmp_path / f"c{i}.py") for i in range(4)])
    assert [r.value for r in out] == [f"c{i}.py" for i in range(4)] and all(r.ok for r in out)
    assert max(n for n, _ in seen) <= 2 and all(threads for _, threads in seen)  # one per slot, each pinned


def test_an_unreachable_address_fails_fast_not_after_rays_retries():
    for address in ("127.0.0.1:1", "ray://127.0.0.1:1", "ray://[::1]:1/"):
        with pytest.raises(OSError):
            cluster._probe(address, timeout_s=5)
    for address in ("auto", "local", None):  # left to Ray
        cluster._probe(address)
