"""Kernels used only by the NVIDIA test matrix.

* ``handoff``: one output tile, written by epilogue replica 0, which then *arrives* on a
  group barrier that replica 1 *syncs* on (exercises ``bar.arrive`` and ``bar.sync``).
* ``gemm_extra_wait``: a deliberately broken GEMM (the mma role waits for one slot more
  than the load role commits). The verifier rejects it; with XSYNC_VERIFY=0 it hangs on
  the GPU, which hang debug mode must report as role 'mma' waiting on pipe 'tiles'.
"""
import xsync as xs


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, out=xs.float32, BM=64, BN=64, BK=64))
def handoff(a, b, out, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    epi = xs.role("epi", kind="vector", replicas=2)
    tiles = xs.pipe(load, mma, stages=2, a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    scores = xs.pipe(mma, epi, stages=1, c=xs.tile([BM, BN], xs.float32))
    team = xs.barrier(epi)

    off_m = xs.program_id(0) * BM
    off_n = xs.program_id(1) * BN
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
    with epi:
        got = scores.wait()
        if xs.replica_id() == 0:
            xs.store(out, [off_m, off_n], got.c * 2.0)
            team.arrive()
        else:
            team.sync()
        scores.release()


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=128, BN=128, BK=64, STAGES=2))
def gemm_extra_wait(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                    STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))

    off_m = xs.program_id(0) * BM
    off_n = xs.program_id(1) * BN
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
        extra = tiles.wait()  # BUG: no slot is ever committed for this wait
        xs.store(c, [off_m, off_n], acc)


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, out=xs.float32, BM=64, BN=64, BK=64))
def shared_partition_barrier(a, b, out, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr):
    """mma and epi share the consumer warpgroup and both call team.sync() each K step: the
    partition meets the barrier once per step (with the producer warp: 160 threads)."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    epi = xs.role("epi", kind="vector")
    tiles = xs.pipe(load, mma, stages=2, a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    team = xs.barrier()
    off_m = xs.program_id(0) * BM
    off_n = xs.program_id(1) * BN
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for k in range(0, K, BK):
        with load:
            slot = tiles.acquire()
            slot.a = xs.load(a, [off_m, k], [BM, BK])
            slot.b = xs.load(b, [k, off_n], [BK, BN])
            tiles.commit()
            team.sync()
        with mma:
            ab = tiles.wait()
            acc = xs.mma(ab.a, ab.b, acc)
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
            team.sync()
        with epi:
            team.sync()
    with mma:
        xs.store(out, [off_m, off_n], acc)


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, D=64, STAGES=2))
def held_operand(a, b, c, N, BM: xs.constexpr, BN: xs.constexpr, D: xs.constexpr, STAGES: xs.constexpr):
    """C[rows, n..n+BN] = A[rows] @ B[n..n+BN]ᵀ: A's tile is loaded into registers once and
    held as the wgmma A operand across the loop (the renderer gives it the operand layout at
    its definition, so the loop converts nothing)."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    b_in = xs.pipe(load, mma, stages=STAGES, b=xs.tile([BN, D], b.dtype))
    with mma:
        a_tile = xs.load(a, [xs.program_id(0) * BM, 0], [BM, D])
    for n in range(0, N, BN):
        with load:
            bs = b_in.acquire()
            bs.b = xs.load(b, [n, 0], [BN, D])
            b_in.commit()
        with mma:
            bt = b_in.wait()
            t = xs.mma(a_tile, xs.trans(bt.b))
            t = xs.mma_wait(t, pending=0)
            b_in.release()
            xs.store(c, [xs.program_id(0) * BM, n], t)
