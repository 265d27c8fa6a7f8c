import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    import tiny_gguf
    return tiny_gguf.write(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
