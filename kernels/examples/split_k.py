"""Split-K GEMM: C = A @ B with the K range cut into splits, so that a small M x N still fills
the machine. Program (t, s) computes output tile t over split s; the partial tiles of every
split are added into a float32 C with ``xs.store(..., reduce="add")`` (atomic adds), and the
torch function casts the finished sum to the output dtype after the launch (the sum is complete
only when the launch ends, docs/tutorial.md §9).

The matrix role hands its partial tile to a vector role that adds it (the form FA3's backward
uses for dQ): on Ascend a GM atomic runs on a vector core (a reduce-add from the cube is
refused at check), and a kernel with matrix work needs the scope source form
(``XSYNC_ASCEND_FORM=scope``, triton-ascend 3.2.1+) so that one of the two vector cores adds.
On Hopper the tile crosses shared memory to a reducer warpgroup and leaves as atomic adds (a
TMA bulk reduce-add where the tile is staged); on the CPU emulator each role is a thread.
"""
from __future__ import annotations

import torch

import xsync as xs

from ._host import backend_for, check_block, check_matrix, readable

EXAMPLE = dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=128, BN=128, BK=64, STAGES=3)


@xs.kernel(example=EXAMPLE)
def gemm_split_k(a, b, c, M, N, K, K_PER_SPLIT, BM: xs.constexpr, BN: xs.constexpr,
                 BK: xs.constexpr, STAGES: xs.constexpr):
    """c[M, N] += A @ B over K splits of ``K_PER_SPLIT`` (a multiple of BK): program (t, s) adds
    tile t's product over split s; launch a (tiles, splits) grid on a zeroed float32 ``c``."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    red = xs.role("reduce", kind="vector")
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    part = xs.pipe(mma, red, stages=1, t=xs.tile([BM, BN], xs.float32))
    tiles_n = xs.cdiv(N, BN)
    off_m = xs.program_id(0) // tiles_n * BM
    off_n = xs.program_id(0) % tiles_n * BN
    k0 = xs.program_id(1) * K_PER_SPLIT
    k1 = xs.minimum(k0 + K_PER_SPLIT, K)
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for k in range(k0, k1, BK):
        with load:
            slot = tiles.acquire()
            slot.a = xs.load(a, [off_m, k], [BM, BK])
            slot.b = xs.load(b, [k, off_n], [BK, BN])
            tiles.commit()
        with mma:
            ab = tiles.wait()
            acc = xs.mma(ab.a, ab.b, acc)
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
    with mma:
        out = part.acquire()
        out.t = acc
        part.commit()
    with red:
        got = part.wait()
        xs.store(c, [off_m, off_n], got.t, reduce="add")
        part.release()


def matmul_split_k(a: torch.Tensor, b: torch.Tensor, splits: int | None = None, *,
                   out_dtype: torch.dtype | None = None, backend=None,
                   block: tuple[int, int, int] = (128, 128, 64), stages: int = 3) -> torch.Tensor:
    """a @ b for a [M, K], b [K, N], accumulated in float32 over ``splits`` K ranges (default:
    enough programs to fill the device, at most one split per BK columns of K); the result in
    ``out_dtype`` (a's dtype)."""
    backend = backend_for(backend)
    check_matrix("a", a)
    check_matrix("b", b)
    (m, k), n = a.shape, b.shape[1]
    if b.shape[0] != k:
        raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: inner dimensions differ")
    bm, bn, bk = check_block(block, 3)
    if m == 0 or n == 0:
        return torch.zeros(m, n, dtype=out_dtype or a.dtype, device=a.device)
    tiles = -(-m // bm) * -(-n // bn)
    steps = max(1, -(-k // bk))
    if splits is None:
        splits = (backend.resident_programs(a.device) or 4 * tiles) // tiles
    splits = max(1, min(splits, steps))
    per = -(-steps // splits) * bk                 # K columns a split, a multiple of BK
    splits = -(-k // per) if k else 1             # no empty split
    c = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    gemm_split_k[(tiles, splits)](readable(a), readable(b), c, m, n, k, per, BM=bm, BN=bn, BK=bk,
                                  STAGES=stages, backend=backend)
    return c.to(out_dtype or a.dtype)
