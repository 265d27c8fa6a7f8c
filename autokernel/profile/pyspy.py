"""`profile --py-spy`: sample the engine's own process with py-spy and report the Python frames with most self time.

torch.profiler sees ops; py-spy sees the Python around them (the interpreter's per-program loop, the engine's glue),
which is where a CPU profile's time goes. `py-spy record --format raw` writes collapsed stacks ("f1;f2;leaf N")
when it gets SIGINT; sampling is non-blocking so the engine is not paused per sample. Attaching to a process needs
ptrace rights (root, CAP_SYS_PTRACE, or kernel.yama.ptrace_scope=0); when py-spy cannot attach or is missing, the
profile goes on and the trace says why.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

RATE_HZ = 100  # py-spy's default; 1 % of a core at most on the 2-core CI machines
START_WAIT_S = 1.0  # time for py-spy to attach, or fail to, before the workload starts


def find() -> str | None:
    """py-spy on PATH, or beside this Python (a virtualenv's bin/ that is not on PATH)."""
    here = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(here) if here.is_file() else None)


class Sampler:
    def __init__(self, out: Path, pid: int | None = None, rate_hz: int = RATE_HZ):
        self.out, self.pid, self.rate_hz = out, pid or os.getpid(), rate_hz
        self.proc: subprocess.Popen | None = None
        self.log = out.with_suffix(".log")
        self.error: str | None = None

    def start(self) -> bool:
        exe = find()
        if exe is None:
            self.error = "py-spy is not installed (pip install py-spy)"
            return False
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [exe, "record", "--pid", str(self.pid), "--format", "raw", "--output", str(self.out),
                 "--rate", str(self.rate_hz), "--nonblocking"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        if self.proc.poll() is not None:
            self.error = f"py-spy could not attach to pid {self.pid}: {self._last_log_line()}"
            self.proc = None
            return False
        return True

    def _last_log_line(self) -> str:
        try:
            lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no output"
        errors = [ln for ln in lines if "error" in ln.lower() or "permission" in ln.lower()]
        return (errors or lines or ["no output"])[-1]

    def stop(self, top: int = 15) -> dict:
        """Stop sampling; {ok, samples, top_self [{frame, samples, share}], raw, reason}."""
        if self.proc is None:
            return {"ok": False, "reason": self.error or "py-spy was not started"}
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return {"ok": False, "reason": "py-spy did not stop within 30 s of SIGINT"}
        if not self.out.is_file():
            return {"ok": False, "reason": f"py-spy wrote no samples: {self._last_log_line()}"}
        return {"ok": True, "raw": self.out.name, **top_self(self.out.read_text(errors="replace"), top)}


_LINE = re.compile(r":\d+\)$")


def top_self(raw: str, top: int = 15) -> dict:
    """Self samples per frame ('function (file)', line numbers merged) from py-spy raw collapsed stacks."""
    self_counts: Counter = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.split(";")[-1]
        self_counts[_LINE.sub(")", leaf)] += int(count)
        total += int(count)
    return {"samples": total,
            "top_self": [{"frame": f, "samples": n, "share": n / total} for f, n in self_counts.most_common(top)]}
