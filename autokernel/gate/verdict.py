"""What the gate says about one candidate: a plain, JSON-able value written next to the candidate's work dir.

Every rejection carries a stable reason code and a one-line detail (docs/design.md trust rule 4); the agent is shown the
same text a person would read.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

# Stable reason codes, by stage. Adding one is fine; renaming one breaks whoever keys on it (agent prompts, tests).
REASONS = {
    "static.syntax": "the file does not parse",
    "static.signature": "the public launcher is missing, or its parameters differ from kernels/<op>.py",
    "static.no_triton_kernel": "no @triton.jit kernel, or the launcher never launches one (kernel[grid](...))",
    "static.forbidden_import": "imports anything but torch, triton, triton.language as tl and math (allowlist)",
    "static.forbidden_call": "calls what the grammar does not allowlist: torch compute or data reads outside the "
                             "kernel, builtins like getattr/exec/open, a called variable, code run at import",
    "static.forbidden_attribute": "an attribute or name outside the allowlist: dunders, private attributes, module "
                                  "internals (torch.os, triton.runtime), .handle/.data in kernels, stored methods, "
                                  "device facts",
    "static.mutable_state": "state that outlives a call: mutable module objects, global, attribute stores, mutable "
                            "defaults, names bound twice",
    "static.forbidden_syntax": "a construct outside the kernel-file grammar: classes, helper or nested defs, "
                               "lambdas other than grids, with, while in the launcher, comprehensions, break",
    "static.precision": "a precision switch or a narrow float dtype named outside a comparison (tf32, fp16/bf16)",
    "static.fallback": "try/except or try/finally: a failure must surface, not fall back",
    "static.shape_special_case": "a shape compared for equality with a literal (other than 0/1) outside an assert, "
                                 "or the grid's size (tl.num_programs) in a decision",
    "runtime.exception": "the candidate raised (at import or in a call)",
    "runtime.bad_launcher": "the launcher is not a plain function defined in the candidate file",
    "runtime.no_triton_launch": "a checked call launched none of the candidate's own Triton kernels",
    "runtime.torch_compute": "torch ran compute (not allocation/view/copy) during a call or at import",
    "runtime.global_state": "torch flags, RNG state, patched functions or trusted modules changed",
    "runtime.thread": "the candidate started a thread",
    "runtime.out_of_bounds": "a call wrote outside the memory of its inputs and of the tensors it allocated (guard "
                             "bytes around each changed)",
    "runtime.false_hint": "a compiler hint (tl.multiple_of, tl.max_contiguous, tl.max_constancy) was false for the "
                          "values it was applied to: the interpreter ignores it, a compiled kernel relies on it",
    "runtime.incomplete": "the job did not return every call the gate asked for (or returned ones it did not ask for)",
    "numeric.bad_output": "output is not a plain torch.Tensor of the reference's count, shape, dtype and layout",
    "numeric.aliasing": "output shares storage with an input or with an earlier call's output",
    "numeric.input_mutated": "an input's storage changed during the call",
    "numeric.unwritten": "output elements still hold the allocation poison: never written",
    "numeric.nonfinite": "NaN/Inf where the float64 reference is finite",
    "numeric.mismatch": "error vs the float64 reference above the derived tolerance",
    "numeric.nondeterministic": "two calls on equal inputs gave different bits",
    "numeric.caching": "wrong after the inputs were refilled in place with new values (output cache / replay)",
    "numeric.no_cases": "no shape of the op could be checked",
    "numeric.budget": "the case plan is larger than a verdict may run (bounded work: docs/design.md)",
    "coverage.unreached": "a block the numeric stage never ran, a condition never seen both true and false, or a "
                          "min/max that never picked each side, after cases steered at it (gate/coverage.py)",
    "e2e.kl_exceeded": "KL(baseline || candidate) on the live model above the policy (autokernel.gate.e2e)",
    "e2e.top1": "top-1 agreement with the baseline below the policy",
    "e2e.degenerate_repetition": "one token repeated where the baseline did not (a race's signature)",
    "e2e.bad_output": "the candidate engine returned logits of the wrong shape",
    "e2e.engine_error": "a target's engine with the candidate swapped in raised, or its job failed "
                        "(autokernel/target/e2e.py)",
    "e2e.call_mismatch": "one of the candidate's calls in the live engine (production's arguments) fails the numeric "
                         "judge",
    "e2e.unreached": "a target's engine with the candidate swapped in never called the candidate's launchers: the "
                     "end-to-end comparison would say nothing about it (autokernel/target/e2e.py)",
    "sandbox.timeout": "the sandboxed job ran past its wall-clock limit",
    "sandbox.oom": "the sandboxed job ran out of memory",
    "sandbox.crash": "the sandboxed process died",
    "sandbox.error": "the trusted harness inside the sandbox failed",
    "sandbox.no_isolation": "isolation was required and is not available",
}


@dataclass
class StageResult:
    name: str  # static | runtime | numeric | e2e | ...
    passed: bool
    reason: str | None = None  # a stable code from REASONS (or the stage's own family) when not passed
    detail: str = ""  # one line for people and for the agent
    metrics: dict[str, Any] = field(default_factory=dict)  # JSON-able numbers and small lists
    elapsed_s: float = 0.0

    @classmethod
    def ok(cls, name: str, detail: str = "", **metrics: Any) -> "StageResult":
        return cls(name, True, None, detail, metrics)

    @classmethod
    def fail(cls, name: str, reason: str, detail: str, **metrics: Any) -> "StageResult":
        return cls(name, False, reason, detail, metrics)


@dataclass
class Verdict:
    op: str
    candidate: str  # path as given
    candidate_sha256: str
    verdict: Literal["accepted", "rejected"]
    stages: list[StageResult]
    seed: int | None  # revealed only after the candidate's process is gone; reruns with --seed reproduce
    device: dict[str, Any]
    elapsed_s: float
    run_dir: str | None = None

    @property
    def accepted(self) -> bool:
        return self.verdict == "accepted"

    @property
    def failure(self) -> StageResult | None:
        return next((s for s in self.stages if not s.passed), None)

    @property
    def reason(self) -> str | None:
        f = self.failure
        return f.reason if f else None

    @property
    def detail(self) -> str:
        f = self.failure
        return f.detail if f else ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["reason"] = self.reason
        d["detail"] = self.detail
        return d

    def to_json(self) -> str:
        """verify --json and verdict.json: every string stripped of control characters (autokernel.untrusted.data:
        a detail may quote the candidate's exception text)."""
        from autokernel.untrusted import data
        return json.dumps(data(self.to_dict()), indent=2)

    def write(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        stages = [StageResult(**s) for s in d["stages"]]
        keep = {k: d[k] for k in ("op", "candidate", "candidate_sha256", "verdict", "seed", "device", "elapsed_s",
                                  "run_dir") if k in d}
        return cls(stages=stages, **keep)
