import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    import tiny_gguf
    return tiny_gguf.write(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


TINY_WORKLOAD = """\
name: tiny
chat: false
batch: 2
decode_steps: 2
prompts:
  - "Hi"
  - "The capital of France is"
  - "One two three"
"""


@pytest.fixture(scope="session")
def tiny_workload(tmp_path_factory):
    path = tmp_path_factory.mktemp("wl") / "tiny.yaml"
    path.write_text(TINY_WORKLOAD)
    return path


@pytest.fixture(scope="session")
def ref_trace_dir(tiny_model, tiny_workload, tmp_path_factory):
    """One profile of the tiny model on reference kernels: every call timed, fast."""
    from autokernel.profile.profiler import profile
    return profile(tiny_workload, kernels="reference", model_path=tiny_model,
                   out=tmp_path_factory.mktemp("traces"), timed_per_shape=0)
