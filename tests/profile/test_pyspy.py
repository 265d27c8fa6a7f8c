import subprocess
import sys
import time

import pytest

from autokernel.profile import pyspy


def test_top_self_merges_lines_and_counts_leaves():
    raw = ("<module> (a.py:1);f (a.py:3);g (b.py:7) 6\n"
           "<module> (a.py:1);f (a.py:4);g (b.py:9) 2\n"
           "<module> (a.py:1);f (a.py:5) 2\n"
           "garbage\n")
    out = pyspy.top_self(raw)
    assert out["samples"] == 10
    assert out["top_self"][0] == {"frame": "g (b.py)", "samples": 8, "share": 0.8}
    assert out["top_self"][1]["frame"] == "f (a.py)"


@pytest.mark.skipif(pyspy.find() is None, reason="py-spy not installed")
def test_samples_a_busy_process(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c",
                             "import time\ndef spin():\n  print('spinning', flush=True)\n  t = time.time()\n"
                             "  while time.time() - t < 20: pass\nspin()\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline().strip() == "spinning"
        s = pyspy.Sampler(tmp_path / "spy.txt", pid=busy.pid)
        if not s.start():
            pytest.skip(f"py-spy cannot attach here: {s.error}")
        time.sleep(1.0)
        out = s.stop()
    finally:
        busy.kill()
        busy.wait()
    assert out["ok"] and out["samples"] > 0
    assert any(f["frame"].startswith("spin (") for f in out["top_self"])


@pytest.mark.skipif(pyspy.find() is None, reason="py-spy not installed")
def test_cannot_attach_says_why(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    s = pyspy.Sampler(tmp_path / "spy.txt", pid=dead.pid)
    assert not s.start()
    out = s.stop()
    assert out["ok"] is False and str(dead.pid) in out["reason"]


def test_missing_py_spy_is_reported(monkeypatch, tmp_path):
    monkeypatch.setattr(pyspy, "find", lambda: None)
    s = pyspy.Sampler(tmp_path / "spy.txt")
    assert not s.start() and "pip install py-spy" in s.stop()["reason"]
