# Row softmax of logits / temperature in float32, one program per row, the row streamed in BLOCK_V chunks twice (an
# online max/sum pass, then a normalise pass), so any vocab fits (SmolLM2: 49152 = 48 chunks of 1024). Bandwidth-bound
# at 2 reads + 1 float32 write per logit; few rows (M = 1..4 at decode) use few SMs, so small M is latency-bound.
import torch
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(
    # pointers
    logits_ptr, probs_ptr,
    # sizes
    V, stride_logits, stride_probs, temperature,
    # meta-parameters
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    src = logits_ptr + row.to(tl.int64) * stride_logits
    dst = probs_ptr + row.to(tl.int64) * stride_probs
    # pass 1: running max m and running sum s of exp(x - m), rescaled whenever m grows
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = tl.load(src + cols, mask=cols < V, other=float("-inf")).to(tl.float32) / temperature
        m_new = tl.maximum(m, tl.max(x, axis=0))  # finite: every chunk holds at least one real logit
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    # pass 2: normalise
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = cols < V
        x = tl.load(src + cols, mask=mask, other=float("-inf")).to(tl.float32) / temperature
        tl.store(dst + cols, tl.exp(x - m) / s, mask=mask)


def softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """probs = softmax(logits / temperature, -1) in float32; logits (M, V) in any float dtype, temperature > 0."""
    assert logits.dim() == 2 and temperature > 0, (logits.shape, temperature)
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    M, V = logits.shape
    probs = torch.empty((M, V), dtype=torch.float32, device=logits.device)
    softmax_kernel[(M,)](logits, probs, V, logits.stride(0), probs.stride(0), float(temperature),
                         BLOCK_V=1024, num_warps=4)  # untuned starting point for the autotuner
    return probs
