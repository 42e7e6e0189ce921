"""Kernels of the vector-role placement tests (tests/core/test_placement.py, tests/nvidia).

``gemm_epilogue_role``: a persistent GEMM whose bias + GELU epilogue is a vector role fed
through a pipe of ``EPI_STAGES`` slots; ``PLACEMENT`` is handed to ``xs.role(placement=)``.
With EPI_STAGES >= 2 Hopper gives the epilogue a warpgroup of its own (it runs a tile behind
the matrix role); with 1 it stays in the matrix role's warpgroup.
"""
import xsync as xs

EXAMPLE = dict(a=xs.bfloat16, b=xs.bfloat16, bias=xs.float32, c=xs.bfloat16,
               BM=128, BN=128, BK=64, STAGES=3, EPI_STAGES=2)


@xs.kernel(example=EXAMPLE)
def gemm_epilogue_role(a, b, bias, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                       STAGES: xs.constexpr, EPI_STAGES: xs.constexpr, PLACEMENT: xs.constexpr = "auto"):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    epi = xs.role("epi", kind="vector", placement=PLACEMENT)
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    accs = xs.pipe(mma, epi, stages=EPI_STAGES, c=xs.tile([BM, BN], xs.float32))

    blocks_n = xs.cdiv(N, BN)
    for tile in xs.tile_range(xs.cdiv(M, BM) * blocks_n):
        off_m = tile // blocks_n * BM
        off_n = tile % blocks_n * BN
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
            out = accs.acquire()
            out.c = acc
            accs.commit()
        with epi:
            got = accs.wait()
            h = got.c + xs.load(bias, [0, off_n], [1, BN]).to(xs.float32)
            h = 0.5 * h * (1.0 + xs.erf(h * 0.7071067811865476))
            xs.store(c, [off_m, off_n], h.to(c.dtype))
            accs.release()


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, BK=64))
def round_trip(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr):
    """The vector role hands a tile back to the matrix role (attention's S -> P shape)."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    tiles = xs.pipe(load, mma, stages=2, a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    s_out = xs.pipe(mma, vec, stages=2, s=xs.tile([BM, BN], xs.float32))
    p_in = xs.pipe(vec, mma, stages=2, p=xs.tile([BM, BN], xs.float32))
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
            s = s_out.acquire()
            s.s = acc
            s_out.commit()
        with vec:
            got = s_out.wait()
            p = p_in.acquire()
            p.p = got.s * 0.5
            p_in.commit()
            s_out.release()
        with mma:
            back = p_in.wait()
            acc = back.p
            p_in.release()
    with mma:
        xs.store(c, [off_m, off_n], acc)


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, BK=64))
def paired_epilogue(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr):
    """Two matrix replicas and a paired epilogue (both replicas compute the same tile: the
    kernel is for placement, not numerics): on its own the epilogue would make four consumer
    warpgroups."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix", replicas=2)
    epi = xs.role("epi", kind="vector", replicas=2)
    tiles = xs.pipe(load, mma, stages=2, a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    accs = xs.pipe(mma, epi, stages=2, c=xs.tile([BM, BN], xs.float32))
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
        out = accs.acquire()
        out.c = acc
        accs.commit()
    with epi:
        got = accs.wait()
        if xs.replica_id() == 0:
            xs.store(c, [off_m, off_n], got.c)
        accs.release()
