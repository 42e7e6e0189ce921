"""Kernels that reduce-add into global memory (``xs.store(..., reduce="add")``), shared by the
core, nvidia and ascend matrices (tests/*/test_reduce_add*.py)."""
import xsync as xs

SPLIT_K = dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, BK=32, STAGES=2, DET=0)
COLUMN_SUM = dict(x=xs.float32, out=xs.float32, BM=16, BN=32, STAGES=2)


@xs.kernel(example=SPLIT_K)
def gemm_split_k(a, b, c, M, N, K, K_PER_SPLIT, BM: xs.constexpr, BN: xs.constexpr,
                 BK: xs.constexpr, STAGES: xs.constexpr, DET: xs.constexpr):
    """C += A @ B, the K range cut in ``num_programs(1)`` splits of ``K_PER_SPLIT`` (a multiple
    of BK): program (t, s) computes tile t over split s and reduce-adds it into fp32 C, so
    ``num_programs(1)`` programs add into every element of C."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
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
        xs.store(c, [off_m, off_n], acc, reduce="add", deterministic=DET)


@xs.kernel(example=COLUMN_SUM)
def column_sum(x, out, M, N, ROWS_PER_PROGRAM, BM: xs.constexpr, BN: xs.constexpr,
               STAGES: xs.constexpr):
    """out[0, :N] += column sums of x: program (r, c) sums rows [r * ROWS_PER_PROGRAM, ...) of
    column block c and reduce-adds its [1, BN] row into ``out`` (a one-row store; columns from N
    on are dropped even where ``out`` is wider)."""
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    rows = xs.pipe(load, work, stages=STAGES, t=xs.tile([BM, BN], xs.float32))
    c0 = xs.program_id(1) * BN
    r0 = xs.program_id(0) * ROWS_PER_PROGRAM
    r1 = xs.minimum(r0 + ROWS_PER_PROGRAM, M)
    with work:
        acc = xs.zeros([BN], xs.float32)
    for r in range(r0, r1, BM):
        with load:
            s = rows.acquire()
            s.t = xs.load(x, [r, c0], [BM, BN])
            rows.commit()
        with work:
            got = rows.wait()
            acc = acc + xs.sum(got.t, 0)
            rows.release()
    with work:
        xs.store(out, [0, c0], acc[None, :], bounds=[1, N], reduce="add")


@xs.kernel(example=SPLIT_K)
def gemm_split_k_reducer(a, b, c, M, N, K, K_PER_SPLIT, BM: xs.constexpr, BN: xs.constexpr,
                         BK: xs.constexpr, STAGES: xs.constexpr, DET: xs.constexpr):
    """:func:`gemm_split_k` with the partial tile handed to a vector role that reduce-adds it,
    as FA3's backward hands dQ to its writer: on Ascend the GM atomic runs on a vector core, so
    this is the form that backend takes (the cube -> vector hand-off is a GM slot and a flag)."""
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
        xs.store(c, [off_m, off_n], got.t, reduce="add", deterministic=DET)
        part.release()
