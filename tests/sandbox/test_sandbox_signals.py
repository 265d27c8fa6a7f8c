"""No job outlives autokernel (issue: a SIGTERM during a run left a SIGSTOPped job process behind, orphaned): the
CLI's SIGTERM handler kills every running sandbox job's process group, stopped ones included, then exits 143."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).parent
SCRIPT = '''
import os, signal, sys, threading, time
from pathlib import Path
sys.path.insert(0, {here!r})
import sandbox_entries
from autokernel import cli, sandbox
from autokernel.sandbox import runner
from autokernel.policy import Policy
if {handler}:
    cli._die_with_jobs()
limits = Policy().sandbox.model_copy(update={{"timeout_s": 120, "isolation": "auto"}})
src = b"import time\\ndef main(scratch):\\n    time.sleep(120)\\n"
threading.Thread(target=sandbox.run, args=(sandbox_entries.call_candidate, {{"candidate": "c.py"}}, Path({job!r}),
                 limits), kwargs=dict(inputs={{"c.py": src}}, pythonpath=[Path({here!r})]), daemon=True).start()
while not runner._LIVE:
    time.sleep(0.05)
pid = next(iter(runner._LIVE))
time.sleep(1.0)
os.killpg(pid, signal.SIGSTOP)  # as the bench's lockstep leaves a job between its turns
print(pid, flush=True)
time.sleep(300)
'''


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _run(tmp_path: Path, handler: bool) -> tuple[int, int]:
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(SCRIPT.format(here=str(HERE), job=str(tmp_path / "job"), handler=handler)))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pid = int(p.stdout.readline())
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=60)
    return pid, rc


def test_sigterm_kills_every_job_even_a_stopped_one(tmp_path):
    pid, rc = _run(tmp_path, handler=True)
    assert rc == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while _group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(pid), "a sandbox job outlived autokernel"


def test_without_the_handler_the_stopped_job_is_left_behind(tmp_path):
    """The defence, removed: the job's session survives its parent (start_new_session), stopped."""
    pid, rc = _run(tmp_path, handler=False)
    try:
        assert rc == -signal.SIGTERM
        time.sleep(1.0)
        assert _group_alive(pid)
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
