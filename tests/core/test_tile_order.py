"""The attention kernel's tile order (kernels/flash_attn/tiles.py): every tile exactly once,
the causal deal balanced, and the kernel right under either order with fewer programs than
tiles (the emulator)."""
from __future__ import annotations

import math

import pytest
import torch

from xsync.kernels.flash_attn import ops, schedule, tiles
from xsync.kernels.flash_attn.kernel import attention_fwd


def _decode(table, tile_rows):
    pairs = table[0::2].tolist()
    blocks = [r // tile_rows for r in table[1::2].tolist()]
    assert all(r % tile_rows == 0 for r in table[1::2].tolist())
    return list(zip(pairs, blocks))


@pytest.mark.parametrize("group", [None, 0, 1, 2, 3, 16])
@pytest.mark.parametrize("pairs,row_blocks,programs", [(1, 1, 1), (3, 5, 4), (16, 128, 132),
                                                       (256, 8, 132), (7, 3, 100), (5, 9, 45)])
def test_every_tile_once(pairs, row_blocks, programs, group):
    table = tiles.order(pairs, row_blocks, 128, programs, group, "cpu")
    assert table.dtype == torch.int32 and table.numel() == 2 * pairs * row_blocks
    got = _decode(table, 128)
    assert sorted(got) == [(p, r) for p in range(pairs) for r in range(row_blocks)]


def test_without_a_mask_tiles_go_pair_by_pair_from_the_last_row_block():
    got = _decode(tiles.order(3, 4, 64, 5, None, "cpu"), 64)
    assert got == [(p, r) for p in range(3) for r in (3, 2, 1, 0)]


@pytest.mark.parametrize("group", [0, 1, 2, 3, 5])
def test_groups_are_row_block_major_inside_and_dealt_in_a_snake(group):
    """The reference: groups of ``group`` pairs in turn, each row-block-major (longest first),
    that sequence dealt in a snake over full turns."""
    pairs, row_blocks, programs = 7, 4, 5
    size = pairs if group == 0 else group
    ranked = [(p, r) for g0 in range(0, pairs, size) for r in reversed(range(row_blocks))
              for p in range(g0, min(pairs, g0 + size))]
    want = []
    for turn in range(-(-len(ranked) // programs)):
        seats = ranked[turn * programs:(turn + 1) * programs]
        if turn % 2 == 1 and len(seats) == programs:
            seats = seats[::-1]
        want += seats
    assert _decode(tiles._table(pairs, row_blocks, 64, programs, group, "cpu"), 64) == want


def test_a_group_that_deals_a_shape_badly_gives_way_to_one_group():
    """Causal 16k, 16 pairs on 132 programs: pairs one by one line the longest tiles up on the
    same programs (balance 0.65), so the table is one group's; at 1k (256 pairs) they deal
    well (0.94) and stay."""
    assert tiles.balance(16, 128, 132, 1) < tiles.BALANCE_FLOOR < tiles.balance(16, 128, 132, 0)
    assert torch.equal(tiles.order(16, 128, 128, 132, 1, "cpu"), tiles._table(16, 128, 128, 132, 0, "cpu"))
    assert tiles.balance(256, 8, 132, 1) > 0.9
    assert torch.equal(tiles.order(256, 8, 128, 132, 1, "cpu"), tiles._table(256, 8, 128, 132, 1, "cpu"))


@pytest.mark.parametrize("pairs,row_blocks,programs", [(16, 128, 132), (32, 64, 132), (64, 32, 132),
                                                       (128, 16, 132), (256, 8, 132), (16, 128, 24)])
def test_causal_work_is_dealt_evenly(pairs, row_blocks, programs):
    """Row block r costs r + 1 key blocks. Dealt by work, no program's share exceeds the mean
    by more than one longest tile (row_blocks); dealt by pair, 16k on 132 programs is 1.57x."""
    def shares(group):
        got = _decode(tiles.order(pairs, row_blocks, 128, programs, group, "cpu"), 128)
        return [sum(r + 1 for _, r in got[p::programs]) for p in range(programs)]
    fair = shares(0)
    mean = sum(fair) / programs
    assert max(fair) <= mean + row_blocks
    if (pairs, row_blocks, programs) == (16, 128, 132):
        assert max(fair) / mean < 1.01 and max(shares(None)) / mean > 1.5
    # the first turn hands out the longest tiles
    first = _decode(tiles.order(pairs, row_blocks, 128, programs, 0, "cpu"), 128)[:min(programs, pairs)]
    assert all(r == row_blocks - 1 for _, r in first)


def test_the_table_is_cached_per_shape():
    a = tiles.order(4, 4, 128, 3, 0, "cpu")
    assert tiles.order(4, 4, 128, 3, 0, "cpu") is a
    assert tiles.order(4, 4, 128, 3, None, "cpu") is not a


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [None, 0, 1, 3])
def test_kernel_with_fewer_programs_than_tiles(causal, group):
    """Three programs walk 2 x 4 pairs x 4 row blocks (ragged last block, GQA, Sq != Sk) in
    each order on the emulator; the output matches SDPA's."""
    torch.manual_seed(1)
    b, hq, hk, sq, sk, d = 2, 4, 2, 120, 150, 64
    q = torch.randn(b, hq, sq, d).bfloat16()
    k, v = torch.randn(b, hk, sk, d).bfloat16(), torch.randn(b, hk, sk, d).bfloat16()
    o = torch.empty_like(q)
    lse = torch.empty(b * hq, sq)
    cu_q, cu_k = ops._dense_offsets(b, sq, sk, q.device)
    plan = schedule.Schedule(BM=16, BN=32, STAGES=2, persistent=True, causal_group=group)
    ops.launch(attention_fwd, q.view(-1, d), k.view(-1, d), v.view(-1, d), o.view(-1, d), lse, cu_q, cu_k,
               sq, b, hq, hk, d, causal, 1 / math.sqrt(d), (hq, sq, 0, hk, sk, 0, hq, 0), "cpu", plan, 3)
    kf, vf = (t.float().repeat_interleave(hq // hk, 1) for t in (k, v))
    mask = None
    if causal:   # bottom-right aligned
        mask = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), kf, vf, attn_mask=mask)
    torch.testing.assert_close(o.float(), ref, atol=2e-2, rtol=2e-2)


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32)


def _packed_work(lens_q, lens_k, heads, tile_rows, block_keys, causal):
    """(pair, row block) -> key blocks + 2 of every tile that holds rows: the reference."""
    out = {}
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        for h in range(heads):
            for r in range(-(-lq // tile_rows)):
                hi = lk if not causal else max(0, min(lk, lk - (lq - r * tile_rows) + tile_rows))
                out[(b * heads + h, r)] = -(-hi // block_keys) + 2
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens_q,lens_k,programs", [
    ([128, 8192, 512, 4096, 256, 2048, 1024, 6144], None, 132),
    ([0, 64, 1, 31, 32, 33, 0], [5, 0, 64, 31, 100, 33, 7], 3),
    ([300], [20], 1),
    ([7, 7, 7, 7], None, 1000),
    ([1000, 3, 250, 0, 129], [999, 3, 1, 0, 700], 5),
])
def test_packed_tiles_with_rows_come_once_each_pair_by_pair(lens_q, lens_k, programs, causal):
    """The packed table holds every tile that has rows exactly once, ahead of any tile without
    rows; its length is the host's bound. One program per tile takes them pair by pair, the
    busiest pair first (ties in pair order), each pair's tiles longest first; persistent
    programs get that sequence dealt in the snake."""
    lens_k = lens_k or lens_q
    heads, tile_rows, block_keys = 3, 64, 32
    row_blocks = max(1, -(-max(lens_q) // tile_rows))
    count = tiles.packed_count(len(lens_q) * heads, row_blocks, heads, len(lens_q), sum(lens_q), tile_rows)
    work = _packed_work(lens_q, lens_k, heads, tile_rows, block_keys, causal)
    assert len(work) <= count <= len(lens_q) * heads * row_blocks
    pair_work = {}
    for (p, _), w in work.items():
        pair_work[p] = pair_work.get(p, 0) + w
    pairs = sorted(pair_work, key=lambda p: (-pair_work[p], p))
    want = [(p, r) for p in pairs for r in sorted((r for q, r in work if q == p), reverse=True)]
    ranked = _decode(tiles.packed_order(_cu(lens_q), _cu(lens_k), heads, row_blocks, tile_rows, block_keys,
                                        count, causal, count), tile_rows)
    assert ranked[:len(want)] == want and len(set(ranked)) == len(ranked) == count
    launched = min(programs, count)
    table = tiles.packed_order(_cu(lens_q), _cu(lens_k), heads, row_blocks, tile_rows, block_keys, launched,
                               causal, count)
    assert table.dtype == torch.int32 and table.numel() == 2 * count
    dealt = []
    for turn in range(-(-count // launched)):
        seats = ranked[turn * launched:(turn + 1) * launched]
        dealt += seats[::-1] if turn % 2 == 1 and len(seats) == launched else seats
    assert _decode(table, tile_rows) == dealt


def test_a_packed_launch_runs_only_the_tiles_that_can_hold_rows():
    """Sixteen sequences of 128..8192 tokens, 16 heads, 128-row tiles: the launch counts 5712
    tiles (5456 hold rows) instead of the 16384 of every (sequence, head, row block)."""
    lens = [128, 8192, 512, 4096, 256, 2048, 1024, 6144, 384, 3072, 768, 5120, 1536, 7168, 640, 2560]
    count = tiles.packed_count(16 * 16, 64, 16, 16, sum(lens), 128)
    assert count == 16 * (sum(lens) // 128 + 16) == 5712
    assert len(_packed_work(lens, lens, 16, 128, 128, False)) == 5456


def _check_packed(q, k, v, lens_q, lens_k, o, lse, causal):
    """Each packed sequence against a float32 reference (GQA by repetition, bottom-right causal
    mask); rows that see no key: O = 0."""
    hq, d = q.shape[1], q.shape[2]
    cu_q, cu_k = _cu(lens_q).tolist(), _cu(lens_k).tolist()
    for b in range(len(lens_q)):
        if lens_q[b] == 0:
            continue
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        qf = q[qs].transpose(0, 1).float()
        kf, vf = (t[ks].transpose(0, 1).float().repeat_interleave(hq // t.shape[1], 0) for t in (k, v))
        keep = torch.ones(lens_q[b], lens_k[b], dtype=torch.bool)
        if causal:
            keep = keep.tril(lens_k[b] - lens_q[b])
        scores = ((qf @ kf.transpose(1, 2)) / math.sqrt(d)).masked_fill(~keep, float("-inf"))
        seen = keep.any(1)
        ref = torch.softmax(scores, -1).nan_to_num(0.0) @ vf
        got = o[qs].transpose(0, 1).float()
        torch.testing.assert_close(got[:, seen], ref[:, seen], atol=2e-2, rtol=2e-2)
        assert (got[:, ~seen] == 0).all()
        torch.testing.assert_close(lse[:, qs][:, seen], torch.logsumexp(scores, -1)[:, seen], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_packed_launch_matches_the_reference(persistent, causal):
    """Packed sequences with empty ones, lengths at and around the tile size, q and k of other
    lengths, GQA; three persistent programs or one per tile, on the emulator."""
    torch.manual_seed(4)
    lens_q, lens_k = [0, 32, 1, 31, 45, 70, 0], [3, 0, 40, 31, 100, 33, 9]
    hq, hk, d = 4, 2, 64
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    q = torch.randn(sum(lens_q), hq, d).bfloat16()
    k, v = torch.randn(sum(lens_k), hk, d).bfloat16(), torch.randn(sum(lens_k), hk, d).bfloat16()
    o = torch.zeros_like(q)
    lse = torch.zeros(hq, sum(lens_q))
    plan = schedule.Schedule(BM=16, BN=32, STAGES=2, persistent=persistent)
    ops.launch(attention_fwd, q.view(-1, hq * d), k.view(-1, hk * d), v.view(-1, hk * d), o.view(-1, hq * d), lse,
               cu_q, cu_k, max(lens_q), len(lens_q), hq, hk, d, causal, 1 / math.sqrt(d), (1, 0, d, 1, 0, d, 0, 1),
               "cpu", plan, 3 if persistent else None, packed_tokens=sum(lens_q))
    _check_packed(q, k, v, lens_q, lens_k, o, lse, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_op_packs_the_tiles_of_a_persistent_non_causal_schedule(causal, monkeypatch):
    """attention_varlen under a persistent schedule (patched into the table for the CPU): the
    non-causal launch takes the packed table, the causal one every row block (ops.packs_tiles);
    both match the per-sequence reference."""
    from xsync.kernels.flash_attn import attention_varlen

    persistent = schedule.Schedule(BM=16, BN=32, STAGES=2, persistent=True)
    monkeypatch.setattr(schedule, "TABLE", (schedule.Row("cpu", None, None, None, persistent),))
    monkeypatch.setattr(ops, "programs", lambda backend, count, persistent=None, device=None: min(count, 3))
    made = []
    real = tiles.packed_order
    monkeypatch.setattr(tiles, "packed_order", lambda *a: made.append(a) or real(*a))
    torch.manual_seed(9)
    lens_q, lens_k = [40, 0, 3, 33], [40, 7, 50, 20]
    q = torch.randn(sum(lens_q), 2, 64).bfloat16()
    k, v = torch.randn(sum(lens_k), 1, 64).bfloat16(), torch.randn(sum(lens_k), 1, 64).bfloat16()
    o, lse = attention_varlen(q, k, v, _cu(lens_q), _cu(lens_k), max(lens_q), max(lens_k), causal=causal)
    assert bool(made) == (not causal) == ops.packs_tiles(persistent, causal)
    _check_packed(q, k, v, lens_q, lens_k, o, lse, causal)


def test_a_schedule_fixes_its_hopper_spellings_for_its_own_launch(monkeypatch):
    """A row's exp2_fma / reads_ahead are the options in force while its kernel launches (over
    the environment), and nowhere else; a row that fixes none launches under the caller's."""
    from xsync import config

    monkeypatch.delenv("XSYNC_NV_EXP2_FMA", raising=False)
    monkeypatch.delenv("XSYNC_NV_PREFETCH_TILE_SCALARS", raising=False)
    seen = []

    class Recorder:
        def __getitem__(self, grid):
            def run(*args, **constexprs):
                now = config.current()
                seen.append((now["nv_exp2_fma"], now["nv_prefetch_tile_scalars"]))
            return run

    q = torch.zeros(2 * 128, 64)
    lse = torch.zeros(2, 128)
    cu = torch.tensor([0, 128], dtype=torch.int32)
    base = schedule.Schedule(BM=16, BN=32, STAGES=2, persistent=False)
    assert base.fixed_options() == {}
    for plan in (base, schedule.Schedule(BM=16, BN=32, STAGES=2, persistent=False, exp2_fma="1/4", reads_ahead=True)):
        with config.options(nv_exp2_fma="1/2"):
            ops.launch(Recorder(), q, q, q, q, lse, cu, cu, 128, 1, 2, 2, 64, False, 0.125,
                       (2, 128, 0, 2, 128, 0, 2, 0), "cpu", plan)
    assert seen == [("1/2", None), ("1/4", True)]
    assert config.current()["nv_exp2_fma"] == "0"
