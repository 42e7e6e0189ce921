"""Kernels whose constexprs are strings or dtypes: a role kind chosen by a parameter (works on
every backend) and strings where a number is needed (rejected at the line that uses them)."""
import xsync as xs

EX = dict(x=xs.float32, y=xs.float32, BLOCK=16)


@xs.kernel(example=dict(EX, KIND="vector"))
def kind_by_constexpr(x, y, n, BLOCK: xs.constexpr, KIND: xs.constexpr):
    work = xs.role("work", kind=KIND)
    for i in range(n):
        with work:
            xs.store(y, [i * BLOCK, 0], xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK]) * 2.0)


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, out=xs.float32, BM=64, BN=64, BK=16,
                        LOAD_KIND="copy", MMA_KIND="matrix", EPI_KIND="vector", DT=xs.bfloat16))
def kinds_of_a_pipeline(a, b, out, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                        LOAD_KIND: xs.constexpr, MMA_KIND: xs.constexpr, EPI_KIND: xs.constexpr,
                        DT: xs.constexpr):
    """Every role kind and the epilogue's dtype are constexprs."""
    load = xs.role("load", kind=LOAD_KIND)
    mma = xs.role("mma", kind=MMA_KIND)
    epi = xs.role("epi", kind=EPI_KIND)
    tiles = xs.pipe(load, mma, stages=2, a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    ring = xs.pipe(mma, epi, stages=1, c=xs.tile([BM, BN], xs.float32))
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for k in range(0, K, BK):
        with load:
            slot = tiles.acquire()
            slot.a = xs.load(a, [0, k], [BM, BK])
            slot.b = xs.load(b, [k, 0], [BK, BN])
            tiles.commit()
        with mma:
            ab = tiles.wait()
            acc = xs.mma(ab.a, ab.b, acc)
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
    with mma:
        s = ring.acquire()
        s.c = acc
        ring.commit()
    with epi:
        g = ring.wait()
        r = g.c.to(DT)
        ring.release()
        xs.store(out, [0, 0], r)


@xs.kernel(example=dict(EX, KIND="vector", OFFSET="16"))
def string_in_arithmetic(x, y, n, BLOCK: xs.constexpr, KIND: xs.constexpr, OFFSET: xs.constexpr):
    work = xs.role("work", kind=KIND)
    with work:
        xs.store(y, [OFFSET, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]))  # BUG: a string offset


@xs.kernel(example=dict(EX, STAGES="2"))
def string_stages(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    with load:
        s = ring.acquire()
        s.t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        ring.commit()
    with work:
        g = ring.wait()
        xs.store(y, [0, 0], g.t)
        ring.release()


@xs.kernel(example=dict(EX, ROWS="16"))
def string_in_shape(x, y, n, BLOCK: xs.constexpr, ROWS: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([ROWS * 2, BLOCK], xs.float32))  # BUG
    with load:
        s = ring.acquire()
        s.t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        ring.commit()
    with work:
        g = ring.wait()
        xs.store(y, [0, 0], g.t)
        ring.release()


@xs.kernel(example=EX)
def kind_by_runtime_parameter(x, y, kind, BLOCK: xs.constexpr):
    work = xs.role("work", kind=kind)  # BUG: kind is a run-time scalar
    with work:
        xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]))


@xs.kernel(example=dict(EX, KIND="tensor"))
def unknown_kind(x, y, n, BLOCK: xs.constexpr, KIND: xs.constexpr):
    work = xs.role("work", kind=KIND)  # BUG: no such kind
    with work:
        xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]))


@xs.kernel(example=dict(EX, DT=xs.float32))
def dtype_by_constexpr(x, y, BLOCK: xs.constexpr, DT: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        t = xs.load(x, [0, 0], [BLOCK, BLOCK]) + xs.zeros([BLOCK, BLOCK], DT)
        xs.store(y, [0, 0], t.to(DT))
