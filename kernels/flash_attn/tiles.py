"""The tile order of the attention kernel: which (sequence, head) pair and which query rows
each index of its tile loop stands for.

The kernel reads its tiles from a small int32 table, ``order[2 * i]`` the pair (``b * heads +
h``) and ``order[2 * i + 1]`` the tile's first query row, so the host decides the order and
the kernel (and its verifier, which checks every value of those two scalars) stays the same
for every order. Program ``p`` of ``P`` takes indices ``p, p + P, p + 2P, ...``
(``xs.tile_range``); one program per tile takes index ``p``.

Two orders, for ``pairs`` pairs of ``row_blocks`` tiles of ``tile_rows`` rows (R = row_blocks)::

    by pair (every tile costs the same: no mask)
        index:  0        1        ...  R-1      R        ...
        tile:   (0, R-1) (0, R-2) ...  (0, 0)   (1, R-1) ...     (pair, row block)
        programs running at once share a pair's K and V in L2

    by work (causal: row block r costs r + 1 key blocks), in groups of g pairs
        ranked: group 0's row blocks, longest first -- (0, R-1) (1, R-1) ... (g-1, R-1)
        (0, R-2) ... (g-1, 0) -- then group 1's, ...; dealt to the P programs in a snake:
        turn t (ranks tP .. tP+P-1) from program 0 up when t is even, from program P-1
        down when t is odd (a last partial turn: from 0 up)

        turn 0:  p0 <- longest      p1            ...  pP-1
        turn 1:  p0                 p1            ...  pP-1 <- next longest
        turn 2:  p0 <- ...

Packed sequences (varlen) of different lengths: the host knows only the longest, so
``pairs * row_blocks`` tiles would mostly hold no rows (16 sequences of 128..8192 tokens:
11k of 16k), and each still costs a program or a loop turn. ``packed_count`` bounds the tiles
that hold rows from the token count alone (no device-to-host copy), and ``packed_order`` makes
the table on the device from the cumulative lengths: the tiles with rows, pair by pair, the
busiest pair first and each pair's longest tile first (dealt in the snake above to persistent
programs; in that order to one program per tile, which the GPU starts in index order), then
tiles without rows up to the bound.

Dealt by pair, a causal 16k launch of 128-row tiles on 132 programs gives the busiest program
1.57x the mean work; by work in one group, 1.01x. Smaller groups keep fewer pairs' K and V
in flight at once (each pair's tiles run close together) at some cost in balance; the schedule
table picks the group (``Schedule.causal_group``).
"""
from __future__ import annotations

import torch

_CACHE: dict = {}
# a group dealing the busiest program more than 1/0.85 of the mean work (balance()) for a shape
# is replaced by one group of all pairs: small groups keep K and V in L2 but can line long
# tiles up on the same programs (a causal 16k launch in groups of one pair: 0.65)
BALANCE_FLOOR = 0.85


def order(pairs: int, row_blocks: int, tile_rows: int, programs: int, group: int | None,
          device) -> torch.Tensor:
    """The ``[2 * pairs * row_blocks]`` int32 table (see the module docstring). ``group``:
    None deals by pair; g >= 1 deals by work within groups of g pairs, or in one group where
    g deals this shape badly (``balance`` below ``BALANCE_FLOOR``); 0: one group. Made with
    device operations (so a CUDA graph can capture it) and cached per shape and device
    (except while a CUDA graph is being captured: the graph's copy is filled when it replays)."""
    key = (pairs, row_blocks, tile_rows, programs, group, str(device))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    if group and balance(pairs, row_blocks, programs, group) < BALANCE_FLOOR:
        group = 0
    table = _table(pairs, row_blocks, tile_rows, programs, group, device)
    capturing = torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not capturing:
        if len(_CACHE) > 256:
            _CACHE.clear()
        _CACHE[key] = table
    return table


def balance(pairs: int, row_blocks: int, programs: int, group: int) -> float:
    """Mean over largest share of the work dealt by work in groups of ``group`` pairs, a tile
    of row block r costing r + 2 key blocks (its r + 1, and about one more for its prologue
    and epilogue): 1.0 is an even deal."""
    table = _table(pairs, row_blocks, 1, programs, group, "cpu")
    work = table[1::2].to(torch.int64) + 2
    shares = torch.zeros(programs, dtype=torch.int64)
    shares.index_add_(0, torch.arange(work.numel()) % programs, work)
    return float(shares.sum()) / programs / float(shares.max())


def _snake(count: int, programs: int, device) -> torch.Tensor:
    """For each of ``count`` table indices, the rank it holds when ranks are dealt to
    ``programs`` programs in a snake (module docstring): full odd turns run backwards."""
    index = torch.arange(count, dtype=torch.int64, device=device)
    turn, seat = index // programs, index % programs
    backward = (turn % 2 == 1) & ((turn + 1) * programs <= count)
    return torch.where(backward, turn * programs + programs - 1 - seat, index)


def _entries(pair: torch.Tensor, block: torch.Tensor, tile_rows: int) -> torch.Tensor:
    """The int32 table: pair and first row of each tile, interleaved."""
    return torch.stack((pair, block * tile_rows), dim=1).reshape(-1).to(torch.int32)


def _table(pairs, row_blocks, tile_rows, programs, group, device) -> torch.Tensor:
    if group is None:
        index = torch.arange(pairs * row_blocks, dtype=torch.int64, device=device)
        pair, block = index // row_blocks, row_blocks - 1 - index % row_blocks
    else:
        rank = _snake(pairs * row_blocks, programs, device)
        # rank -> group, then row-block-major inside it (the last group may hold fewer pairs)
        size = pairs if group <= 0 else min(group, pairs)
        groups = -(-pairs // size)
        chunk = torch.clamp(rank // (size * row_blocks), max=groups - 1)
        within = rank - chunk * (size * row_blocks)
        width = torch.where(chunk == groups - 1, pairs - (groups - 1) * size, size)
        pair, block = chunk * size + within % width, row_blocks - 1 - within // width
    return _entries(pair, block, tile_rows)


def packed_count(pairs: int, row_blocks: int, heads: int, sequences: int, tokens: int, tile_rows: int) -> int:
    """Tiles of a packed launch: at most ``pairs * row_blocks``, and at most the tiles that can
    hold rows -- sum over sequences of ceil(len / tile_rows) <= tokens // tile_rows + sequences,
    per head (each sequence leaves at most one partial tile) -- when the lengths sum to
    ``tokens`` (the varlen contract)."""
    return max(0, min(pairs * row_blocks, heads * (tokens // tile_rows + sequences)))


def packed_order(cu_q: torch.Tensor, cu_k: torch.Tensor, heads: int, row_blocks: int, tile_rows: int,
                 block_keys: int, programs: int, causal: bool, count: int) -> torch.Tensor:
    """The ``[2 * count]`` int32 table of a packed launch (module docstring), made on the
    lengths' device with no host sync (a CUDA graph captures it). A tile of ``r`` rows left
    costs the key blocks it visits plus about two for its prologue and epilogue. Pairs go by
    their work, the busiest first (ties in pair order: one sequence's heads stay together),
    each pair's tiles together, longest first -- so programs running at once share few pairs'
    K and V, which stay in L2 (ranked tile by tile across pairs, a causal launch of the varlen
    benchmark ran 6% slower: runs/flash_attn_ab_20261204_varlen_a.json); tiles without rows
    (rows_left <= 0: the kernel skips them) last."""
    lens_q = (cu_q[1:] - cu_q[:-1]).to(torch.int64)
    lens_k = (cu_k[1:] - cu_k[:-1]).to(torch.int64)
    pairs = lens_q.numel() * heads
    index = torch.arange(pairs * row_blocks, dtype=torch.int64, device=cu_q.device)
    pair, block = index // row_blocks, index % row_blocks
    seq = pair // heads
    q_len, k_len = lens_q[seq], lens_k[seq]
    rows_left = q_len - block * tile_rows
    hi = k_len
    if causal:      # as the kernel's bound: bottom-right aligned, the tile's last row
        hi = torch.clamp(torch.minimum(k_len, k_len - rows_left + tile_rows), min=0)
    real = rows_left > 0
    work = torch.where(real, (hi + block_keys - 1) // block_keys + 2, 0)
    pair_rank = torch.empty(pairs, dtype=torch.int64, device=cu_q.device)
    by_work = torch.sort(work.view(pairs, row_blocks).sum(1), descending=True, stable=True).indices
    pair_rank[by_work] = torch.arange(pairs, dtype=torch.int64, device=cu_q.device)
    key = torch.where(real, pair_rank[pair] * row_blocks + (row_blocks - 1 - block), pairs * row_blocks + index)
    ranked = torch.sort(key).indices[:count]
    if programs < count:    # persistent: deal the ranks in a snake (the busiest pair's longest to program 0)
        ranked = ranked[_snake(count, programs, cu_q.device)]
    return _entries(ranked // row_blocks, ranked % row_blocks, tile_rows)
