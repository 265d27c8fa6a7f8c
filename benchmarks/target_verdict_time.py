"""A thorough verdict's time for a Liger-Kernel op in the Hugging Face Llama target vs for autokernel's own rmsnorm,
stage by stage (issue 26's benchmark): `python benchmarks/target_verdict_time.py [DIR] [--ops rms_norm,rope,swiglu]`.

DIR: a checkout from examples/liger/make_checkout.sh with examples/liger/autokernel.toml copied in (default: one built
into a temporary directory). Each Liger op's incumbent file is judged as `autokernel verify --repo DIR OP FILE`
judges it (autokernel/target/gate.py: the workload recorded, every launcher, the sweep, the reach past the CPU cap,
the end-to-end stage with the candidate's calls judged), and kernels/rmsnorm.py as `autokernel verify rmsnorm FILE`
does, both under the default policy. Prints the device and versions, then per verdict its stages' seconds and case
counts. Without CUDA every figure is a Triton-interpreter (CPU) time and says so. Figures, not a test: nothing here
asserts.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import shutil
import tempfile
from pathlib import Path

from autokernel import device

device.ensure_interpreter()  # before triton is imported
HERE = Path(__file__).resolve().parents[1]


def checkout(arg: str | None) -> Path:
    """DIR, else the example's checkout built as benchmarks/profile_hook_overhead.py builds it, with the example's
    completed declaration copied in."""
    if arg is not None:
        return Path(arg).resolve()
    from profile_hook_overhead import checkout as build  # this script's folder is on sys.path when run as a script
    ck = build(None)
    shutil.copy(HERE / "examples/liger/autokernel.toml", ck / "autokernel.toml")
    return ck


def show(title: str, v, clock: str) -> None:
    print(f"{title}: {v.verdict}{'' if v.accepted else ' (' + str(v.reason) + ')'} in {v.elapsed_s:.1f} s ({clock})")
    for s in v.stages:
        m = s.metrics or {}
        extra = {k: m[k] for k in ("cases", "calls", "jobs", "calls_judged", "tokens", "positions") if k in m}
        print(f"  {s.name:<8} {s.elapsed_s:8.1f} s  {'ok' if s.passed else s.reason}  {extra}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--ops", default="rms_norm")
    args = ap.parse_args()
    from autokernel import paths
    from autokernel.gate import verify
    from autokernel.policy import Policy
    from autokernel.target import declaration as decl
    from autokernel.target import gate as target_gate
    clock = "CUDA" if device.is_cuda() else "CPU / Triton interpreter"
    fp = device.fingerprint()
    print(f"device: {fp.get('gpu') or fp.get('cpu') or fp.get('kind')} · torch {md.version('torch')} · triton "
          f"{md.version('triton')} · liger-kernel {md.version('liger-kernel')} · transformers "
          f"{md.version('transformers')} · {os.cpu_count()} cores")
    ck = checkout(args.dir)
    d = decl.load(ck)
    assert d is not None, f"{ck}: no autokernel.toml"
    for op in args.ops.split(","):
        incumbent = ck / d.ops[op].file
        copy = Path(tempfile.mkdtemp(prefix="ak-cand-")) / incumbent.name
        copy.write_bytes(incumbent.read_bytes())
        show(f"Liger {op} ({d.ops[op].file})", target_gate.verify(ck, op, copy, policy=Policy()), clock)
    layout = paths.target()  # where `autokernel verify` would put its run directory
    show("autokernel rmsnorm (kernels/rmsnorm.py)", verify("rmsnorm", HERE / "kernels/rmsnorm.py",
                                                           run_dir=layout.run_dir("verify", "rmsnorm"),
                                                           kernels_dir=HERE / "kernels"), clock)


if __name__ == "__main__":
    main()
