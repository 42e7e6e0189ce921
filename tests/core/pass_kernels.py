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


@xs.kernel(example=EX)
def tile_read_by_both_stages(a, b, out, n, BM: xs.constexpr, BN: xs.constexpr):
    """The cube's loader hands it a tile of ``a`` (a same-core pipe) that both the hand-off's
    product and the answer's product read, as the attention backward's Q: rotatable, the
    later product loading the tile again (cross-agent-pipeline rule 9)."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    a_in = xs.pipe(load, mma, stages=2, a=xs.tile([BM, BN], a.dtype))
    fwd = xs.pipe(mma, vec, stages=2, s=xs.tile([BM, BM], xs.float32))
    back = xs.pipe(vec, mma, stages=2, p=xs.tile([BM, BM], a.dtype))
    for i in range(0, n, 1):
        with load:
            x = a_in.acquire()
            x.a = xs.load(a, [i * BM, 0], [BM, BN])
            a_in.commit()
        with mma:
            at = a_in.wait()
            s = xs.mma(at.a, xs.trans(at.a))
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
            z = xs.mma(r.p, at.a)
            z = xs.mma_wait(z, pending=0)
            back.release()
            a_in.release()
            xs.store(out, [i * BM, 0], z)


@xs.kernel(example=EX)
def tile_from_a_running_value(a, b, out, n, BM: xs.constexpr, BN: xs.constexpr):
    """As above, but the tile is loaded at a row the loop advances: the later stage could not
    load it again (rule 9 refuses)."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    a_in = xs.pipe(load, mma, stages=2, a=xs.tile([BM, BN], a.dtype))
    fwd = xs.pipe(mma, vec, stages=2, s=xs.tile([BM, BM], xs.float32))
    back = xs.pipe(vec, mma, stages=2, p=xs.tile([BM, BM], a.dtype))
    with load:
        row = 0
    for i in range(0, n, 1):
        with load:
            row = row + BM
            x = a_in.acquire()
            x.a = xs.load(a, [row - BM, 0], [BM, BN])
            a_in.commit()
        with mma:
            at = a_in.wait()
            s = xs.mma(at.a, xs.trans(at.a))
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
            z = xs.mma(r.p, at.a)
            z = xs.mma_wait(z, pending=0)
            back.release()
            a_in.release()
            xs.store(out, [i * BM, 0], z)


# ---------------------------------------------------------------- merge-pipes (Hopper)
EX_AB = dict(a=xs.bfloat16, b=xs.bfloat16, out=xs.float32, BM=64, BN=64, STAGES=3)


@xs.kernel(example=EX_AB)
def b_after_an_answer(a, b, out, n, BM: xs.constexpr, BN: xs.constexpr, STAGES: xs.constexpr):
    """The producer fills B only after the consumer has answered A: one ring for both would
    hold A back until B is filled, and B waits for the answer to A (merge-pipes rule 2)."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    a_in = xs.pipe(load, mma, stages=STAGES, a=xs.tile([BM, BN], a.dtype))
    b_in = xs.pipe(load, mma, stages=STAGES, b=xs.tile([BN, BN], b.dtype))
    answered = xs.event(mma, load)
    for i in range(0, n, 1):
        with load:
            sa = a_in.acquire()
            sa.a = xs.load(a, [i * BM, 0], [BM, BN])
            a_in.commit()
            xs.wait(answered)
            sb = b_in.acquire()
            sb.b = xs.load(b, [i * BN, 0], [BN, BN])
            b_in.commit()
        with mma:
            ta = a_in.wait()
            xs.signal(answered)
            tb = b_in.wait()
            z = xs.mma(ta.a, tb.b)
            z = xs.mma_wait(z, pending=0)
            a_in.release()
            b_in.release()
            xs.store(out, [i * BM, 0], z)


@xs.kernel(example=EX_AB)
def released_b_first(a, b, out, n, BM: xs.constexpr, BN: xs.constexpr, STAGES: xs.constexpr):
    """A and B filled back to back, but B released before A (merge-pipes rule 3)."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    a_in = xs.pipe(load, mma, stages=STAGES, a=xs.tile([BM, BN], a.dtype))
    b_in = xs.pipe(load, mma, stages=STAGES, b=xs.tile([BN, BN], b.dtype))
    for i in range(0, n, 1):
        with load:
            sa = a_in.acquire()
            sa.a = xs.load(a, [i * BM, 0], [BM, BN])
            a_in.commit()
            sb = b_in.acquire()
            sb.b = xs.load(b, [i * BN, 0], [BN, BN])
            b_in.commit()
        with mma:
            ta = a_in.wait()
            tb = b_in.wait()
            z = xs.mma(ta.a, tb.b)
            z = xs.mma_wait(z, pending=0)
            b_in.release()
            a_in.release()
            xs.store(out, [i * BM, 0], z)
