"""The end-to-end stage of a target op (autokernel/target/e2e.py): besides the KL of the engine's next-token
distributions, the candidate's own calls in the live engine (production's arguments: real activations, the engine's
layouts) are judged against the checkout's reference (autokernel/target/capture.py), and an engine that never runs
the candidate's launchers is refused instead of passed with a KL of zero.

The toy checkout of tests/target/test_target_gate.py: an rmsnorm without weight over rows of an embedding table.
"""
import textwrap

import pytest
from test_target_gate import NORM, checkout

from autokernel.cli.verify import verify_command
from autokernel.policy import Policy
from autokernel.target import e2e as target_e2e
from autokernel.target import gate as target_gate


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


# gate.max_rows at the interpreter's cap: the calls past it (numeric._reach) are tests/gate/test_gate_defence.py's
POLICY = Policy.model_validate({"gate": {"max_rows": 1024}})


SERVE_EPS = 5e-3  # what the engine's logits() passes; its profiled workload sent 1e-5 (the gate draws 1e-6..1e-4)


def _engine_serving_another_eps(root) -> None:
    engine = root / "toyt/engine.py"
    text = engine.read_text()
    assert "self.logits([ids])\n" in text and "norm(self.emb[torch.tensor(row)], 1e-5)" in text
    engine.write_text(text.replace("self.logits([ids])\n", "norm(self.emb[torch.tensor(ids)], 1e-5)\n")
                      .replace("torch.tensor(row)], 1e-5)", f"torch.tensor(row)], {SERVE_EPS})"))


def test_a_kernel_wrong_only_on_production_calls_is_rejected_end_to_end(tmp_path, monkeypatch):
    """The candidate adds 1e7 * eps^5 to eps: below a float32 ulp of every case the gate draws (eps within 10x of
    the 1e-5 the workload sent), 3e-5 at the eps the engine serves with: 1.6e-5 off in every output, far beyond
    float32's error, far below what the KL limits notice. Judging the candidate's own calls in the engine rejects it;
    without them the KL passes it."""
    root = checkout(tmp_path / "co")
    _engine_serving_another_eps(root)
    path = tmp_path / "norm.py"
    old = "r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)"
    assert old in NORM
    path.write_text(textwrap.dedent(NORM.replace(old, "r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + "
                                                      "(eps + 1e7 * eps * eps * eps * eps * eps))")))
    v = target_gate.verify(root, "norm", path, policy=POLICY, seed=5)
    assert [s.name for s in v.stages] == ["static", "runtime", "numeric", "e2e"], [(s.name, s.detail) for s in v.stages]
    assert v.failure is not None and v.failure.reason == "e2e.call_mismatch", (v.failure and v.failure.detail)
    assert "norm call" in v.failure.detail and "numeric.mismatch" in v.failure.detail, v.failure.detail
    monkeypatch.setattr(target_e2e, "_judge_calls", lambda *a: (0, ""))  # the defence off: the KL alone passes it
    v = target_gate.verify(root, "norm", path, policy=POLICY, seed=5)
    assert v.accepted, [(s.name, s.reason, s.detail) for s in v.stages]


def test_the_incumbents_calls_in_the_engine_pass(tmp_path):
    root = checkout(tmp_path / "co")
    _engine_serving_another_eps(root)
    r = target_e2e.check(root, *target_gate.declared_op(root, "norm"), _copy(root / "toyt/ops/norm.py", tmp_path),
                         Policy())
    assert r.passed and r.metrics["calls_judged"] >= 1 and r.metrics["kl_max"] == 0.0, (r.reason, r.detail)


BYPASS = '''
import os

import toyt.ops.norm as norm_module

# a compiled path used only when the op's file is the one it was built from (a stale cache, a worker process that
# imports its own copy): a rewritten file never reaches it
FRESH = os.path.dirname(os.path.abspath(norm_module.__file__)) == os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "ops")


def _norm(x, eps):
    if FRESH:
        return norm_module.norm(x, eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
'''


def test_a_candidate_the_engine_never_runs_is_not_passed(tmp_path):
    """An engine that runs its own kernels but not a rewritten file: the KL compares the engine with itself, so the
    stage fails (e2e.unreached) instead of passing a candidate it never ran (here one that is plainly wrong)."""
    root = checkout(tmp_path / "co")
    engine = root / "toyt/engine.py"
    text = engine.read_text()
    assert "from toyt.ops.norm import norm\n" in text and "norm(self.emb" in text
    engine.write_text(text.replace("from toyt.ops.norm import norm\n", BYPASS)
                      .replace("norm(self.emb", "_norm(self.emb"))
    wrong = tmp_path / "norm.py"
    wrong.write_text(textwrap.dedent(NORM.replace("(x * r).to(", "(x * r * 1.5).to(")))
    r = target_e2e.check(root, *target_gate.declared_op(root, "norm"), _copy(wrong, tmp_path), Policy())
    assert not r.passed and r.reason == "e2e.unreached", (r.reason, r.detail)


def test_an_engine_whose_logits_never_call_the_op_is_bad_input(tmp_path, capsys):
    """workload() calls the launcher (so the gate has cases) but logits() never does: the end-to-end stage could not
    tell any candidate from the incumbent, so verify stops with exit 2 naming what to fix."""
    root = checkout(tmp_path / "co")
    engine = root / "toyt/engine.py"
    text = engine.read_text()
    assert "self.logits([ids])\n" in text
    engine.write_text(text.replace("[norm(self.emb", "[(lambda x, e: x)(self.emb")
                      .replace("self.logits([ids])\n", "norm(self.emb[torch.tensor(ids)], 1e-5)\n"))
    policy = tmp_path / "policy.yaml"
    policy.write_text("gate:\n  max_rows: 1024\n")
    assert verify_command("norm", root / "toyt/ops/norm.py", seed=5, policy_file=policy, repo=root) == 2
    err = capsys.readouterr().err
    assert "never called norm" in err and len(err.strip().splitlines()) == 1, err


def _copy(src, tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    (d / "norm.py").write_bytes(src.read_bytes())
    return d / "norm.py"


def test_nan_logits_from_the_candidate_engine_fail_the_kl_check(tmp_path, monkeypatch):
    """Every comparison with NaN is false: `kl > limit` passed a candidate whose engine made its logits NaN (KL NaN).
    The stage now passes only what is within every limit."""
    import torch

    from autokernel.target import declaration as decl
    root = checkout(tmp_path / "t")
    d = decl.load(root)
    assert d is not None
    op = d.ops["norm"]
    logits = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    common = {"prompts": [[1]], "prefixes": [[1], [1, 2], [1, 2, 3]], "steps": 8, "calls": 3, "captured": b"",
              "unloadable": 0}
    base = {**common, "logits": logits, "tokens": [[1, 2, 3, 4, 5, 6, 7, 8]]}
    runs = iter([(base, ""), ({**base, "logits": torch.full_like(logits, float("nan"))}, "")])
    monkeypatch.setattr(target_e2e, "_run", lambda *a, **k: next(runs))
    monkeypatch.setattr(target_e2e, "_judge_calls", lambda *a, **k: (3, ""))
    cand = tmp_path / "cand" / "norm.py"
    cand.parent.mkdir()
    cand.write_text(NORM)
    r = target_e2e.check(root, d, op, cand, Policy())
    assert not r.passed and r.reason == "e2e.kl_exceeded", (r.reason, r.detail)


@pytest.mark.parametrize("attack", ["expanded_logits", "huge_count"])
def test_what_the_engine_job_returns_is_bounded_data(tmp_path, monkeypatch, attack):
    """The checkout's engine returns the end-to-end job's data. A stride-0 view of one element as (rows, 2**40)
    arrived in a few bytes and made the parent allocate 211 TB (a traceback); a launcher count of 87 digits carried
    CI's token, decimal-encoded, into the accepted verdict and the commit message. Both are refused as malformed."""
    import io

    import torch

    from autokernel import sandbox
    from autokernel.target import declaration as decl
    root = checkout(tmp_path / "t")
    d = decl.load(root)
    assert d is not None
    op = d.ops["norm"]
    buf = io.BytesIO()
    logits = torch.zeros(1).expand(3, 1 << 40) if attack == "expanded_logits" else torch.zeros(3, 16)
    torch.save(logits, buf)
    count = 10 ** 86 if attack == "huge_count" else 3
    data = {"prompts": [[1]], "prefixes": [[1], [1, 2], [1, 2, 3]], "tokens": [[1, 2]], "steps": 2,
            "logits": buf.getvalue(), "calls": {op.launchers[0]: count}, "captured": b"", "unloadable": 0}
    monkeypatch.setattr(sandbox, "run", lambda *a, **k: sandbox.SandboxResult(True, None, "", data))
    out, why = target_e2e._run(root, d, op, POLICY, tmp_path / "job", 2)
    assert out is None and why, why
    assert ("expanded view" in why) if attack == "expanded_logits" else ("launcher counts" in why), why
