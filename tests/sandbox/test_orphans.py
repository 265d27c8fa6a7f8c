"""The one orphan sweeper (autokernel/sandbox/orphans.py): what a killed autokernel process left is removed by the next
one, and nothing of a live process, nothing through a symlink, nothing of another prefix."""
import os

from autokernel.sandbox import orphans

GONE = "999999999"  # no such pid (above pid_max)


def test_only_the_directories_of_gone_processes_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(orphans, "_swept", set())
    dead, live = tmp_path / f"autokernel-in-{GONE}-abc", tmp_path / f"autokernel-in-{os.getpid()}-def"
    other = tmp_path / f"autokernel-job-{GONE}-abc"  # another prefix: its own sweep
    for d in (dead, live, other):
        d.mkdir()
    (dead / "candidate.py").write_text("x = 1\n")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "file").write_text("mine\n")
    link = tmp_path / f"autokernel-in-{GONE}-link"
    link.symlink_to(kept)
    orphans.sweep_once("autokernel-in", [tmp_path])
    assert not dead.exists() and live.exists() and other.exists()
    assert link.is_symlink() and (kept / "file").read_text() == "mine\n"


def test_each_prefix_is_swept_once_per_process(tmp_path, monkeypatch):
    monkeypatch.setattr(orphans, "_swept", set())
    orphans.sweep_once("autokernel-cluster", [tmp_path])
    late = tmp_path / f"autokernel-cluster-{GONE}-abc"
    late.mkdir()

    def parents():
        raise AssertionError("a second sweep reads its parents")
        yield

    orphans.sweep_once("autokernel-cluster", parents())
    assert late.exists()


def test_a_cgroup_that_is_not_empty_stays(tmp_path, monkeypatch):
    monkeypatch.setattr(orphans, "_swept", set())
    empty, busy = tmp_path / f"autokernel-{GONE}-1", tmp_path / f"autokernel-{GONE}-2"
    empty.mkdir(), busy.mkdir()
    (busy / "cgroup.procs").write_text("1\n")  # rmdir fails, as on a cgroup that still holds a process
    orphans.sweep_once("autokernel", [tmp_path], orphans.remove_cgroup)
    assert not empty.exists() and busy.exists()
