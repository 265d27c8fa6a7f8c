"""The one way a kernel file becomes a module: the engine, the gate's numeric harness and its end-to-end job all
load kernels/<op>.py (or a candidate replacing it) through `load_kernel`, so a candidate cannot tell the gate from
production by how it was loaded (docs/design.md, "no way to tell gate from production").

What is the same everywhere:
- the module name is `kernels.<op>`, and the file it is executed from is named `<op>.py` (the gate copies a candidate
  to that name); only the directory differs (the repository's kernels/ or a sandbox job's input directory);
- the `kernels` package is imported first: it sets TRITON_INTERPRET on a machine without CUDA and installs the
  interpreter's bf16 tl.dot fix (autokernel/interp_fixes.py). A kernel loaded without it multiplies bf16 operands as
  raw bit patterns under the interpreter (errors of ~1e11 on a correct kernel);
- inside a sandbox job, `neutral_process()` gives the process one fixed sys.argv and one set of environment keys,
  whichever job (numeric or end-to-end) it is.

Kept free of the engine and of pydantic: the sandboxed harness imports it on every job's start-up.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

PACKAGE = "kernels"
NEUTRAL_ARGV = ("autokernel",)  # what sys.argv is inside every sandboxed job that loads a kernel
# Set (when absent) in every sandboxed job, so the key set does not depend on which job ran torch's lazy set-up:
# torch's dispatch-mode machinery (the numeric harness's guard) writes TORCHINDUCTOR_CACHE_DIR on first use.
NEUTRAL_ENV_DEFAULTS = {"TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor"}


class KernelLoadError(Exception):
    """The file cannot be loaded as kernels/<op>.py, or does not define the launcher `op` as a plain function."""


def module_name(op: str) -> str:
    return f"{PACKAGE}.{op}"


def _package() -> types.ModuleType:
    return importlib.import_module(PACKAGE)  # the interpreter switch and the bf16 tl.dot fix, before any kernel


def load_kernel(op: str, path: str | Path | None = None, compile_source=None,
                module: str | None = None) -> types.ModuleType:
    """The module `kernels.<op>`, executed from `path` (default: the package's own <op>.py).

    The repository's own file, when already loaded from that same file, is reused (what `import kernels.<op>` does);
    any other file is executed afresh and replaces the entry in sys.modules. Raises KernelLoadError when the file's
    name is not <op>.py; whatever the file itself raises propagates (the caller judges it). compile_source:
    (source text, file name, the module's namespace) -> code object to execute instead of the file's plain
    compilation (the gate's coverage probes, autokernel/gate/coverage.py); the module is otherwise the same.
    module: a target checkout's module name for the file (autokernel/target/contract.py: `llama_liger.ops.rope`
    from llama_liger/ops/rope.py); the file must then be named as the module's last part, and the module is
    executed under that name, its parent package imported first from the checkout, as the engine imports it.
    """
    if module is not None:
        assert path is not None, "a target checkout's module is loaded from its file, never from kernels/"
        return _load_foreign(module, Path(path), compile_source)
    package = _package()
    name = module_name(op)
    assert package.__file__ is not None  # kernels/ is a regular package (kernels/__init__.py)
    own = Path(package.__file__).resolve().parent / f"{op}.py"
    path = own if path is None else Path(path).resolve()
    if path.name != f"{op}.py":
        raise KernelLoadError(f"{path}: a kernel for op {op!r} must be loaded from a file named {op}.py")
    loaded = sys.modules.get(name)
    if loaded is not None and path == own and getattr(loaded, "__file__", None) == str(own):
        return loaded
    kernel = _execute(name, path, compile_source)
    setattr(package, op, kernel)  # as the import system does for a submodule
    return kernel


def _execute(name: str, path: Path, compile_source) -> types.ModuleType:
    """The file at `path` executed as module `name` (registered in sys.modules, removed again if it raises)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise KernelLoadError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        if compile_source is None:
            spec.loader.exec_module(module)
        else:
            source = importlib.util.decode_source(path.read_bytes())
            exec(compile_source(source, str(path), vars(module)), vars(module))
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _load_foreign(name: str, path: Path, compile_source) -> types.ModuleType:
    parent, _, leaf = name.rpartition(".")
    if path.name != f"{leaf}.py":
        raise KernelLoadError(f"{path}: a kernel for module {name!r} must be loaded from a file named {leaf}.py")
    package = importlib.import_module(parent) if parent else None
    module = _execute(name, path.resolve(), compile_source)
    if package is not None:
        setattr(package, leaf, module)
    return module


def launcher_of(module: types.ModuleType, op: str) -> types.FunctionType:
    """The launcher `op`: a plain function defined in the module itself (not a re-export, a class, a partial)."""
    fn = vars(module).get(op)
    if not isinstance(fn, types.FunctionType) or fn.__module__ != module.__name__:
        raise KernelLoadError(f"{op} is a {type(fn).__name__} from {getattr(fn, '__module__', '?')}, not a function "
                              "defined in the kernel file")
    return fn


def neutral_process() -> None:
    """Make this sandboxed process look the same to a kernel whichever job it runs: argv and environment keys.

    Called by every sandbox entry that loads a kernel (autokernel.gate.child, autokernel.gate.e2e_child) before the
    kernel is imported. The sandbox already builds the environment from one allowlist (autokernel.sandbox.bwrap);
    this removes what differs between the jobs' harnesses.
    """
    sys.argv[:] = list(NEUTRAL_ARGV)
    for key, value in NEUTRAL_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    _package()
