"""The derived tolerance where an op amplifies rounding (OpSpec.rounding, autokernel/ops/tolerance.py).

Softmax attention over large logits (the gate's "mixed" values put |q| |k| in the hundreds) turns float32 rounding
in the logits into hundreds of ulps of the output. Eager torch's error there is one rounding order among many: the
bare rule (2 x eager + 4 ulps) rejected the project's own attention_decode kernel, and any float32 rewrite that sums
in another order, on such inputs. The rounding floor admits what float32 accumulation can do, element by element,
and nothing a lower precision does."""
from __future__ import annotations

import math

import pytest
import torch

from autokernel.gate import numeric
from autokernel.ops import get
from autokernel.ops.tolerance import judge, references

SPEC = get("attention_decode")
ODD = SPEC.odd_shapes[0]  # B 3, Hq 6, Hkv 2, S 300, L 257, D 48


def _case(dist: str, shape=ODD, seed: int = 3) -> dict:
    """The inputs of one gate case (numeric.make_case: seed 3 is one where the bare rule failed the incumbent)."""
    return numeric.make_case(SPEC, 0, (shape, torch.float32, dist, 1), seed).a


def _attend(kw: dict, perm: int | None = None, log2: bool = False, p_dtype=None, qk_dtype=None) -> torch.Tensor:
    """Decode attention in torch, as a kernel might compute it: head dims summed in another order (perm), the
    softmax in base 2 (log2, as kernels/attention_decode.py does), or with p / q and k rounded to a narrower dtype."""
    q, kc, vc, L = kw["q"], kw["k_cache"], kw["v_cache"], kw["kv_len"]
    g = q.shape[1] // kc.shape[1]
    k, v = kc[:, :, :L].repeat_interleave(g, 1), vc[:, :, :L].repeat_interleave(g, 1)
    if perm is not None:
        order = torch.randperm(q.shape[-1], generator=torch.Generator().manual_seed(perm))
        q, k = q[..., order], k[..., order]
    if qk_dtype is not None:
        q, k = q.to(qk_dtype).float(), k.to(qk_dtype).float()
    visible = (torch.arange(L)[None, :] >= kw["kv_start"][:, None])[:, None, None, :]
    s = q[:, :, None, :] @ k.transpose(-1, -2) * (kw["scale"] * (math.log2(math.e) if log2 else 1.0))
    s = s.masked_fill(~visible, -math.inf)
    p = (torch.exp2 if log2 else torch.exp)(s - s.amax(-1, keepdim=True))
    denom = p.sum(-1, keepdim=True)
    if p_dtype is not None:
        p = p.to(p_dtype).float()
    return ((p @ v) / denom)[:, :, 0]


def _verdict(out: torch.Tensor, kw: dict, floors: bool = True):
    r = references(SPEC, kw)
    return judge([out], r.ref64, r.eager, None, r.floors if floors else None)


@pytest.mark.parametrize("how", [{"log2": True}, {"perm": 1}, {"perm": 2}], ids=str)
def test_float32_attention_in_another_order_passes_on_large_logits(how):
    kw = _case("mixed")
    assert _verdict(_attend(kw, **how), kw).ok
    # the bare rule holds it to eager's own rounding order (the false rejection this floor removes)
    assert not _verdict(_attend(kw, **how), kw, floors=False).ok


def test_the_incumbent_kernel_passes_the_case_the_bare_rule_failed():
    from kernels.attention_decode import attention_decode
    kw = _case("mixed")
    out = attention_decode(**{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
    assert _verdict(out, kw).ok, _verdict(out, kw).detail
    assert not _verdict(out, kw, floors=False).ok


@pytest.mark.parametrize("dist,how", [("normal", {"p_dtype": torch.float16}), ("normal", {"qk_dtype": torch.bfloat16}),
                                      ("mixed", {"qk_dtype": torch.bfloat16}), ("normal", {"p_dtype": torch.bfloat16})],
                         ids=str)
def test_a_narrower_precision_is_still_rejected(dist, how):
    kw = _case(dist)
    j = _verdict(_attend(kw, **how), kw)
    assert j.reason == "numeric.mismatch" and "rounding floor" in j.detail, j.detail


def test_the_floor_is_per_element_not_the_largest_anywhere():
    """An output exact everywhere but off in one well-conditioned element by 10x that element's own bound (yet far
    below the largest floor, where logits are large) is rejected."""
    kw = _case("mixed")
    r = references(SPEC, kw)
    floor = r.floors[0]
    i = int(torch.argmin(floor))
    assert float(floor.max()) > 1000 * float(floor.reshape(-1)[i])  # a real spread, or the test proves nothing
    eager_err = float((r.eager[0].double() - r.ref64[0]).abs().max())
    out = r.ref64[0].clone()
    out.reshape(-1)[i] += 10 * 2 * max(float(floor.reshape(-1)[i]), eager_err)
    assert 10 * 2 * max(float(floor.reshape(-1)[i]), eager_err) < float(floor.max())
    j = judge([out.float()], r.ref64, r.eager, None, r.floors)
    assert j.reason == "numeric.mismatch", j.detail


def test_ops_without_a_floor_keep_the_bare_rule():
    kw = get("rmsnorm").make_inputs({"M": 4, "N": 64}, torch.float32, "cpu", torch.Generator().manual_seed(0))
    assert references(get("rmsnorm"), kw).floors == [None]
    assert references(SPEC, _case("normal", SPEC.odd_shapes[1])).floors[0] is not None


# Long dot products (autokernel/ops/rounding.py): on an H200 the project's own compiled float32 matmul, lm_head and
# matmul_q4_1 kernels were 1.1-1.5x over the bare rule, against cuBLAS's accurate blocked order. On the CPU, eager is
# as accurate, and accumulating one product at a time in float32 (what each GPU thread's FMA loop does) shows it.
DOT_CASES = [("matmul", {"M": 4, "N": 576, "K": 1536}), ("lm_head", {"M": 1, "V": 4096, "K": 576}),
             ("matmul_q4_1", {"M": 4, "N": 576, "K": 1536})]


def _dot_case(op: str, shape: dict, dist: str):
    spec = get(op)
    kw = spec.make_inputs(shape, torch.float32, "cpu", torch.Generator().manual_seed(0), dist)
    if op == "matmul_q4_1":
        from autokernel.ops.matmul_q4_1 import dequantize
        w = dequantize(kw["qs"], kw["d"].float(), kw["m"].float())
    else:
        w = kw["weight"]
    return kw["x"], w, references(spec, kw)


def _one_product_at_a_time(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    acc = torch.zeros(x.shape[0], w.shape[0])
    for k in range(x.shape[1]):
        acc += x[:, k:k + 1] * w[:, k]
    return acc


@pytest.mark.parametrize("op,shape", DOT_CASES, ids=[c[0] for c in DOT_CASES])
def test_float32_dot_products_in_sequential_order_pass(op, shape):
    x, w, r = _dot_case(op, shape, "normal")
    out = _one_product_at_a_time(x, w)
    assert judge([out], r.ref64, r.eager, None, r.floors).ok
    bare = judge([out], r.ref64, r.eager, None, [None])  # the bare rule rejects this valid order: the floor matters
    assert bare.reason == "numeric.mismatch", bare.detail


@pytest.mark.parametrize("dist", ["normal", "near_constant", "wide", "sparse", "tiny"])
@pytest.mark.parametrize("op,shape", DOT_CASES, ids=[c[0] for c in DOT_CASES])
def test_dot_products_in_a_narrower_precision_are_still_rejected(op, shape, dist):
    x, w, r = _dot_case(op, shape, dist)
    for narrow in (torch.float16, torch.bfloat16):  # fp16 rounds operands as tf32 does (10 mantissa bits)
        out = x.to(narrow).float() @ w.to(narrow).float().T
        j = judge([out], r.ref64, r.eager, None, r.floors)
        assert j.reason == "numeric.mismatch", (narrow, j.detail)
