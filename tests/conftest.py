"""Suite-wide set-up. The helper modules of the test folders (opcheck, tiny_gguf, agent_helpers, fake_llm_api,
delivery_doubles) are importable by name through pyproject's [tool.pytest.ini_options] pythonpath."""
import os

from autokernel import device

device.ensure_interpreter()  # no GPU here: the kernels run through the Triton interpreter (before triton is imported)
# 2 cores shared with sandboxed children: oversubscribed OpenMP spins (7x slower measured)
os.environ.setdefault("OMP_NUM_THREADS", "1")
