"""Persistent GEMM with a fused epilogue: C = act(A @ B + bias), act one of none, GELU (erf) or
GELU (tanh approximation), chosen by the ``ACT`` constexpr.

The mainloop is kernels/gemm.py's ``gemm_persistent``: a copy role streams A and B tiles through
a ring of ``STAGES`` slots to a matrix role; one program per SM (AI core) walks the output
tiles in grouped order, and the ring runs on from tile to tile, so the next tile's loads
overlap this tile's epilogue. The epilogue runs in the matrix role on the fp32 accumulator:
add the [1, BN] bias row, apply the activation in float32, narrow to C's dtype, store. Shapes
need not be multiples of the tiles: loads past the edges read zeros and stores drop them.

On Hopper the copy role is a 1-warp TMA producer and the matrix role a consumer warpgroup
(wgmma); on Ascend both sit on the cube core (the compiler moves the elementwise epilogue to
the vector cores); on the CPU emulator each role is a thread.
"""
from __future__ import annotations

import torch

import xsync as xs

from ._host import backend_for, check_block, check_matrix, check_vector, readable
from ._host import programs as _programs

ACTIVATIONS = {"none": 0, "gelu": 1, "gelu_tanh": 2}
EXAMPLE = dict(a=xs.bfloat16, b=xs.bfloat16, bias=xs.float32, c=xs.bfloat16,
               BM=128, BN=128, BK=64, STAGES=4, ACT=1)


@xs.kernel(example=EXAMPLE)
def gemm_bias_act(a, b, bias, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                  STAGES: xs.constexpr, ACT: xs.constexpr, GROUP_M: xs.constexpr = 8):
    """C[M, N] = act(A[M, K] @ B[K, N] + bias[1, N]); ACT: 0 none, 1 GELU (erf), 2 GELU (tanh)."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))

    blocks_m = xs.cdiv(M, BM)
    blocks_n = xs.cdiv(N, BN)
    per_group = GROUP_M * blocks_n
    for tile in xs.tile_range(blocks_m * blocks_n):
        first_m = (tile // per_group) * GROUP_M
        group_rows = xs.minimum(blocks_m - first_m, GROUP_M)
        off_m = (first_m + tile % per_group % group_rows) * BM
        off_n = (tile % per_group // group_rows) * BN
        with mma:
            acc = xs.zeros([BM, BN], xs.float32)
        for k in range(0, K, BK):
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
            h = acc + xs.load(bias, [0, off_n], [1, BN]).to(xs.float32)
            if ACT == 2:
                h = 0.5 * h * (1.0 + xs.tanh(0.7978845608028654 * (h + 0.044715 * h * h * h)))
            elif ACT == 1:
                h = 0.5 * h * (1.0 + xs.erf(h * 0.7071067811865476))
            xs.store(c, [off_m, off_n], h.to(c.dtype))


def matmul_bias_act(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                    activation: str = "gelu", *, out_dtype: torch.dtype | None = None, backend=None,
                    block: tuple[int, int, int] = (128, 128, 64), stages: int = 4,
                    programs: int | None = None) -> torch.Tensor:
    """act(a @ b + bias) for a [M, K], b [K, N], bias [N] (or None); ``activation``: "none",
    "gelu" (erf) or "gelu_tanh". fp32 accumulation; the result in ``out_dtype`` (a's dtype)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r}: use one of {', '.join(ACTIVATIONS)}")
    backend = backend_for(backend)
    check_matrix("a", a)
    check_matrix("b", b)
    (m, k), n = a.shape, b.shape[1]
    if b.shape[0] != k:
        raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: inner dimensions differ")
    if bias is None:
        bias = torch.zeros(n, dtype=torch.float32, device=a.device)
    check_vector("bias", bias, n)
    bm, bn, bk = check_block(block, 3)
    c = torch.empty(m, n, dtype=out_dtype or a.dtype, device=a.device)
    tiles = -(-m // bm) * -(-n // bn)
    grid = (_programs(backend, tiles, a.device, programs),)
    gemm_bias_act[grid](readable(a), readable(b), readable(bias.reshape(1, n)), c, m, n, k,
                        BM=bm, BN=bn, BK=bk, STAGES=stages, ACT=ACTIVATIONS[activation],
                        backend=backend)
    return c
