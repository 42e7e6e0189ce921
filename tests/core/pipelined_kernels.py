"""Software-pipelined consumers: an mma stays in flight while the next is issued
(`mma_wait(pending=1)`), and a slot is released one iteration late. The tail loop and its
bound are related to the main loop through the name they share (`n_k`)."""
import xsync as xs

@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=32, BN=32, BK=16, STAGES=2))
def gemm_overlap(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES, a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    off_m = xs.program_id(0) * BM
    off_n = xs.program_id(1) * BN
    n_k = xs.cdiv(K, BK)
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for i in range(n_k):
        with load:
            slot = tiles.acquire()
            slot.a = xs.load(a, [off_m, i * BK], [BM, BK])
            slot.b = xs.load(b, [i * BK, off_n], [BK, BN])
            tiles.commit()
        with mma:
            ab = tiles.wait()
            acc = xs.mma(ab.a, ab.b, acc)
            acc = xs.mma_wait(acc, pending=1)
            if i > 0:
                tiles.release()
    for i in range(xs.maximum(n_k - 1, 0), n_k):
        with mma:
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
    with mma:
        xs.store(c, [off_m, off_n], acc)


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=32, BN=32, BK=16, STAGES=2))
def gemm_overlap_bad_tail(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES, a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    off_m = xs.program_id(0) * BM
    off_n = xs.program_id(1) * BN
    n_k = xs.cdiv(K, BK)
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for i in range(n_k):
        with load:
            slot = tiles.acquire()
            slot.a = xs.load(a, [off_m, i * BK], [BM, BK])
            slot.b = xs.load(b, [i * BK, off_n], [BK, BN])
            tiles.commit()
        with mma:
            ab = tiles.wait()
            acc = xs.mma(ab.a, ab.b, acc)
            acc = xs.mma_wait(acc, pending=1)
            if i > 0:
                tiles.release()
    for i in range(n_k - 1, n_k):  # BUG: runs once even when n_k == 0
        with mma:
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
    with mma:
        xs.store(c, [off_m, off_n], acc)
