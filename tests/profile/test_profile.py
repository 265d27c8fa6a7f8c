"""Profiles of the tiny random llama (2 layers, hidden 64, 4 q / 2 kv heads, ffn 128)."""
import json

import pytest

from autokernel import device
from autokernel import ops as opspecs
from autokernel.profile import trace
from autokernel.profile.profiler import profile

FORWARDS = 2 * (1 + 2)  # two batches (3 prompts, batch 2), each one prefill + 2 decode steps
LAYERS = 2


def test_every_op_call_is_counted(ref_trace_dir):
    ops = trace.load_trace(ref_trace_dir)["ops"]
    assert {op: e["calls"] for op, e in ops.items()} == {
        "matmul_q4_1": FORWARDS * LAYERS * 7, "rope": FORWARDS * LAYERS * 2, "add_rmsnorm": FORWARDS * LAYERS * 2,
        "silu_mul": FORWARDS * LAYERS, "attention": 2 * LAYERS, "attention_decode": 4 * LAYERS,
        "rmsnorm": FORWARDS, "embedding_q8_0": FORWARDS, "lm_head": FORWARDS}
    assert ops["attention"]["phases"] == {"prefill": {"calls": 4, "total_ms": pytest.approx(
        ops["attention"]["total_ms"])}}
    assert ops["lm_head"]["sites"].keys() == {"output"}
    assert {f"blk.{i}.attn_q.weight" for i in range(LAYERS)} <= ops["matmul_q4_1"]["sites"].keys()


def test_shapes_layouts_and_work_counts(ref_trace_dir):
    t = trace.load_trace(ref_trace_dir)
    mm = t["ops"]["matmul_q4_1"]
    by_nk = {(s["shape"]["N"], s["shape"]["K"]): s for s in mm["shapes"]}
    assert set(by_nk) == {(64, 64), (32, 64), (128, 64), (64, 128)}  # q/o, k/v (2 kv heads x 16), gate/up, down
    q = [s for s in mm["shapes"] if s["shape"]["N"] == 64 and s["shape"]["K"] == 64]
    assert {s["shape"]["M"] for s in q} >= {2}  # decode: one row per prompt of a batch of 2
    s = by_nk[(64, 128)]
    assert s["sites"] == ["blk.*.ffn_down.weight"]
    assert s["dtypes"][0] == {"x": "float32", "qs": "uint8", "d": "float16", "m": "float16"}
    assert s["strides"][0]["qs"] == [64, 1] and s["sizes"][0]["d"] == [64, 4]
    spec = opspecs.get("matmul_q4_1")
    import torch
    assert s["flops"] == spec.flops(s["shape"]) and s["bytes"] == spec.bytes_moved(s["shape"], torch.float32)
    total_flops = sum(x["flops"] * x["calls"] for x in mm["shapes"])
    assert mm["flops_per_call"] == pytest.approx(total_flops / mm["calls"])
    assert mm["gflops"] == pytest.approx(total_flops / mm["total_ms"] / 1e6)
    rope = t["ops"]["rope"]
    assert {x["shape"]["H"] for x in rope["shapes"]} == {4, 2}
    assert rope["shapes"][0]["scalars"][0] == {"theta": 10000.0}


def test_chrome_trace_has_one_range_per_call(ref_trace_dir):
    t = trace.load_trace(ref_trace_dir)
    doc = json.loads((ref_trace_dir / t["files"]["chrome_trace"]).read_text())
    names = [e.get("name", "") for e in doc["traceEvents"]]
    ours = [n for n in names if n.startswith("ak ")]
    assert len(ours) == t["totals"]["calls"]
    assert any(n.startswith("ak attention blk.1.attn #") for n in ours)


def test_label_and_totals(ref_trace_dir):
    t = trace.load_trace(ref_trace_dir)
    if device.kind() != "cuda":
        assert t["timing"]["label"] == "CPU / Triton interpreter" and t["timing"]["source"] == "cpu_wall"
        assert t["roofline"]["gbps"] > 0 and "interpreter" in t["roofline"]["note"]
    tot = t["totals"]
    assert tot["batches"] == 2 and tot["decode_tokens"] == 3 * 2 and t["timing"]["extrapolated_calls"] == 0
    assert tot["e2e_ms"] == pytest.approx(tot["total_op_ms"] + tot["non_op_ms"])
    assert tot["total_op_ms"] <= tot["wall_ms"]


@pytest.mark.skipif(device.kind() == "cuda", reason="sampling is the interpreter's default")
def test_triton_interpreter_with_sampling(tiny_model, tmp_path):
    wl = tmp_path / "w.yaml"
    wl.write_text("chat: false\nbatch: 1\ndecode_steps: 1\nprompts: [Hi there]\n")
    t = trace.load_trace(profile(wl, kernels="triton", model_path=tiny_model, out=tmp_path, timed_per_shape=1))
    tm = t["timing"]
    distinct = sum(len(e["shapes"]) for e in t["ops"].values())
    assert tm["timed_calls"] == distinct and tm["timed_calls"] + tm["extrapolated_calls"] == t["totals"]["calls"]
    assert "charged the shape's mean" in tm["note"]
    for e in t["ops"].values():
        for s in e["shapes"]:
            assert s["timed_calls"] == 1 and s["total_ms"] == pytest.approx(s["calls"] * s["mean_ms"])
    assert sum(e["share"] for e in t["ops"].values()) == pytest.approx(1.0)


def test_device_times_maps_kernels_back_to_calls():
    """The CUDA path's mapping, on stand-in profiler events: a CPU range owns its kernels' device time; the GPU-side
    annotation of a range is the fallback; other events are ignored."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from autokernel.profile.recorder import device_times

    def evt(name, dev, device_us=0.0, span_us=0.0):
        return SimpleNamespace(name=name, device_type=dev, device_time_total=device_us,
                               time_range=SimpleNamespace(elapsed_us=lambda: span_us))
    prof = SimpleNamespace(events=lambda: [
        evt("ak matmul blk.0.attn_q.weight #0", DeviceType.CPU, device_us=120.0),
        evt("ak matmul blk.0.attn_q.weight #0", DeviceType.CUDA, span_us=130.0),
        evt("ak rope blk.0.rope_q #1", DeviceType.CPU, device_us=0.0),
        evt("ak rope blk.0.rope_q #1", DeviceType.CUDA, span_us=7.0),
        evt("aten::empty", DeviceType.CPU, device_us=5.0),
        evt("matmul_kernel", DeviceType.CUDA, span_us=120.0),
    ])
    kernel, annotation = device_times(prof)
    assert kernel == {0: 0.12}
    assert annotation == {0: 0.13, 1: 0.007}
