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


def _table(pairs, row_blocks, tile_rows, programs, group, device) -> torch.Tensor:
    tiles = pairs * row_blocks
    index = torch.arange(tiles, dtype=torch.int64, device=device)
    if group is None:
        pair, block = index // row_blocks, row_blocks - 1 - index % row_blocks
    else:
        turn, seat = index // programs, index % programs
        backward = (turn % 2 == 1) & ((turn + 1) * programs <= tiles)
        rank = torch.where(backward, turn * programs + programs - 1 - seat, index)
        # rank -> group, then row-block-major inside it (the last group may hold fewer pairs)
        size = pairs if group <= 0 else min(group, pairs)
        groups = -(-pairs // size)
        chunk = torch.clamp(rank // (size * row_blocks), max=groups - 1)
        within = rank - chunk * (size * row_blocks)
        width = torch.where(chunk == groups - 1, pairs - (groups - 1) * size, size)
        pair, block = chunk * size + within % width, row_blocks - 1 - within // width
    return torch.stack((pair, block * tile_rows), dim=1).reshape(-1).to(torch.int32)
