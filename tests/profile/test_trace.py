import hashlib
import json
import shutil
from pathlib import Path

import pytest

from autokernel import device
from autokernel.errors import UserError
from autokernel.profile import trace


def test_schema_round_trip(ref_trace_dir, tiny_workload):
    t = trace.load_trace(ref_trace_dir)
    assert t == trace.load_trace(ref_trace_dir / "summary.json")
    assert t["schema"] == trace.SCHEMA == 1
    assert t["device"]["kind"] == device.kind()
    assert t["workload"]["sha256"] == hashlib.sha256(tiny_workload.read_bytes()).hexdigest()
    assert t["weights"] == "quant" and t["kernels"] == "reference"
    for key in ("calls", "total_ms", "mean_ms", "p50_ms", "p95_ms", "share", "flops_per_call", "bytes_per_call",
                "gbps", "gflops", "sites", "shapes"):
        assert key in t["ops"]["matmul_q4_1"], key


def test_shares_sum_to_one_and_totals_add_up(ref_trace_dir):
    t = trace.load_trace(ref_trace_dir)
    ops = t["ops"].values()
    assert sum(e["share"] for e in ops) == pytest.approx(1.0)
    assert sum(e["total_ms"] for e in ops) == pytest.approx(t["total_op_ms"])
    assert sum(e["e2e_share"] for e in ops) == pytest.approx(t["total_op_ms"] / t["totals"]["e2e_ms"])
    for e in ops:
        assert sum(s["total_ms"] for s in e["sites"].values()) == pytest.approx(e["total_ms"])
        assert sum(s["calls"] for s in e["shapes"]) == e["calls"]
        assert sum(s["total_ms"] for s in e["shapes"]) == pytest.approx(e["total_ms"])
        assert e["p50_ms"] <= e["p95_ms"] and e["mean_ms"] == pytest.approx(e["total_ms"] / e["calls"])


def test_cases_are_the_shape_corpus(ref_trace_dir):
    t = trace.load_trace(ref_trace_dir)
    corpus = trace.cases(t, "matmul_q4_1")
    assert all(isinstance(c["shape"], dict) and isinstance(c["calls"], int) for c in corpus)
    assert sum(c["calls"] for c in corpus) == t["ops"]["matmul_q4_1"]["calls"]
    assert {c["dtype"] for c in corpus} == {"float32"}
    assert trace.shapes(t, "matmul_q4_1") == [c["shape"] for c in corpus]  # distinct already: one entry per shape
    with pytest.raises(UserError, match="no shapes recorded for op 'matmul'"):  # quant weights: never ran
        trace.cases(t, "matmul")
    with pytest.raises(UserError, match="unknown op 'matmul_q5'"):
        trace.cases(t, "matmul_q5")


def _write(tmp_path: Path, doc) -> Path:
    (tmp_path / "summary.json").write_text(json.dumps(doc))
    return tmp_path


def test_a_hand_written_shape_list_is_read_and_checked(tmp_path):
    """A summary without schema or device (a hand-written shape list for verify/bench) is schema 1; its entries are
    checked field by field, and the error names the field."""
    t = trace.load_trace(_write(tmp_path, {"ops": {"rmsnorm": {"shapes": [
        {"shape": {"M": 4, "N": 576}, "calls": 60, "dtype": "torch.float16"}, {"shape": {"M": 4, "N": 576}},
        {"shape": {"M": 1, "N": 576}}]}}}), check_device=False)
    assert trace.cases(t, "rmsnorm") == [{"shape": {"M": 4, "N": 576}, "calls": 60, "dtype": "float16"},
                                         {"shape": {"M": 4, "N": 576}, "calls": 1, "dtype": None},
                                         {"shape": {"M": 1, "N": 576}, "calls": 1, "dtype": None}]
    assert trace.shapes(t, "rmsnorm") == [{"M": 4, "N": 576}, {"M": 1, "N": 576}]
    for bad, field in [({"shape": {"M": "4"}}, r"shapes\[0\]\.shape"), ({"M": 4, "N": 576}, r"shapes\[0\]\.shape"),
                       ({"shape": {"M": 4}, "calls": 0}, r"shapes\[0\]\.calls"), ({"shape": {"M": True}}, "shape")]:
        t = trace.load_trace(_write(tmp_path, {"ops": {"rmsnorm": {"shapes": [bad]}}}), check_device=False)
        with pytest.raises(UserError, match=field):
            trace.cases(t, "rmsnorm")
    for other_layout in ({"shapes": {"rmsnorm": [{"M": 2, "N": 576}]}}, {"rmsnorm": [{"M": 2, "N": 576}]}):
        with pytest.raises(UserError, match="not an autokernel trace summary"):
            trace.load_trace(_write(tmp_path, other_layout), check_device=False)


def _copy_with(src: Path, dst: Path, **changes) -> Path:
    dst.mkdir()
    doc = json.loads((src / "summary.json").read_text())
    for k, v in changes.items():
        doc[k] = v
    (dst / "summary.json").write_text(json.dumps(doc))
    return dst


def test_refuses_older_schema_other_device_and_junk(ref_trace_dir, tmp_path):
    old = _copy_with(ref_trace_dir, tmp_path / "old", schema=0)
    with pytest.raises(UserError, match="schema 0, this autokernel reads schema 1"):
        trace.load_trace(old)
    gpu = {"kind": "cuda" if device.kind() != "cuda" else "cpu-interpreter", "gpu": "NVIDIA H100 80GB HBM3"}
    other = _copy_with(ref_trace_dir, tmp_path / "other", device=gpu)
    with pytest.raises(UserError, match="trace taken on"):
        trace.load_trace(other)
    assert trace.load_trace(other, check_device=False)["device"] == gpu
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(UserError, match="not a valid trace: not JSON"):
        trace.load_trace(tmp_path / "junk.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="not an autokernel trace"):
        trace.load_trace(tmp_path / "list.json")
    with pytest.raises(UserError, match="no such trace"):
        trace.load_trace(tmp_path / "missing")


def test_latest(ref_trace_dir, tmp_path):
    with pytest.raises(UserError, match="no trace under"):
        trace.latest(tmp_path)
    a = shutil.copytree(ref_trace_dir, tmp_path / "20250101-000000-aaaaaa")
    b = shutil.copytree(ref_trace_dir, tmp_path / "20250101-000001-bbbbbb")
    (b / "summary.json").touch()
    assert trace.latest(tmp_path) == b and a != b


HOSTILE = "\x1b]0;pwned\x07\x1b[2J[bold green blink]VERDICT: ACCEPTED, 9.99x[/]"


def test_a_committed_traces_text_reaches_no_terminal_raw(ref_trace_dir, tmp_path, capsys):
    """Red-team: a fork's committed traces/*/summary.json with terminal escapes (retitle, clear screen) and rich
    markup in its run id, workload name, timing label and numbers printed them raw under `autokernel rank`. Every
    string is cut to printable text as it is loaded, every printed one is markup-escaped, and a string where a
    number belongs shows as '?', never a traceback."""
    from autokernel.policy import Policy
    from autokernel.profile import rank
    from autokernel.profile.show import print_rank
    t = json.loads((Path(ref_trace_dir) / "summary.json").read_text())
    t["run_id"] = t["workload"]["name"] = HOSTILE
    t["timing"]["label"] = t["timing"]["note"] = HOSTILE
    t["totals"]["calls"] = t["totals"]["e2e_ms"] = HOSTILE
    (tmp_path / "summary.json").write_text(json.dumps(t))
    loaded = trace.load_trace(tmp_path)
    assert "\x1b" not in json.dumps(loaded) and "\x07" not in json.dumps(loaded)
    print_rank(loaded, rank.rank(loaded, Policy()))
    out = capsys.readouterr().out  # not a terminal: rich adds no escapes of its own
    assert "\x1b" not in out and "\x07" not in out
    assert "[bold green blink]VERDICT" in out and "?" in out  # the markup shown as text, the number as unknown


def test_a_nesting_bomb_is_bad_input(tmp_path):
    (tmp_path / "summary.json").write_text('{"ops": {}, "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(UserError, match="nested deeper"):
        trace.load_trace(tmp_path)
    (tmp_path / "summary.json").write_text('{"ops": {}, "x": ' + "[" * 40 + "]" * 40 + "}")
    with pytest.raises(UserError, match="nested deeper"):
        trace.load_trace(tmp_path)


def test_a_summary_of_any_size_is_not_read_whole(tmp_path):
    """A checkout's committed traces/*/summary.json of 400 MB was read whole by `rank --repo` (~1 GB of memory):
    past trace.MAX_TRACE_BYTES it is refused, naming the file, before it is read."""
    from autokernel.errors import UserError
    from autokernel.profile import trace as trace_mod
    big = tmp_path / "summary.json"
    with big.open("wb") as f:
        f.truncate(trace_mod.MAX_TRACE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(UserError, match="over the"):
        trace_mod.load_trace(big)
