"""Run as a script: CHECKOUT's references (examples/liger/reference.py) against its vendored Liger launchers, under
the CPU interpreter with autokernel's compatibility layer, at the tiny Llama's shapes and one odd shape, in float32
and bfloat16. A process of its own: the compatibility layer patches triton for the whole process."""
import sys

from autokernel import device

device.ensure_interpreter()
from autokernel import interp  # noqa: E402

interp.install()
sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402
from llama_liger import reference as ref  # noqa: E402
from llama_liger.ops import rms_norm, rope, swiglu  # noqa: E402

TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2}


def close(got, want, dtype, what):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    err = (got.float() - want.float()).abs().max().item()
    assert err <= TOL[dtype] * max(1.0, want.float().abs().max().item()), (what, dtype, err)


g = torch.Generator().manual_seed(0)
for dtype in (torch.float32, torch.bfloat16):
    for rows, hidden in ((7, 64), (3, 123)):
        x, w = torch.randn(rows, hidden, generator=g).to(dtype), torch.randn(hidden, generator=g).to(dtype)
        out = rms_norm.rms_norm_forward(x.clone(), w, 1e-5, 0.0, "llama", None)
        for i, want in zip((0, 2), ref.rms_norm_forward(x, w, 1e-5, 0.0, "llama", None)):
            close(out[i], want, dtype, f"rms_norm output {i}")
        a, b = (torch.randn(rows, 172, generator=g).to(dtype) for _ in range(2))
        close(swiglu.swiglu_forward(a.clone(), b.clone())[2], ref.swiglu_forward(a, b)[0], dtype, "swiglu")
    for seq, hq, hk, hd in ((7, 4, 2, 16), (5, 3, 1, 24)):
        q = torch.randn(1, hq, seq, hd, generator=g).to(dtype)
        k = torch.randn(1, hk, seq, hd, generator=g).to(dtype)
        ang = torch.randn(1, seq, hd // 2, generator=g)
        cos, sin = torch.cat((ang.cos(), ang.cos()), -1).to(dtype), torch.cat((ang.sin(), ang.sin()), -1).to(dtype)
        got = rope.rope_forward(q.clone(), k.clone(), cos, sin)
        for i, want in enumerate(ref.rope_forward(q, k, cos, sin)):
            close(got[i], want, dtype, f"rope output {i}")
print("references agree with the vendored launchers")
