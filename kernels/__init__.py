"""The engine's Triton kernels: only what the loop may rewrite. One op per file; the stem is the op's name.

Without a CUDA device the kernels run through the Triton interpreter, so the switch must be set before `triton`
is first imported; every kernel module imports this package first.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
