"""Coverage probes, the sandbox child's side (autokernel/gate/child.py): the recorder the instrumented candidate
calls, the compile hook that instruments it, the interpreter hook that instruments each kernel body, and the untimed
autotune picker. The sites and their meaning are autokernel/gate/coverage.py."""
from __future__ import annotations

import ast

from autokernel import paths
from autokernel.gate.coverage import FALSE, OPAQUE, REACHED, RECORDER, TRUE, instrument


def _data(v: object):
    """v as a Python scalar or a numpy array, or None where the value cannot be read without running someone's code
    (a torch tensor: reading it on the host is itself forbidden compute; anything else: opaque)."""
    import numpy as np
    t = type(v)
    if v is None or t in (bool, int, float, str, tuple, list, dict):
        return bool(v) if t in (str, tuple, list, dict) else v
    if isinstance(v, (np.ndarray, np.generic)):
        return np.asarray(v)
    import triton.language as tl
    if isinstance(v, tl.constexpr):
        return _data(v.value)
    if isinstance(v, tl.tensor):
        data = getattr(getattr(v, "handle", None), "data", None)  # the interpreter's value (numpy)
        return np.asarray(data) if isinstance(data, (np.ndarray, np.generic)) else None
    return None


def _truth(v: object) -> int:
    import numpy as np
    d = _data(v)
    if d is None:
        return OPAQUE
    if isinstance(d, np.ndarray):
        b = d.astype(bool)
        return (TRUE if b.any() else 0) | (FALSE if not b.all() else 0)
    return TRUE if d else FALSE


def _sides(a: object, b: object, out: object, tie: int | None = None) -> int:
    """Which argument a two-way min/max returned, strictly (where they differ): TRUE the first, FALSE the second;
    `tie`: the side (0, 1) that a tie counts for (a literal 0/1 side, Instrument.visit_Call)."""
    import numpy as np
    da, db, do = _data(a), _data(b), _data(out)
    if da is None or db is None or do is None:
        return OPAQUE
    try:
        with np.errstate(all="ignore"):
            differ = np.asarray(da != db)
            first = differ & np.asarray(do == da)
            second = differ & np.asarray(do == db)
            tied = bool(np.any(~differ)) if tie is not None else False
    except (TypeError, ValueError):
        return OPAQUE
    first_any, second_any = bool(first.any()) or (tied and tie == 0), bool(second.any()) or (tied and tie == 1)
    return (TRUE if first_any else 0) | (FALSE if second_any else 0)


class Recorder:
    """What the probes saw, by site key (bits REACHED, TRUE, FALSE, OPAQUE). Bound in the candidate module's globals
    as RECORDER; returns every value unchanged, so the instrumented code computes what the plain code does."""

    def __init__(self):
        self.seen: dict[str, int] = {}

    def block(self, key: str) -> None:
        self.seen[key] = self.seen.get(key, 0) | REACHED

    def cond(self, key: str, value):
        self.seen[key] = self.seen.get(key, 0) | REACHED | _truth(value)
        return value

    def clamp(self, key: str, fn, x, lo, hi):
        """tl.clamp(x, lo, hi): TRUE where a bound bit (x outside [lo, hi]), FALSE where x passed through."""
        import numpy as np
        out = fn(x, lo, hi)
        dx, dlo, dhi = _data(x), _data(lo), _data(hi)
        bits = OPAQUE
        if dx is not None and dlo is not None and dhi is not None:
            try:
                with np.errstate(all="ignore"):
                    bit = (np.asarray(dx) < np.asarray(dlo)) | (np.asarray(dx) > np.asarray(dhi))
                bits = (TRUE if bit.any() else 0) | (FALSE if not bit.all() else 0)
            except (TypeError, ValueError):
                pass
        self.seen[key] = self.seen.get(key, 0) | REACHED | bits
        return out

    def pick(self, key: str, fn, a, b):
        out = fn(a, b)
        tie = {"pick0": 0, "pick1": 1}.get(key.rsplit(":", 1)[-1])
        self.seen[key] = self.seen.get(key, 0) | REACHED | _sides(a, b, out, tie)
        return out


def compile_instrumented(recorder: Recorder):
    """kernel_loader.load_kernel's `compile_source`: the module's code with probes, the recorder in its globals."""
    def compile_source(source: str, filename: str, namespace: dict):
        namespace[RECORDER] = recorder
        tree, _ = instrument(paths.parse(source, filename), source)
        return compile(tree, filename, "exec")
    return compile_source


def install_interpreter(filename: str) -> None:
    """The interpreter re-parses each kernel from its file (triton's FunctionRewriter) before running it: the same
    probes go in first, for `filename` only (the candidate), so kernel bodies report to the module's recorder."""
    from triton.runtime.interpreter import FunctionRewriter
    plain = FunctionRewriter._transform_ast
    if getattr(plain, "_coverage", None) == filename:
        return

    def _transform_ast(self, src):
        if self.filename != filename:
            return plain(self, src)
        offset = self.def_file_lineno - 1
        tree, _ = instrument(paths.parse(src), src, offset=offset, kernel=True)
        tree = self.ast_transformer.visit(tree)
        ast.fix_missing_locations(tree)
        ast.increment_lineno(tree, offset)
        return tree

    _transform_ast.__dict__["_coverage"] = filename  # a function attribute, which mypy does not model
    FunctionRewriter._transform_ast = _transform_ast


class ForcedConfig:
    """Which config the candidate's autotuners run for the current call: -1 picks one per key (install_autotune's
    hash); j >= 0 the j-th distinct one (by meta-parameters, as autokernel/gate/coverage.py autotune_variants counts
    them), modulo how many an autotuner has."""
    index = -1


def _distinct(configs: list) -> list[int]:
    """The index of each distinct meta-parameter dict's first config, in order."""
    seen: dict[str, int] = {}
    for i, c in enumerate(configs):
        seen.setdefault(repr(sorted(c.kwargs.items())), i)
    return list(seen.values())


def install_autotune(recorder: Recorder, module_name: str, salt: int) -> None:
    """The candidate's autotuners (module `module_name`) run one config per key, chosen by a salted hash (or the one
    ForcedConfig names), untimed."""
    import hashlib

    from triton.runtime.autotuner import Autotuner
    plain = Autotuner.run
    if getattr(plain, "_coverage", False):
        plain = plain._plain

    def run(self, *args, **kwargs):
        fn = getattr(self, "base_fn", None)
        configs = list(self.configs)
        if getattr(fn, "__module__", None) != module_name or len(configs) < 2:
            return plain(self, *args, **kwargs)
        assert fn is not None  # its __module__ is module_name
        if ForcedConfig.index >= 0:
            firsts = _distinct(configs)
            i = firsts[ForcedConfig.index % len(firsts)]
        else:
            named = {**dict(zip(self.arg_names, args)), **kwargs}
            key = [str(named[k]) for k in self.keys if k in named]
            key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
            h = hashlib.sha256(f"{salt}:{fn.__name__}:{key}".encode()).digest()
            i = int.from_bytes(h[:8], "little") % len(configs)
        recorder.block(f"autotune:{fn.__name__}:{i}")
        self.configs = [configs[i]]
        try:
            return plain(self, *args, **kwargs)
        finally:
            self.configs = configs

    run.__dict__["_coverage"], run.__dict__["_plain"] = True, plain  # function attributes (mypy does not model them)
    Autotuner.run = run


def untimed_autotune(op: str) -> None:
    """Under the CPU interpreter an autotuner with several configs cannot time them (it raises): the e2e and bench
    jobs pick one config per key by hash, as the numeric stage does (which has judged every one). Where kernels
    compile, the autotuner times them as in production."""
    import torch
    if not torch.cuda.is_available():
        from autokernel import kernel_loader
        install_autotune(Recorder(), kernel_loader.module_name(op), 0)
