"""Row softmax, y = softmax(x, dim=-1), for rows of any width: the vector role walks each row
block's columns in tiles of ``BN``, keeping a running maximum ``m`` and a running sum ``l`` of
exp(x - m) rescaled whenever the maximum grows (the online softmax of flash attention), then
walks them again to write exp(x - m) / l. A copy role streams the column tiles through a ring
of ``STAGES`` slots, both passes through the same ring, so the second pass's first loads
overlap the first pass's last tiles. The running maximum starts at float32's lowest finite
value and columns past ``N`` are left out of the sum by a mask (not by a sentinel value, which
rows below it would lose to): rows of huge negative values come out uniform, a row of -inf comes
out NaN, as in torch; rows past ``M`` are dropped by the store.

Programs walk the row blocks with ``xs.tile_range``. On Ascend both roles sit on one vector
core and the ring is a GM workspace; on Hopper the copy role is a 1-warp TMA producer; on the
CPU emulator each role is a thread.
"""
from __future__ import annotations

import torch

import xsync as xs

from ._host import backend_for, check_block, launch_rows, pow2, readable

EXAMPLE = dict(x=xs.bfloat16, y=xs.bfloat16, BM=16, BN=256, STAGES=2)


@xs.kernel(example=EXAMPLE)
def softmax_rows(x, y, M, N, BM: xs.constexpr, BN: xs.constexpr, STAGES: xs.constexpr):
    """y[M, N] = softmax of each row of x[M, N], float32 math, in y's dtype."""
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    cols = xs.pipe(load, work, stages=STAGES, x=xs.tile([BM, BN], x.dtype))
    for tile in xs.tile_range(xs.cdiv(M, BM)):
        row = tile * BM
        with work:
            m = xs.full([BM], -3.4028234663852886e38, xs.float32)     # float32's lowest
            l = xs.zeros([BM], xs.float32)
        for c in range(0, N, BN):              # pass 1: running max and sum
            with load:
                s = cols.acquire()
                s.x = xs.load(x, [row, c], [BM, BN])
                cols.commit()
            with work:
                got = cols.wait()
                v = got.x.to(xs.float32)
                cols.release()
                inside = (c + xs.arange(0, BN))[None, :] < N
                v = xs.where(inside, v, -3.4028234663852886e38)
                m_new = xs.maximum(m, xs.max(v, 1))
                p = xs.where(inside, xs.exp(v - m_new[:, None]), 0.0)
                l = l * xs.exp(m - m_new) + xs.sum(p, 1)
                m = m_new
        for c in range(0, N, BN):              # pass 2: normalize
            with load:
                s = cols.acquire()
                s.x = xs.load(x, [row, c], [BM, BN])
                cols.commit()
            with work:
                got = cols.wait()
                v = got.x.to(xs.float32)
                cols.release()
                xs.store(y, [row, c], (xs.exp(v - m[:, None]) / l[:, None]).to(y.dtype))


def softmax(x: torch.Tensor, *, backend=None, block: tuple[int, int] | None = None,
            programs: int | None = None) -> torch.Tensor:
    """softmax(x, dim=-1) in x's dtype; ``block`` = (rows, columns) of a tile (default: up to
    16 rows and up to 1024 columns, so a [BM, BN] fp32 tile stays <= 32 KB)."""
    backend = backend_for(backend)
    if x.dim() == 0:
        raise ValueError("x is a 0-d tensor: softmax runs over the last dimension")
    if x.numel() == 0:
        return torch.empty_like(x)
    x2 = readable(x.reshape(-1, x.shape[-1]))
    m, n = x2.shape
    if block is not None:
        bm, bn = check_block(block, 2)
    else:
        bn = min(pow2(n), 1024)
        bm = max(1, min(16, 8192 // bn))
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    launch_rows(softmax_rows, (x2, y, m, n), m, x.device, backend, dict(BN=bn, STAGES=2), bm, programs)
    return y.reshape(x.shape)
