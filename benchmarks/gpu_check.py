"""The CUDA check: kernel tests compiled, every op's kernel timed against its torch reference, the sandboxed bench.

    python benchmarks/gpu_check.py [--skip-tests] [--ops rmsnorm,matmul]

On a CUDA machine, in well under 5 minutes:
1. the per-op kernel tests (`pytest tests/kernels -k matches_reference`: every op, dtype and model or odd shape
   against the float64 reference, judged as the gate judges) with TRITON_INTERPRET=0, so the kernels are compiled,
   not interpreted (time-capped); the other kernel tests build their edge cases on the CPU and stay interpreter-only;
2. for every op in autokernel.ops.OPS at its model shapes, random inputs and weights from the trusted spec: the
   kernel's and the torch reference's median time (triton.testing.do_bench, which flushes L2 between calls),
   achieved GB/s, GFLOP/s and % of the device's roofline (autokernel.bench.roofline); ops whose spec or kernel is not
   written yet are skipped with a message;
3. one sandboxed `autokernel bench rmsnorm` of the incumbent against a copy of itself (CUDA events, interleaved),
   which exercises the sandbox with the GPU device nodes and the CUDA timing path.
On a machine without CUDA it says so and exits 0.
"""
from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TEST_TIMEOUT_S = 180
BENCH_MS = 100  # do_bench's measuring time per call site


def run_kernel_tests() -> int:
    env = dict(os.environ, TRITON_INTERPRET="0")  # tests/conftest.py only sets "1" when unset
    print(f"== pytest tests/kernels -k matches_reference (compiled, TRITON_INTERPRET=0, cap {TEST_TIMEOUT_S} s)",
          flush=True)
    t0 = time.time()
    try:
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "tests/kernels", "-k", "matches_reference"],
                            cwd=ROOT, env=env, timeout=TEST_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        print(f"   pytest did not finish within {TEST_TIMEOUT_S} s")
        return 1
    print(f"   pytest exit code {rc} in {time.time() - t0:.0f} s", flush=True)
    return rc


def bench_ops(ops: list[str]) -> None:
    import torch
    import triton.testing

    from autokernel import device
    from autokernel.bench import roofline
    from autokernel.ops import get

    fp = device.fingerprint()
    peak = roofline.peak_for(fp)
    dtype = device.default_dtype()
    print(f"== ops vs torch reference on {fp.get('gpu')} ({dtype}); peak "
          + (f"{peak.name}: {peak.gbps:g} GB/s, {peak.tflops_for(dtype):g} TFLOP/s" if peak else "unknown"))
    head = f"{'op':<18}{'shape':<36}{'kernel ms':>10}{'torch ms':>10}{'speedup':>9}{'GB/s':>9}{'GFLOP/s':>10}" \
           f"{'% peak':>8}"
    print(head)
    for op in ops:
        try:
            spec = get(op)
            launcher = getattr(importlib.import_module(f"kernels.{op}"), op)
        except (ImportError, AttributeError, KeyError) as e:
            print(f"{op:<18}skipped: not written yet ({type(e).__name__}: {e})")
            continue
        for shape in spec.model_shapes:
            try:
                kw = spec.make_inputs(dict(shape), dtype, "cuda", torch.Generator().manual_seed(0))
                launcher(**kw)  # compile outside the timing
                k_ms = triton.testing.do_bench(lambda launcher=launcher, kw=kw: launcher(**kw),
                                               rep=BENCH_MS, return_mode="median")
                r_ms = triton.testing.do_bench(lambda spec=spec, kw=kw: spec.reference(**kw),
                                               rep=BENCH_MS, return_mode="median")
            except Exception as e:  # noqa: BLE001 -- one broken op must not hide the others
                print(f"{op:<18}{str(dict(shape)):<36} failed: {type(e).__name__}: {str(e)[:120]}")
                continue
            flops, nbytes = spec.flops(dict(shape)), spec.bytes_moved(dict(shape), dtype)
            floor = roofline.floor_ms(flops, nbytes, dtype, peak) if peak else None
            pct = f"{100 * floor / k_ms:7.1f}%" if floor else "       ?"
            print(f"{op:<18}{str(dict(shape)):<36}{k_ms:10.4f}{r_ms:10.4f}{r_ms / k_ms:9.2f}"
                  f"{nbytes / k_ms / 1e6:9.1f}{flops / k_ms / 1e6:10.1f}{pct}", flush=True)


def sandboxed_bench() -> int:
    from autokernel.cli.bench import bench_command
    from autokernel.policy import Policy

    print("== sandboxed bench: kernels/rmsnorm.py against a copy of itself (expect a CI around 1.0, exit 1)",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="autokernel-gpu-check-") as d:
        cand = Path(d) / "rmsnorm_copy.py"
        cand.write_text((ROOT / "kernels" / "rmsnorm.py").read_text())
        policy = Policy.model_validate({"bench": {"max_time_s": 10}, "sandbox": {"timeout_s": 180}})
        t0 = time.time()
        rc = bench_command("rmsnorm", [cand], None, False, policy=policy, job_root=Path(d) / "jobs")
        print(f"   bench exit code {rc} in {time.time() - t0:.0f} s")
        for log in sorted((Path(d) / "jobs").rglob("sandbox.log")):
            text = log.read_text(errors="replace").strip()
            if text:
                print(f"   {log.relative_to(d)} (last lines):\n" + "\n".join(text.splitlines()[-15:]))
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-tests", action="store_true", help="only the benchmarks")
    ap.add_argument("--ops", help="comma-separated subset of autokernel.ops.OPS")
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("gpu_check: needs a CUDA device (torch.cuda.is_available() is False); nothing to do on this machine.")
        return 0
    from autokernel import device
    from autokernel.ops import OPS

    t0 = time.time()
    print("device:", device.fingerprint())
    test_rc = 0 if args.skip_tests else run_kernel_tests()
    bench_ops(args.ops.split(",") if args.ops else list(OPS))
    bench_rc = sandboxed_bench()
    print(f"== done in {time.time() - t0:.0f} s: kernel tests exit {test_rc}, sandboxed bench exit {bench_rc} "
          "(1 = no win, as expected)")
    return 0 if test_rc == 0 and bench_rc in (0, 1) else 1


if __name__ == "__main__":
    sys.exit(main())
