"""The engine's Triton kernels: only what the loop may rewrite. One op per file; the stem is the op's name.

Without a CUDA device the kernels run through the Triton interpreter, so the switch (autokernel.device.
ensure_interpreter) must be made before `triton` is first imported, and the interpreter's fixes
(autokernel/interp_fixes.py: bf16 tl.dot, triton.language patched once per launch) installed; every kernel module
imports this package first.
"""
from autokernel import device, interp_fixes

device.ensure_interpreter()
interp_fixes.install()
