"""Kernels for the schedule-pass tests (tests/core/test_passes.py)."""
import xsync as xs

EX = dict(a=xs.bfloat16, b=xs.bfloat16, out=xs.float32, BM=16, BN=16)


@xs.kernel(example=EX)
def round_trip(a, b, out, n, BM: xs.constexpr, BN: xs.constexpr):
    """The cube computes a tile, the vector core answers with another: a ping-pong the
    cross-agent pipeline can overlap (the next tile's product during this tile's answer)."""
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    fwd = xs.pipe(mma, vec, stages=2, s=xs.tile([BM, BN], xs.float32))
    back = xs.pipe(vec, mma, stages=2, p=xs.tile([BM, BN], a.dtype))
    with mma:
        bt = xs.load(b, [0, 0], [BN, BN])
    for i in range(0, n, 1):
        with mma:
            s = xs.mma(xs.load(a, [i * BM, 0], [BM, BN]), bt)
            s = xs.mma_wait(s, pending=0)
            f = fwd.acquire()
            f.s = s
            fwd.commit()
        with vec:
            g = fwd.wait()
            y = xs.exp2(g.s)
            fwd.release()
            h = back.acquire()
            h.p = y.to(a.dtype)
            back.commit()
        with mma:
            r = back.wait()
            z = xs.mma(r.p, bt)
            z = xs.mma_wait(z, pending=0)
            back.release()
            xs.store(out, [i * BM, 0], z)


@xs.kernel(example=EX)
def carried_into_the_hand_off(a, b, out, n, BM: xs.constexpr, BN: xs.constexpr):
    """The hand-off's value depends on the previous iteration's answer: not rotatable."""
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    fwd = xs.pipe(mma, vec, stages=2, s=xs.tile([BM, BN], xs.float32))
    back = xs.pipe(vec, mma, stages=2, p=xs.tile([BM, BN], a.dtype))
    with mma:
        bt = xs.load(b, [0, 0], [BN, BN])
        acc = xs.zeros([BM, BN], xs.float32)
    for i in range(0, n, 1):
        with mma:
            f = fwd.acquire()
            f.s = acc
            fwd.commit()
        with vec:
            g = fwd.wait()
            y = g.s * 0.5
            fwd.release()
            h = back.acquire()
            h.p = y.to(a.dtype)
            back.commit()
        with mma:
            r = back.wait()
            acc = xs.mma(r.p, bt, acc)
            acc = xs.mma_wait(acc, pending=0)
            back.release()
    with mma:
        xs.store(out, [0, 0], acc)
