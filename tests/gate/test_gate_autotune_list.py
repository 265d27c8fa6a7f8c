"""The static reading of @triton.autotune configs (autokernel/gate/autotune_list.py): a comprehension over literals
expands to the calls Python makes, in Python's order (the index the autotuner has at run time, which the coverage
stage reaches config by config); anything else is not read."""
import ast

import pytest

from autokernel.gate import autotune_list, coverage


def expand(text: str):
    out = autotune_list.configs(ast.parse(text, mode="eval").body)
    return None if out is None else [ast.unparse(c) for c in out]


def test_a_comprehension_expands_in_run_order_with_its_filters_and_arithmetic():
    text = "[triton.Config({'BLOCK': b * 2, 'S': (b, w)}, num_warps=w) for b in (32, 64) for w in range(2, 9, 2) " \
           "if b * w <= 256 and not w == 6]"
    run = [(b * 2, w) for b in (32, 64) for w in range(2, 9, 2) if b * w <= 256 and not w == 6]
    got = expand(text)
    assert got == [f"triton.Config({{'BLOCK': {b}, 'S': ({b // 2}, {w})}}, num_warps={w})" for b, w in run]


def test_forms_that_are_not_literal_are_not_read():
    for text in ["CONFIGS", "get_configs()", "[triton.Config({'B': b}) for b in SIZES]",
                 "[triton.Config({'B': b}) for b in range(n)]", "[triton.Config({'B': b}) for b in range(10 ** 6)]",
                 "[triton.Config({'B': b}) for b in (1, 2) if f(b)]", "[triton.Config({'B': 2 ** b}) for b in (99,)]",
                 "[triton.Config({'B': b // 0}) for b in (1,)]", "[c for (b, c) in [(1,)]]"]:
        got = expand(text)
        assert got is None or any(not _literal_config(c) for c in got), (text, got)


def _literal_config(text: str) -> bool:
    call = ast.parse(text, mode="eval").body
    return isinstance(call, ast.Call) and all(isinstance(v, ast.Constant) for v in call.args[0].values)


@pytest.mark.parametrize("configs, distinct", [
    ("[triton.Config({'BLOCK_N': b}, num_warps=w) for b in (128, 256) for w in (4, 8)]", 2),
    ("[triton.Config({'BLOCK_N': 64 << s}) for s in range(3)]", 3),
])
def test_coverage_counts_and_reaches_each_expanded_config(configs, distinct):
    src = f"@triton.autotune(configs={configs}, key=['N'])\n@triton.jit\ndef k(x, N, BLOCK_N: tl.constexpr):\n" \
          "    pass\n"
    assert coverage.autotune_variants(src) == distinct
    n = len(expand(configs))
    assert sorted(coverage.autotune_sites(ast.parse(src))) == sorted(f"autotune:k:{i}" for i in range(n))


SWEEP = "[triton.Config({'BLOCK': b}) for b in (64, 128)]"


@pytest.mark.parametrize("module, stands", [
    (f"CONFIGS = {SWEEP}\n@triton.autotune(configs=CONFIGS, key=['N'])\ndef k(): pass\n", True),
    (f"def get_configs():\n    '''doc'''\n    return {SWEEP}\n@triton.autotune(configs=get_configs(), key=['N'])\n"
     "def k(): pass\n", True),
    # named anywhere else (the launcher could reach the list: module state), bound twice, or not only a return
    (f"CONFIGS = {SWEEP}\n@triton.autotune(configs=CONFIGS, key=['N'])\ndef k(): pass\ndef f(x):\n"
     "    return CONFIGS\n", False),
    (f"CONFIGS = {SWEEP}\nCONFIGS = {SWEEP}\n@triton.autotune(configs=CONFIGS, key=['N'])\ndef k(): pass\n", False),
    (f"def get_configs(n):\n    return {SWEEP}\n@triton.autotune(configs=get_configs(1), key=['N'])\ndef k(): pass\n",
     False),
    (f"def get_configs():\n    x = 1\n    return {SWEEP}\n@triton.autotune(configs=get_configs(), key=['N'])\n"
     "def k(): pass\n", False),
    ("CONFIGS = [triton.Config({'BLOCK': b}) for b in SIZES]\n@triton.autotune(configs=CONFIGS, key=['N'])\n"
     "def k(): pass\n", False),
])
def test_a_module_list_or_config_function_stands_for_its_configs_only_where_named_nowhere_else(module, stands):
    tree = ast.parse(module)
    named = autotune_list.sources(tree)
    assert bool(named) == stands, named
    k = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "k")
    got = coverage._config_nodes(k, named)
    assert [ast.unparse(c) for c in got] == ([f"triton.Config({{'BLOCK': {b}}})" for b in (64, 128)] if stands
                                             else []), got
