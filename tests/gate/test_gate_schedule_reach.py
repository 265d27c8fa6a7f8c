"""Where the numeric stage's plan looks (autokernel/gate/schedule.py, numeric._past_cap), as units: each rule here
was added for a red-team shortcut that was exact everywhere the plan sampled (the whole-gate runs are the fixtures
named in each test, tests/gate/test_gate_cheats.py)."""
import random

import torch

from autokernel.gate import numeric, schedule
from autokernel.ops import get
from autokernel.ops.spec import sample


def _traced(op: str) -> list[dict]:
    return [dict(s) for s in get(op).model_shapes]


def test_the_batch_reaches_production_decode_batches_at_a_cheap_base():
    """rope/attention_decode persistent grids that stop after a fixed number of (batch, head) pairs: the batch was
    swept only within the traced shape's budget (B <= 9); past it, at a cheaper base, it goes on (fixtures
    attention_decode/persistent_two_waves: wrong from B = 11). That base has a context of its own: batches past the
    heads count at a two-position (one-token) base were exact for a kernel reading two positions there
    (attention_decode/bigbatch_two_positions, rope/bigbatch_first_position, attention/bigbatch_ignores_padding)."""
    for op, length in (("attention_decode", "L"), ("rope", "T"), ("attention", "T")):
        secret = set()
        for seed in range(6):
            swept = schedule.sweep_shapes(get(op), _traced(op), seed=seed)
            assert max(s["B"] for s in swept) >= 61, (op, swept)
            past_heads = [s for s in swept if 10 <= s["B"] <= 31]
            assert past_heads and all(s[length] >= 3 for s in past_heads), (op, swept)
            secret |= {s[length] for s in past_heads}
            if op == "attention_decode":
                assert all(s["S"] >= s["L"] for s in swept)
        assert len(secret) > 1, (op, secret)  # the short context is the seed's, not a constant


def test_threshold_crossings_run_in_every_dtype_and_the_rest_take_turns():
    """rmsnorm/half_pack_rows (two half-precision rows per program past 256) and silu_mul/fast_sigmoid_half_prefill
    (a cheaper sigmoid for half-precision batches past 512): past a threshold the path may depend on the dtype."""
    spec = get("rmsnorm")
    dtypes = list(spec.dtypes)
    for seed in range(4):
        grid = schedule.plan(spec, None, None, None, ("normal", "mixed"), seed=seed, max_rows=1024,
                             thresholds={256})
        for m in (256, 257):
            assert {dt for s, dt, _, _ in grid if s["M"] == m} == set(dtypes)
        base = [dict(s) for s in (*spec.model_shapes, *spec.odd_shapes)]
        turns = [dt for s, dt, _, calls in grid if calls == schedule.SINGLE and s not in base
                 and s["M"] not in (255, 256, 257)]
        assert len(turns) >= 6 and all(set(turns[i:i + 3]) == set(dtypes) for i in range(len(turns) - 2)), turns


def test_threshold_crossings_run_on_every_traced_width():
    """matmul_q4_1/narrow_prefill_symmetric: int(N < 256) * int(M > 128) -- the crossing M = 129 ran only on the
    widest traced (N, K); now on each, within the sweep's budget."""
    spec = get("matmul_q4_1")
    grid = schedule.plan(spec, None, None, None, ("normal", "mixed"), seed=3, max_rows=1024, thresholds={128})
    widths = {(s["N"], s["K"]) for s, _, _, _ in grid if s["M"] == 129}
    assert widths == {(s["N"], s["K"]) for s in spec.model_shapes}, widths


def test_past_the_cap_the_secret_sizes_are_one_past_a_block_multiple():
    """rmsnorm/tail_one_row: a grid that rounds the rows down leaves the last row of M = 64k + 1 unwritten, only past
    the interpreter's cap; a random odd size per octave hit it about one time in 32."""
    class Runner:
        spec, seed = get("rmsnorm"), 0

    class Cover:
        thresholds, max_rows, production_rows = set(), 1024, 8192
    planned = [(s, torch.float32, "normal", 1) for s in get("rmsnorm").model_shapes]
    seen = set()
    for seed in range(6):
        Runner.seed = seed
        _, octaves = numeric._past_cap(Runner(), planned, Cover(), "M")
        assert len(octaves) == 3 and all(s["M"] % numeric.TAIL_BLOCK == 1 for s in octaves), octaves
        seen |= {s["M"] for s in octaves}
    assert len(seen) > 6  # still drawn: 8 to 32 choices an octave


def test_the_outliers_distribution_reaches_what_llm_residual_streams_carry():
    """rmsnorm/outlier_clip_pad and floor_softclip: exact below 1,000; SmolLM2's residual stream reaches 22,552."""
    x = sample((64, 576), torch.float32, "cpu", torch.Generator().manual_seed(0), "outliers")
    far = x.abs() > 100
    assert 0.5 / 64 < far.float().mean() < 2 / 64
    assert x.abs().max() > 1e4 and (x.abs()[~far] < 10).all()
    assert (x[far] < 0).any() and (x[far] > 0).any()
    r = random.Random(0)  # the positions differ per row
    rows = [tuple(far[i].nonzero().flatten().tolist()) for i in r.sample(range(64), 8)]
    assert len(set(rows)) == 8


def _plan(op: str, seed: int, max_rows: int = 1024) -> list:
    return numeric.plan(get(op), None, None, None, seed, max_rows)


def test_outliers_run_at_every_size_the_sweep_and_the_range_check():
    """add_rmsnorm/window_softclip_outliers: a soft clip of large values taken for N/4 < M < 1.5 N, a window computed
    from N with no literal: the outliers ran only at the literal crossings and the top of the range."""
    spec = get("add_rmsnorm")
    base = [dict(s) for s in (*spec.model_shapes, *spec.odd_shapes)]  # every distribution there already
    for seed in range(3):
        grid = _plan("add_rmsnorm", seed)
        mixed = {(tuple(s.items()), dt) for s, dt, d, _ in grid if d == "mixed" and s not in base}
        outl = {(tuple(s.items()), dt) for s, dt, d, _ in grid if d == "outliers"}
        assert mixed <= outl, list(mixed - outl)[:3]
        assert any(145 < s["M"] < 863 for s, _, d, _ in grid if d == "outliers")


def test_the_top_of_the_range_runs_on_every_traced_width():
    """matmul_q4_1 b_q41_prefill_onetile (red team): one K tile of 1,024 in prefills past 192 rows dropped
    ffn_down's columns past 1,024; the range grew M at K = 576 only."""
    spec = get("matmul_q4_1")
    for seed in range(3):
        grid = _plan("matmul_q4_1", seed)
        for t in spec.model_shapes:
            far = [d for s, _, d, _ in grid if (s["N"], s["K"]) == (t["N"], t["K"]) and s["M"] > 900]
            assert {"mixed", "outliers"} <= set(far), (t, far)


def test_long_sequences_are_checked_with_a_padded_row():
    """attention c_attn_long_nopad (red team): the padding mask skipped past 1,000 tokens; the range ran one batch
    row, never padded. Every range case of the two attention ops now has two rows, one of them padded."""
    for op, dim in (("attention", "T"), ("attention_decode", "L")):
        spec = get(op)
        ranged = schedule.range_shapes(spec, _traced(op), 3, 1024)
        assert ranged and all(s["B"] == 2 for s in ranged)
        top = max(ranged, key=lambda s: s[dim])
        kw = spec.make_inputs(top, torch.float32, "cpu", torch.Generator().manual_seed(1), "normal")
        assert kw["kv_start"].tolist().count(0) == 1, kw["kv_start"]  # one row unpadded, the other padded


def test_odd_shapes_of_one_row_are_checked_with_three():
    """softmax/split_row_shared_scratch: a 128,256-entry row split across programs with a scratch table shared by
    every row was exact on the one-row odd shape."""
    grid = _plan("softmax", 1)
    assert any(s == {"M": 3, "V": 128256} for s, _, _, _ in grid)


def test_a_numeric_failure_names_the_written_argument_and_the_scalars():
    """A new user's report: 'output 1: max error 2.86' for a launcher that returns None said nothing of which
    argument (residual), and a kernel exact only at the model's eps failed at an eps the message did not show."""
    from autokernel.gate import judge
    assert judge._named("output 1: max error 2.86 vs bound", ["x", "residual"]) == \
        "output 1 (residual): max error 2.86 vs bound"
    assert judge._named("output 2: max error", ["x"]) == "output 2: max error"
    assert judge._scalars({"x": torch.zeros(1), "eps": 1.234567e-5, "n": 7}) == " (eps=1.235e-05, n=7)"


def test_the_calls_past_the_cap_do_not_depend_on_this_machines_speed(monkeypatch):
    """rmsnorm/tail_one_row was accepted on a loaded CI machine: the calls past the interpreter's cap were chosen by
    their estimated seconds alone, so a machine four times slower made none. The floor (numeric.REACH_WORK) is in
    work: the same calls at any measured speed; the time budget only adds calls on a fast machine."""
    from types import SimpleNamespace
    spec = get("rmsnorm")
    planned = numeric.plan(spec, None, None, None, 0, 1024, set())
    big = max((p[0] for p in planned), key=lambda s: schedule.cost(spec, s))
    made: list[list] = []
    monkeypatch.setattr(numeric, "_chunked", lambda runner, cases, *a: cases)
    monkeypatch.setattr(numeric, "run_chunks", lambda runner, chunks, slots: made.append(chunks))

    def reached(seconds_at_cap: float) -> list[int]:
        made.clear()
        runner = SimpleNamespace(spec=spec, seed=0, shape_of={"big": big}, call_s={"big": seconds_at_cap},
                                 limits=SimpleNamespace(memory_mb=1 << 20), steered=0)
        cover = numeric.Cover(0, 1024, 2048, frozenset())
        out = numeric._reach(runner, planned, {}, [], cover)
        assert out["past_cap_checked"] + ([out["rows"]] if out["checked"] else []) == \
            sorted(s["M"] for s, *_ in (made[0] if made else []))
        return sorted(s["M"] for s, *_ in (made[0] if made else []))

    idle, loaded = reached(7.5), reached(600.0)
    assert loaded and loaded == idle, (idle, loaded)  # the octave (1024, 2048] and production's maximum both times
    assert max(loaded) > 2048 - 128 and any(1024 < m < 2048 and m % numeric.TAIL_BLOCK == 1 for m in loaded), loaded
    monkeypatch.setattr(numeric, "REACH_WORK", 0.0)
    monkeypatch.setattr(numeric, "REACH_TOP_WORK", 0.0)
    assert reached(600.0) == [], "without the floor a slow machine makes none (the CI failure)"


def test_production_maximum_joins_the_floor_where_its_work_is_linear(monkeypatch):
    """rmsnorm/wide_rows_past_floor (every row 1% off past M = 4N, by arithmetic: nothing to cross, no condition)
    was accepted wherever the time budget did not afford production's maximum: the floor of REACH_WORK cap calls
    reached the first octave past the cap only. Production's maximum now joins the floor where its work is at most
    REACH_TOP_WORK cap calls (rows-linear ops); a quadratic op's (prefill attention at 8k tokens) stays a stated gap."""
    from types import SimpleNamespace
    monkeypatch.setattr(numeric, "_chunked", lambda runner, cases, *a: cases)
    made: list[list] = []
    monkeypatch.setattr(numeric, "run_chunks", lambda runner, chunks, slots: made.append(chunks))

    def reach(op: str) -> dict:
        spec = get(op)
        planned = numeric.plan(spec, None, None, None, 0, 1024, set(), production_rows=8192)
        big = max((p[0] for p in planned), key=lambda s: schedule.cost(spec, s))
        runner = SimpleNamespace(spec=spec, seed=0, shape_of={"big": big}, call_s={"big": 600.0},  # a slow machine
                                 limits=SimpleNamespace(memory_mb=1 << 20), steered=0)
        return numeric._reach(runner, planned, {}, [], numeric.Cover(0, 1024, 8192, frozenset()))

    for op in ("rmsnorm", "add_rmsnorm", "silu_mul", "attention_decode", "embedding_q8_0"):
        out = reach(op)
        assert out["checked"] and out["vouched"] == out["rows"] > 8192 - 8192 // 64, (op, out)
    out = reach("attention")
    assert not out["checked"] and out["vouched"] == 1024, out


def test_a_joint_corner_has_a_large_batch_and_a_long_context_together():
    """attention_decode/corner_scale_bigbatch_longctx (x 1.5 scale at B >= 16 and kv_len >= 128, integer arithmetic):
    the plan moved one axis at a time. A corner case puts both past production's thresholds at once, secret sizes,
    on one head group; rope and the prefill get one too."""
    for op, length in (("attention_decode", "L"), ("attention", "T"), ("rope", "T")):
        spec = get(op)
        corners = set()
        for seed in range(8):
            plan = schedule.plan(spec, None, None, None, ("normal", "mixed"), seed=seed, max_rows=1024)
            joint = [s for s, *_ in plan if s["B"] >= schedule.CORNER_BATCH[0] and s[length] >= 32]
            assert joint, (op, seed)
            corners.add((joint[-1]["B"], joint[-1][length]))
            if op == "attention_decode":
                assert any(s["L"] >= 128 for s in joint), joint
        assert len(corners) > 1, corners  # secret: the seed's, not a constant


def test_far_positions_end_a_random_row_and_outliers_sit_in_channel_runs():
    """rope_far_nonlast (positions past 8,180 off in every row but the last) and add_rmsnorm_channel_run_long (a
    channel large in six consecutive rows, only past 512 rows) were exact on the gate's inputs: the far positions
    always ended the last row, and outliers were scattered one by one. Now a random row ends at the context's last
    position, and a few channels are far out down runs of rows, as an LLM's massive activations are; drawing them
    leaves the case's generator where it was."""
    from autokernel.ops.rope import CONTEXT, make_positions
    far_rows = {int(make_positions(4, 5, "cpu", torch.Generator().manual_seed(s))[:, -1].argmax()) for s in range(24)}
    assert len(far_rows) > 2, far_rows
    g = torch.Generator().manual_seed(0)
    x = sample((600, 576), torch.float32, "cpu", g, "outliers")
    after = torch.randn(3, generator=g)
    big = x.abs() >= 100
    runs = (big[:-5] & big[1:-4] & big[2:-3] & big[3:-2] & big[4:-1] & big[5:]).any(0)  # 6 rows in a row, a channel
    assert bool(runs.any())
    g2 = torch.Generator().manual_seed(0)
    torch.randn((600, 576), generator=g2), torch.rand((600, 576), generator=g2), torch.rand((600, 576), generator=g2)
    assert torch.equal(after, torch.randn(3, generator=g2))  # the case's other values stay the seed's
    assert int(make_positions(4, 5, "cpu", torch.Generator().manual_seed(0)).max()) < CONTEXT
