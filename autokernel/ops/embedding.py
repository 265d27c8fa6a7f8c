"""embedding: out = weight[ids] (llama's token_embd), ids (B, T) int32, weight (V, D)."""
import torch

from autokernel.ops.smollm2 import HIDDEN, VOCAB
from autokernel.ops.spec import OpSpec, Shape, elem_size, sample


def reference(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return weight.index_select(0, ids.reshape(-1)).reshape(*ids.shape, weight.shape[1])


def make_ids(B: int, T: int, V: int, device, gen) -> torch.Tensor:
    """Random ids (B, T) that include the table's first and last rows (off-by-one and bounds bugs): int64 three times
    in four, as the engine's tokenizer gives them, else int32 (a path keyed on the ids' width, `element_size() //
    8` in arithmetic, ran only on int32 before)."""
    wide = int(torch.randint(0, 4, (1,), generator=gen)) != 0
    ids = torch.randint(0, V, (B * T,), generator=gen, dtype=torch.int64 if wide else torch.int32)
    ids[0] = V - 1
    if B * T > 1:
        ids[-1] = 0
    return ids.reshape(B, T).to(device)


def make_inputs(shape: Shape, dtype, device, gen, dist="normal"):
    B, T, V, D = shape["B"], shape["T"], shape["V"], shape["D"]
    return {"ids": make_ids(B, T, V, device, gen), "weight": sample((V, D), dtype, device, gen, dist)}


def batch_tokens(ids: torch.Tensor) -> tuple[int, int]:
    """(B, T) of an ids tensor of any shape: its first dimension, and every other folded into T (a scalar: 1, 1)."""
    return (ids.shape[0], ids.numel() // ids.shape[0]) if ids.dim() else (1, 1)


def shape_of(ids, weight) -> Shape:
    B, T = batch_tokens(ids)
    return {"B": B, "T": T, "V": weight.shape[0], "D": weight.shape[1]}


SPEC = OpSpec(
    name="embedding",
    reference=reference,
    make_inputs=make_inputs,
    shape_of=shape_of,
    flops=lambda s: 0,
    bytes_moved=lambda s, dt: s["B"] * s["T"] * (2 * s["D"] * elem_size(dt) + 4),
    model_shapes=({"B": 1, "T": 1, "V": VOCAB, "D": HIDDEN}, {"B": 4, "T": 1, "V": VOCAB, "D": HIDDEN},
                  {"B": 4, "T": 24, "V": VOCAB, "D": HIDDEN}),
    odd_shapes=({"B": 1, "T": 1, "V": 1, "D": 6}, {"B": 3, "T": 7, "V": 123, "D": 431},
                {"B": 2, "T": 5, "V": 1823, "D": 42}),
    doc="Token embedding lookup: out[..., :] = weight[ids[...], :]. ids is int32 or int64 of any shape, weight "
        "(V, D); the output is ids.shape + (D,) in weight's dtype. A pure copy: no arithmetic, exact.",
    # the numeric stage sweeps batch and tokens (autokernel/gate/schedule.py) over a smaller table: the work per
    # token is the same, and a 113 MB table per swept case would make the sweep cost minutes of pickling
    extra={"sweep": ("B", "T"), "sweep_base": {"V": 4099}},
)
