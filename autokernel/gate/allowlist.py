"""Every allowlist the gate applies to a candidate kernel file, in one place, so both lines of defence are reviewed
side by side: the static grammar (autokernel/gate/static*.py reads the source) and the runtime guard
(autokernel/gate/child.py sees the aten ops a call runs).

The principle (docs/design.md): a candidate is an adversary that can read every object in its process, so the
tables name what a kernel file NEEDS, never what a cheat might use. Adding a name here is a security decision:
say in the commit which legitimate kernel needed it. Pure data (no torch import): the sandboxed child imports it.
"""
from __future__ import annotations

# --- runtime: aten ops a candidate's call may run (autokernel/gate/child.py, AtenWatch.forbidden) -------------------
ALLOC = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "zeros", "zeros_like",
                   "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "zero_"})
VIEW = frozenset({"view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand", "expand_as",
                  "permute", "transpose", "t", "slice", "select", "narrow", "squeeze", "unsqueeze", "split",
                  "split_with_sizes", "unsafe_split", "chunk", "unbind", "unfold", "alias", "detach", "view_as",
                  "flatten", "unflatten", "movedim"})
COPY = frozenset({"clone", "contiguous", "copy_", "_to_copy"})  # only without a dtype or device change
LAUNCH_ONLY = frozenset({"set_"})  # the Triton interpreter re-wraps storages inside a launch
POISONED = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"})

# --- imports: the whole list (static.forbidden_import for anything else) --------------------------------------------
# `import <module>` -> the one name it may be bound to.
IMPORTS = {"torch": "torch", "triton": "triton", "triton.language": "tl", "math": "math"}
# `from <module> import <name>`: only these names, never renamed.
FROM_IMPORTS: dict[str, frozenset[str]] = {}  # filled below, once the triton/tl tables exist

# --- inside @triton.jit bodies (TRITON_INTERPRET=1 runs them as plain Python: this list is what stops escapes) -------
TL_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64", "int1", "int8", "int16", "int32", "int64",
                       "uint8", "uint16", "uint32", "uint64", "float8e4nv", "float8e5", "float8e4b8", "float8e5b16",
                       "float8e4b15"})
TL_FUNCTIONS = frozenset({
    # indexing, memory
    "program_id", "num_programs", "arange", "load", "store", "make_block_ptr", "advance", "swizzle2d",
    "multiple_of", "max_contiguous", "max_constancy", "assume",
    # construction, shape
    "zeros", "zeros_like", "full", "cast", "reshape", "view", "permute", "trans", "broadcast", "broadcast_to",
    "expand_dims", "ravel", "split", "join", "interleave", "flip", "where", "gather",
    # reductions and scans (a combine_fn must be a @triton.jit function of the same file)
    "sum", "max", "min", "argmax", "argmin", "reduce", "associative_scan", "cumsum", "cumprod", "xor_sum",
    "histogram", "sort",
    # math
    "maximum", "minimum", "clamp", "exp", "exp2", "log", "log2", "sqrt", "sqrt_rn", "rsqrt", "sigmoid", "softmax",
    "abs", "floor", "ceil", "cos", "sin", "erf", "fma", "fdiv", "div_rn", "umulhi", "cdiv", "dot",
    # atomics: allowed here; run-to-run bitwise reproducibility is the numeric stage's check
    "atomic_add", "atomic_max", "atomic_min", "atomic_cas", "atomic_xchg", "atomic_and", "atomic_or", "atomic_xor",
    # compile-time and control
    "constexpr", "pointer_type", "static_range", "range", "static_assert", "device_assert", "debug_barrier",
    "PropagateNan",
}) | TL_DTYPES
TL_MATH = frozenset({"abs", "ceil", "cos", "div_rn", "erf", "exp", "exp2", "fdiv", "floor", "fma", "log", "log2",
                     "rsqrt", "sin", "sqrt", "sqrt_rn", "umulhi"})  # tl.math.<name>
# tl names that only a policy switch enables: name -> the Policy field (autokernel/policy.py) that allows it.
TL_POLICY = {"inline_asm_elementwise": "gate.allow_inline_asm"}
# Never (documented for describe()): Python callbacks, prints, randomness, descriptors' raw handles.
TL_NEVER = ("map_elementwise", "device_print", "static_print", "rand", "randn", "randint", "philox", "extra",
            "core", "target_info")
KERNEL_BUILTINS = frozenset({"range", "min", "max", "float", "int", "len", "abs"})
# Methods and attributes of tl values (tensors, pointers, dtypes) inside a kernel.
KERNEL_METHODS = frozenset({
    "to", "cast", "reshape", "view", "permute", "trans", "broadcast_to", "expand_dims", "ravel", "split", "flip",
    "sum", "max", "min", "argmax", "argmin", "cumsum", "cumprod", "reduce", "associative_scan", "xor_sum", "sort",
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sigmoid", "softmax", "abs", "floor", "ceil", "cos", "sin", "erf",
    "advance", "logical_and", "logical_or",
    "is_floating", "is_int", "is_int_signed", "is_int_unsigned", "is_fp16", "is_bf16", "is_fp32", "is_fp64",
    "is_ptr", "is_block",
})
KERNEL_ATTRS = frozenset({"dtype", "element_ty", "shape", "T", "primitive_bitwidth", "scalar", "numel",
                          "type"})  # ptr.type.element_ty: the fused-attention tutorial's spelling of ptr.dtype

# --- decorators of a kernel ------------------------------------------------------------------------------------------
JIT_KWARGS = frozenset({"do_not_specialize", "do_not_specialize_on_alignment", "noinline", "debug"})
AUTOTUNE_KWARGS = frozenset({"configs", "key"})  # never pre_hook/post_hook/reset_to_zero/restore_value/prune_...
CONFIG_KWARGS = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg"})  # never pre_hook
HEURISTIC_BUILTINS = frozenset({"min", "max", "abs"})

# --- the launcher (host code) ----------------------------------------------------------------------------------------
HOST_BUILTINS = frozenset({"abs", "bool", "divmod", "float", "int", "isinstance", "len", "max", "min", "pow", "range",
                           "round", "tuple", "list", "zip", "enumerate"})
HOST_EXCEPTIONS = frozenset({"ValueError", "RuntimeError", "TypeError", "NotImplementedError", "AssertionError"})
HOST_TYPES = frozenset({"int", "float", "bool", "str", "tuple", "list"})  # as annotations / isinstance targets
# Builtins that turn a tensor into a Python value (read its data on the host) or do arithmetic on it.
SCALAR_BUILTINS = frozenset({"abs", "bool", "divmod", "float", "int", "max", "min", "pow", "round"})

TORCH_DTYPES = frozenset({"float32", "float", "float16", "half", "bfloat16", "float64", "double", "int8", "int16",
                          "int32", "int64", "long", "int", "short", "uint8", "uint16", "uint32", "uint64", "bool",
                          "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})
TORCH_ALLOC = frozenset({"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
                         "full_like"})
TORCH_FACTS = frozenset({"finfo", "iinfo", "promote_types"})  # dtype facts, no data
TORCH_TYPES = frozenset({"Tensor", "dtype", "Size", "device"})  # annotations and isinstance only
TORCH_CONSTANTS = frozenset({"contiguous_format", "preserve_format", "strided"})  # memory_format= / layout=
TRITON_HOST = frozenset({"cdiv", "next_power_of_2"})
TRITON_DECORATORS = frozenset({"jit", "autotune", "Config", "heuristics"})
MATH_FUNCTIONS = frozenset({"ceil", "floor", "trunc", "log", "log2", "log10", "sqrt", "isqrt", "exp", "gcd", "lcm",
                            "fabs", "prod"})
MATH_CONSTANTS = frozenset({"pi", "e", "tau", "inf"})

# Tensor methods the launcher may call: metadata (no aten op) or the aten op they run, which must be in the runtime
# tables above (tests/gate/test_gate_static.py checks it). No compute, no cast, no read of the data.
TENSOR_METHODS = {
    "stride": None, "size": None, "dim": None, "ndimension": None, "numel": None, "nelement": None,
    "element_size": None, "storage_offset": None, "is_contiguous": None, "is_floating_point": None,
    "reshape": "reshape", "view": "view", "view_as": "view_as", "expand": "expand", "expand_as": "expand_as",
    "unsqueeze": "unsqueeze", "squeeze": "squeeze", "flatten": "flatten", "unflatten": "unflatten",
    "permute": "permute", "transpose": "transpose", "t": "t", "narrow": "narrow", "select": "select",
    "movedim": "movedim", "split": "split", "chunk": "chunk", "unbind": "unbind",
    "contiguous": "contiguous",
    "new_empty": "new_empty", "new_empty_strided": "new_empty_strided", "new_zeros": "new_zeros",
    "new_ones": "new_ones", "new_full": "new_full",
}
TENSOR_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "itemsize", "T"})  # device: only passed on, never read
DTYPE_ATTRS = frozenset({"itemsize", "is_floating_point", "is_signed", "is_complex"})
INFO_ATTRS = frozenset({"bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution"})
LAUNCH_KWARGS = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg"})  # plus the kernel's own parameters

# --- precision -------------------------------------------------------------------------------------------------------
NARROW_DTYPES = frozenset({f"torch.{d}" for d in ("float16", "half", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                                                  "float8_e4m3fnuz", "float8_e5m2fnuz")} |
                          {f"triton.language.{d}" for d in ("float16", "bfloat16", "float8e4nv", "float8e5",
                                                            "float8e4b8", "float8e5b16", "float8e4b15")})
NARROW_METHODS = frozenset({"half", "bfloat16"})
PRECISION_WORDS = ("tf32", "reduced_precision", "float32_matmul_precision", "allow_fp16", "allow_bf16")
DOT_PRECISION = "ieee"  # tl.dot must say input_precision="ieee": the default is tf32 for fp32 operands on a GPU

# typing's generic aliases, for annotations only (static_common.TYPE_NAMES): `-> Tuple[torch.Tensor, torch.Tensor]`
TYPING_NAMES = frozenset({"Optional", "Tuple", "List", "Union", "Sequence"})

FROM_IMPORTS.update({
    "__future__": frozenset({"annotations"}),
    "typing": TYPING_NAMES,
    "triton": TRITON_DECORATORS | TRITON_HOST,
    "triton.language": TL_FUNCTIONS,
})


def describe() -> str:
    """The grammar in a few lines, for the agent's system prompt: what a kernel file may contain."""
    def names(s) -> str:
        return ", ".join(sorted(s))

    return "\n".join([
        "A candidate kernel file may contain only:",
        "- imports: `import torch`, `import triton`, `import triton.language as tl`, `import math`, "
        "`from __future__ import annotations`, `from typing import` "
        f"{names(TYPING_NAMES)} (for annotations only), and `from triton import` / `from triton.language import` "
        "names listed below (no other module, no renaming, no imports inside functions);",
        "- module constants bound once to immutable literals (numbers, strings, tuples of them, "
        "tl.constexpr(<literal>), dtypes); no lists, dicts, sets or calls at module level, except an autotune "
        "config list (`CONFIGS = [triton.Config(...), ...]`, or a function that only returns one) named nowhere but "
        "in configs=;",
        "- @triton.jit kernels, optionally under @triton.heuristics({'NAME': lambda args: <arithmetic on "
        "args['name']>}) or @triton.autotune(configs=[triton.Config({literals}, num_warps=<int>, "
        "num_stages=<int>)], key=['name', ...]) (no hooks, no other arguments);",
        "- the launcher def(s) of kernels/<op>.py with the same parameters, and nothing else (no classes, "
        "no helper functions, no try/except, no with, no while, no global).",
        f"Inside kernels: tl.{{{names(TL_FUNCTIONS - TL_DTYPES)}}}, tl dtypes ({names(TL_DTYPES)}), "
        f"tl.math.{{{names(TL_MATH)}}}, builtins {names(KERNEL_BUILTINS)}, other @triton.jit functions of the "
        f"file, methods .{{{names(KERNEL_METHODS)}}} and attributes .{{{names(KERNEL_ATTRS)}}} of tl values; "
        "if / for over range, tl.range, tl.static_range / while; no break/continue (Triton cannot compile "
        f"them); tl.dot(..., input_precision=\"{DOT_PRECISION}\"). tl.inline_asm_elementwise only when the "
        "policy sets gate.allow_inline_asm.",
        "In the launcher: assignments to plain names, augmented assignment, assert, if/else, "
        "for over range(...) or a shape, raise of " + names(HOST_EXCEPTIONS) + ", return, kernel launches "
        "`kernel[grid](...)` as statements, and `grid = lambda meta: (...)`. Calls: builtins "
        f"{names(HOST_BUILTINS)} (never on a tensor's data), torch.{{{names(TORCH_ALLOC | TORCH_FACTS)}}}, "
        f"torch dtypes, triton.{{{names(TRITON_HOST)}}}, math.{{{names(MATH_FUNCTIONS | MATH_CONSTANTS)}}}, "
        f"tensor methods .{{{names(TENSOR_METHODS)}}} called directly (never stored in a variable), tensor "
        f"attributes .{{{names(TENSOR_ATTRS)}}} (device only passed on). No arithmetic, comparison, indexing "
        "by a tensor or truth test on tensors (that is compute: do it in the kernel), no .to()/.half()/.float() "
        "casts, no torch.backends/cuda/version, no getattr/setattr/globals/dunder names, no private attributes.",
        "float16/bfloat16/float8 dtypes named anywhere but in a comparison, and tf32 switches, are "
        "static.precision: cast to the data's own dtype (x.dtype, ptr.dtype.element_ty). A shape compared for "
        "equality with a literal other than 0/1 outside an assert is static.shape_special_case, and so is "
        "tl.num_programs (the grid's size, or a local derived from it) in any decision: a comparison, a "
        "condition, tl.where, // % >> & | ^ or a clamp; it may be a range() bound or stride. Bit "
        "reinterpretation (bitcast=True, tl.pointer_type re-typing, a host .view(dtype)) only where "
        "kernels/<op>.py does the same: else static.precision.",
    ])
