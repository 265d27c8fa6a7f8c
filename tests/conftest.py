import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # CI has no GPU; the kernels run through the interpreter
sys.path.insert(0, str(Path(__file__).parent / "kernels"))
