"""Kernels of copy and vector roles without matrix work: on Ascend they run vector-only
(``mix_mode "aiv"``), every role on one vector core in source order, each pipe a GM ring of
``stages`` slots (xsync/backends/ascend/placement.py). The same source runs on the CPU
emulator and compiles for Hopper."""
import xsync as xs

EXAMPLE = dict(x=xs.float32, w=xs.float32, y=xs.float32, BM=16, BN=64, STAGES=2)


@xs.kernel(example=EXAMPLE)
def rmsnorm(x, w, y, M, N, blocks, BM: xs.constexpr, BN: xs.constexpr, STAGES: xs.constexpr):
    """y = x * rsqrt(mean(x^2) + 1e-6) * w over rows of N <= BN columns; program p normalizes
    row blocks p * blocks ... p * blocks + blocks - 1. A copy role loads each block of rows into a
    STAGES-deep pipe; the vector role normalizes it (rsqrt spelled exp2(-log2(v) / 2))."""
    load = xs.role("load", kind="copy")
    norm = xs.role("norm", kind="vector")
    rows = xs.pipe(load, norm, stages=STAGES, x=xs.tile([BM, BN], xs.float32))
    with norm:
        wt = xs.load(w, [0, 0], [1, BN])
    for i in range(blocks):
        row = (xs.program_id(0) * blocks + i) * BM
        with load:
            s = rows.acquire()
            s.x = xs.load(x, [row, 0], [BM, BN])
            rows.commit()
        with norm:
            got = rows.wait()
            v = got.x
            rows.release()
            ms = xs.sum(v * v, 1) / N
            r = xs.exp2(-0.5 * xs.log2(ms + 1.0e-6))
            xs.store(y, [row, 0], v * r[:, None] * wt)


@xs.kernel(example=EXAMPLE)
def rmsnorm_two_replicas(x, w, y, M, N, blocks, BM: xs.constexpr, BN: xs.constexpr,
                         STAGES: xs.constexpr):
    """One loader feeds two vector replicas (1 -> 2 broadcast); replica i % 2 normalizes block i.
    On Ascend both replicas run on the program's vector core in lockstep."""
    load = xs.role("load", kind="copy")
    norm = xs.role("norm", kind="vector", replicas=2)
    rows = xs.pipe(load, norm, stages=STAGES, x=xs.tile([BM, BN], xs.float32))
    with norm:
        wt = xs.load(w, [0, 0], [1, BN])
    for i in range(blocks):
        row = (xs.program_id(0) * blocks + i) * BM
        with load:
            s = rows.acquire()
            s.x = xs.load(x, [row, 0], [BM, BN])
            rows.commit()
        with norm:
            got = rows.wait()
            v = got.x
            if i % 2 == xs.replica_id():
                ms = xs.sum(v * v, 1) / N
                r = xs.exp2(-0.5 * xs.log2(ms + 1.0e-6))
                xs.store(y, [row, 0], v * r[:, None] * wt)
            rows.release()


@xs.kernel(example=EXAMPLE)
def rowscale_deferred_release(x, w, y, M, N, blocks, BM: xs.constexpr, BN: xs.constexpr,
                              STAGES: xs.constexpr):
    """y = 2 * x; the vector role keeps the previous block until it has read the next one
    (deferred release), so the pipe needs its 2 stages even on one vector core."""
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    rows = xs.pipe(load, work, stages=2, x=xs.tile([BM, BN], xs.float32))
    for i in range(blocks):
        row = (xs.program_id(0) * blocks + i) * BM
        with load:
            s = rows.acquire()
            s.x = xs.load(x, [row, 0], [BM, BN])
            rows.commit()
        with work:
            got = rows.wait()
            xs.store(y, [row, 0], got.x * 2.0)
            if i > 0:
                rows.release()
    if blocks > 0:
        with work:
            rows.release()
