"""How precise and how honest the A/B bench is on this machine: `python benchmarks/bench_precision.py [SCENARIO ...]
[--load N] [--max-time S] [--json OUT]`.

Scenarios (rmsnorm, the model's shapes, one call each, autokernel.bench.measure.measure with the default policy):
- copy      the incumbent kernels/rmsnorm.py against an identical copy of itself: the interval must contain 1 and
            must not clear bench.min_speedup;
- slow1.2   a deliberately slower but correct incumbent (the masked row re-masked 3 more times: ~1.2x on the
            interpreter) against kernels/rmsnorm.py as the candidate: a genuine modest win;
- slow1.5   the same with the row's sum of squares computed twice (~1.5x).
`--load N` keeps N busy pure-Python processes running for the whole measurement (on top of whatever else the
machine is doing), to show the verdict under load. Printed per scenario: the weighted speedup and its interval,
per-shape speedups, rounds, repetitions per job, the bench's total wall time, the jobs' CPU/wall, and the device
and versions (CPU: Triton-interpreter CPU time, never GPU speed). Figures, not a test: nothing here asserts.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
INCUMBENT = ROOT / "kernels" / "rmsnorm.py"

_MASKED = """    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
"""
SLOWER = {  # scenario: (replaced line, replacement): the same kernel, with redundant interpreter steps
    "slow1.2": (_MASKED, _MASKED + "    x = tl.where(mask, x, 0.0)\n" * 3),
    "slow1.5": ("    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)\n",
                "    ss = tl.sum(x * x, axis=0) + tl.sum(x * x, axis=0)\n"
                "    rstd = 1.0 / tl.sqrt(ss / (2 * N) + eps)\n"),
}


def _slow_incumbent(name: str, d: Path) -> Path:
    src = INCUMBENT.read_text()
    old, new = SLOWER[name]
    assert old in src, f"kernels/rmsnorm.py changed: update benchmarks/bench_precision.py's {name}"
    p = d / f"incumbent_{name.replace('.', '_')}" / "rmsnorm.py"
    p.parent.mkdir()
    p.write_text(src.replace(old, new))
    return p


def _spin() -> None:
    while True:
        pass


def run(name: str, d: Path, max_time_s: float | None) -> dict:
    from autokernel.bench.measure import measure
    from autokernel.cli.bench import _cases
    from autokernel.policy import Policy
    cand = d / f"cand_{name.replace('.', '_')}" / "rmsnorm.py"
    cand.parent.mkdir()
    cand.write_bytes(INCUMBENT.read_bytes())
    inc = INCUMBENT if name == "copy" else _slow_incumbent(name, d)
    policy = Policy.model_validate({"bench": {"max_time_s": max_time_s} if max_time_s else {}})
    t0 = time.monotonic()
    m = measure("rmsnorm", [cand], _cases("rmsnorm", None), policy, d / "jobs", incumbent=inc)
    wall = time.monotonic() - t0
    c = m.files[1]
    reps = sorted({j["reps"] for j in m.jobs})
    cpu_wall = sorted(j["cpu_s"] / j["wall_s"] for j in m.jobs if j["wall_s"] > 0 and j["cpu_s"] >= 0)
    def key(shape: dict) -> str:
        return " ".join(f"{a}={b}" for a, b in shape.items())
    out = {"scenario": name, "label": m.label, "clock": m.clock, "status": c.status, "accepted": c.accepted,
           "reason": c.reason, "speedup": [c.speedup.est, c.speedup.lo, c.speedup.hi] if c.speedup else None,
           "per_shape": {key(s.shape): [s.speedup.est, s.speedup.lo, s.speedup.hi] for s in c.shapes},
           "rounds": m.rounds, "reps_per_job": reps, "bench_wall_s": round(wall, 1),
           "job_cpu_per_wall_median": round(cpu_wall[len(cpu_wall) // 2], 3) if cpu_wall else None,
           "rounds_ms": {key(s.shape): [[round(t, 2) for t in f.shapes[k].rounds_ms] for f in m.files]
                         for k, s in enumerate(c.shapes)}}
    sp = out["speedup"]
    print(f"{name:8s} {'ACCEPTED' if c.accepted else 'not accepted':13s} speedup "
          + (f"{sp[0]:.3f} [{sp[1]:.3f}, {sp[2]:.3f}]" if sp else f"- ({c.status}: {c.detail})")
          + f"  rounds {m.rounds}, reps/job {reps}, wall {wall:.0f} s, job CPU/wall {out['job_cpu_per_wall_median']}",
          flush=True)
    for shape, s in out["per_shape"].items():
        inc, mine = out["rounds_ms"][shape]
        print(f"           {shape:<12} {s[0]:.3f} [{s[1]:.3f}, {s[2]:.3f}]   per round, ms: incumbent "
              f"{' '.join(f'{t:.3g}' for t in inc)} | candidate {' '.join(f'{t:.3g}' for t in mine)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenarios", nargs="*", default=["copy", "slow1.2"], choices=["copy", *SLOWER])
    ap.add_argument("--load", type=int, default=0, help="busy processes kept running during the measurement")
    ap.add_argument("--max-time", type=float, default=None, help="bench.max_time_s (default: the policy's)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    from autokernel import device
    fp = device.fingerprint()
    print(f"device: {fp['kind']} ({fp['cpu']}, {fp['cpu_count']} cores); torch {fp['torch']}, triton {fp['triton']}, "
          f"python {fp['python']}; load average {os.getloadavg()[0]:.1f}; extra busy processes: {args.load}",
          flush=True)
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    for h in hogs:
        h.start()
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-precision-") as d:
            for name in args.scenarios:
                results.append(run(name, Path(d), args.max_time))
    finally:
        for h in hogs:
            h.kill()
    if args.json:
        args.json.write_text(json.dumps({"fingerprint": fp, "load": args.load, "results": results}, indent=1))


if __name__ == "__main__":
    main()
