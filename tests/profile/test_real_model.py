"""One profile of the embedded SmolLM2-135M (reference kernels: the shapes, not the interpreter's speed, are the
point): its real shapes must land in the corpus. The profile is the suite's shared one (tests/conftest.py
smollm2_trace: `autokernel profile` on two prompts, a prefill and one decode step), which tests/run reuses."""
import pytest

from autokernel.profile import trace


@pytest.mark.slow
def test_smollm2_shapes_in_the_corpus(smollm2_trace):
    t = trace.load_trace(smollm2_trace)
    assert t["kernels"] == "reference"
    assert t["model"]["hidden"] == 576 and t["model"]["n_layers"] == 30

    def corpus(op):
        return trace.shapes(t, op)

    assert {(s["N"], s["K"]) for s in corpus("matmul_q4_1")} == {
        (576, 576), (192, 576), (1536, 576), (576, 1536)}  # q/o, k/v (3 kv heads x 64), gate/up, down
    assert {(s["H"], s["D"]) for s in corpus("rope")} == {(9, 64), (3, 64)}
    assert {(s["Hq"], s["Hkv"], s["D"]) for s in corpus("attention") + corpus("attention_decode")} == {(9, 3, 64)}
    assert {s["N"] for s in corpus("silu_mul")} == {1536}
    assert {s["N"] for s in corpus("add_rmsnorm")} == {576}
    assert {(s["V"], s["K"]) for s in corpus("lm_head")} == {(49152, 576)}
    assert t["ops"]["matmul_q4_1"]["calls"] == 2 * 30 * 7
    assert sum(e["share"] for e in t["ops"].values()) == pytest.approx(1.0)
