"""autokernel/interp_fixes.py: what every kernel run under the Triton CPU interpreter gets, so honest kernels run as
compiled. bf16: the bare interpreter keeps bf16 values as uint16 bit patterns and runs numpy on them (sums add the
patterns as integers, max/min order negatives backwards, casts convert the patterns); patched, they are widened to
float32 (exact), computed, rounded back to nearest even without torch (inside a launch the gate's runtime watch
forbids torch compute). Comparisons: a scalar comparison's result is an i1, so it can join a tile mask. Loops: a
range() loop variable is a scalar tensor."""
import subprocess
import sys
import textwrap

import numpy as np
import torch

from autokernel.interp_fixes import bf16_bits


def test_rounding_to_bf16_is_torchs_bit_for_bit():
    bits = np.random.default_rng(0).integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38, 1e-45, -1e-45, 1.0,
                        1.00390625, 1.01171875, 1.0078125], dtype=np.float32)  # ties round to even both ways
    f = np.concatenate([bits.view(np.float32), special])
    ours = bf16_bits(f)
    want = torch.from_numpy(f.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(f)
    assert np.array_equal(ours[~nan], want[~nan])
    assert torch.isnan(torch.from_numpy(ours[nan].view(np.int16)).view(torch.bfloat16)).all()


PROGRAM = '''
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
from autokernel import interp_fixes
interp_fixes.install()


@triton.jit
def reduce(x_ptr, o_ptr, N: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))
    tl.store(o_ptr + 0, tl.sum(x, axis=0))
    tl.store(o_ptr + 1, tl.max(x, axis=0))
    tl.store(o_ptr + 2, tl.min(x, axis=0))
    tl.store(o_ptr + 3, tl.argmax(x, axis=0).to(tl.bfloat16))
    tl.store(o_ptr + 4, tl.argmin(x, axis=0).to(tl.bfloat16))


@triton.jit
def casts(x_ptr, i_ptr, o_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    tl.store(o_ptr + offs, (x.to(tl.int32) + tl.load(i_ptr + offs)).to(tl.bfloat16))
    tl.store(o_ptr + N + offs, x.to(tl.float16).to(tl.bfloat16))


x = torch.randn(64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
o = torch.zeros(5, dtype=torch.bfloat16)
reduce[(1,)](x, o, N=64)
xf = x.float()
want = torch.stack([xf.sum(), xf.max(), xf.min(), xf.argmax().float(), xf.argmin().float()]).to(torch.bfloat16)
assert torch.equal(o, want), (o, want)
assert xf.min() < 0 < xf.max()  # negatives present: the bit-pattern order is wrong for them

x = (torch.randn(64, generator=torch.Generator().manual_seed(1)) * 100).to(torch.bfloat16)
i = torch.arange(64, dtype=torch.int32)
o = torch.zeros(128, dtype=torch.bfloat16)
casts[(1,)](x, i, o, N=64)
want = torch.cat([(x.to(torch.int32) + i).to(torch.bfloat16), x.to(torch.float16).to(torch.bfloat16)])
assert torch.equal(o, want), (o, want)
print("ok")
'''


def test_bf16_reductions_and_casts_match_torch_under_the_interpreter(tmp_path):
    _prints_ok(tmp_path / "bf16.py", PROGRAM)


MASK_PROGRAM = '''
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
from autokernel import interp_fixes
interp_fixes.install()


@triton.jit
def rows(o_ptr, n_rows):
    cols = tl.arange(0, 4)
    live = tl.program_id(0) < n_rows  # a scalar condition, splatted into a tile mask
    tl.store(o_ptr + tl.program_id(0) * 4 + cols, cols.to(tl.float32) + 1, mask=(cols < 3) & live)


o = torch.zeros(3, 4)
rows[(3,)](o, 2)
assert o.tolist() == [[1, 2, 3, 0], [1, 2, 3, 0], [0, 0, 0, 0]], o
print("ok")
'''


def test_a_scalar_condition_in_a_tile_mask_runs_as_compiled(tmp_path):
    """`mask & (row < n)`: the bare interpreter labels the scalar comparison int32 and tl.store refuses the splatted
    mask ("mask has unsupported dtype"), so an honest rope rewrite was rejected as runtime.exception."""
    _prints_ok(tmp_path / "mask.py", MASK_PROGRAM)


LOOP_PROGRAM = '''
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
from autokernel import interp_fixes
interp_fixes.install()


@triton.jit
def persistent(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    for tile in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):  # a grid-stride loop
        offs = tile.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)
    for j in tl.range(0, 2):
        tl.store(o_ptr + n + j, j.to(tl.float32))
    for k in tl.static_range(2):  # constexpr, as compiled
        tl.static_assert(k < 2)


x = torch.arange(100, dtype=torch.float32)
o = torch.zeros(102)
persistent[(3,)](x, o, 100, BLOCK=16)
assert torch.equal(o[:100], x * 2) and o[100:].tolist() == [0.0, 1.0], o
assert "range" not in persistent.fn.__globals__  # only for the launch
print("ok")
'''


def test_a_loop_variable_is_a_tensor_as_compiled(tmp_path):
    """`tile.to(tl.int64)` on a range() loop variable (a persistent kernel's int64 offsets): the bare interpreter
    hands out Python ints, and an honest silu_mul rewrite was rejected as runtime.exception."""
    _prints_ok(tmp_path / "loop.py", LOOP_PROGRAM)


def _prints_ok(script, program: str) -> None:
    """Run `program` in a process of its own (the fixes are global to the interpreter; this process's other tests
    run the shipped one: tests/kernels/test_interpreter_patch.py) and expect it to print ok."""
    script.write_text(textwrap.dedent(program))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
