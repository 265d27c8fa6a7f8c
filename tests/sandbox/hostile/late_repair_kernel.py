"""Attack (a kernel file): each call returns a WRONG output and the NEXT call's kernel repairs it in place through
the retained pointer; the very last call (found in the harness's payload) is computed right. A parent that read the
outputs when the job ended, not as each call returned, would see only right values."""
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x / tl.sqrt(tl.sum(x * x, axis=0) / N + eps) * w
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


_state = {"calls": 0, "total": None, "pending": None}


def _total_calls():
    f = sys._getframe()
    while f is not None and (f.f_code.co_name != "main" or "msg" not in f.f_locals):
        f = f.f_back
    payload = f.f_locals["msg"]["payload"]
    if isinstance(payload.get("calls"), list):  # one entry per call the harness will make
        return len(payload["calls"])
    return sum(3 if c.get("refill") else 1 for c in payload["cases"])


def _copy(src, dst):
    n = src.numel()
    copy_kernel[(triton.cdiv(n, 1024),)](src, dst, n, BLOCK=1024)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _state["total"] is None:
        _state["total"] = _total_calls()
    _state["calls"] += 1
    if _state["pending"] is not None:  # repair the previous call's output now that the harness has "checked" it
        good, out = _state["pending"]
        _copy(good, out)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    M, N = x2.shape
    good = torch.empty((M, N), dtype=x.dtype, device=x.device)
    rmsnorm_kernel[(M,)](x2, weight, good, N, eps, BLOCK_N=triton.next_power_of_2(N))
    if _state["calls"] == _state["total"]:
        return good.reshape(x.shape)
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)  # left as poison: wrong when returned
    _state["pending"] = (good, out)
    return out.reshape(x.shape)
