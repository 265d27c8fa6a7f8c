import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    import tiny_gguf
    return tiny_gguf.write(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
