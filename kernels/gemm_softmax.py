"""GEMM with a row-softmax epilogue on two consumer replicas.

Each program computes `TILES` column blocks of C = A @ B and writes softmax(C) per row
of each block. Three roles:

    load (copy) --tiles--> mma (matrix) --scores--> epilogue (vector, 2 replicas)

Both epilogue replicas receive every `scores` slot (broadcast) and take turns: replica
`t % 2` processes block t, the other just releases it. A group barrier keeps the two
replicas in lockstep after each block (the ping-pong shape of attention consumers).

Hopper: 1-warp TMA producer, one wgmma warpgroup, two epilogue warpgroups meeting on a
named barrier. Ascend: load + mma on the cube core, the epilogue on the two vector
cores, scores through a global-memory workspace ring with cube->vector flags.

Default tiles (BM = BN = BK = 64): on the Ascend 910B each vector core holds half the rows
of a 64 x 64 fp32 scores tile per replica (sub-block binding) plus the softmax temporaries:
38 KB of its 192 KB unified buffer; the cube uses 32 KB of L1 and 16 KB of L0C (measured by
the ascend matrix's compiler stage). Larger tiles trade UB for fewer flags per element:
BM = BN = 256 overflows UB.
"""
import xsync as xs

LOG2E = 1.4426950408889634


def _trace_args(settings):
    """Small launch for `xsync trace` (CPU emulator): one program, 2 column blocks of 3 K
    steps each, so both epilogue replicas take a turn. --set overrides tiles/stages."""
    import torch

    cx = dict(BM=16, BN=16, BK=16, STAGES=2, TILES=2)
    cx.update({k: v for k, v in settings.items() if k in cx})
    M, N, K = cx["BM"], cx["TILES"] * cx["BN"], 3 * cx["BK"]
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    out = torch.zeros(M, N)
    return (1, 1), (a, b, out, M, N, K), cx


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, out=xs.float32,
                        BM=64, BN=64, BK=64, STAGES=2, TILES=2), trace=_trace_args)
def gemm_softmax(a, b, out, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                 STAGES: xs.constexpr, TILES: xs.constexpr):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    epilogue = xs.role("epilogue", kind="vector", replicas=2)
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    scores = xs.pipe(mma, epilogue, stages=2, c=xs.tile([BM, BN], xs.float32))
    team = xs.barrier(epilogue)

    off_m = xs.program_id(0) * BM
    for t in range(TILES):
        off_n = (xs.program_id(1) * TILES + t) * BN
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
            res = scores.acquire()
            res.c = acc
            scores.commit()
        with epilogue:
            got = scores.wait()
            if t % 2 == xs.replica_id():
                cols = off_n + xs.arange(0, BN)
                x = xs.where(cols[None, :] < N, got.c, -1.0e30)
                row_max = xs.max(x, 1)
                p = xs.exp2((x - row_max[:, None]) * LOG2E)
                y = p / xs.sum(p, 1)[:, None]
                xs.store(out, [off_m, off_n], y)
            scores.release()
            team.sync()
