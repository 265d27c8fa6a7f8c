import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # CI has no GPU; the kernels run through the interpreter
# 2 cores shared with sandboxed children: oversubscribed OpenMP spins (7x slower measured)
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).parent / "kernels"))
