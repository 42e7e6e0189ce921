"""Kernels that the Ascend backend must reject (or accept) with a precise diagnosis."""
import xsync as xs

EX = dict(a=xs.bfloat16, b=xs.bfloat16, out=xs.float32, BM=16, BN=16, BK=16)


@xs.kernel(example=EX)
def seventeen_directions(a, b, out, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr):
    """8 cube->vector pipes (16 flags: FULL + EMPTY each) plus one event: 17 directions."""
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    p0 = xs.pipe(mma, vec, stages=1, c=xs.tile([BM, BN], xs.float32))
    p1 = xs.pipe(mma, vec, stages=1, c=xs.tile([BM, BN], xs.float32))
    p2 = xs.pipe(mma, vec, stages=1, c=xs.tile([BM, BN], xs.float32))
    p3 = xs.pipe(mma, vec, stages=1, c=xs.tile([BM, BN], xs.float32))
    p4 = xs.pipe(mma, vec, stages=1, c=xs.tile([BM, BN], xs.float32))
    p5 = xs.pipe(mma, vec, stages=1, c=xs.tile([BM, BN], xs.float32))
    p6 = xs.pipe(mma, vec, stages=1, c=xs.tile([BM, BN], xs.float32))
    p7 = xs.pipe(mma, vec, stages=1, c=xs.tile([BM, BN], xs.float32))
    done = xs.event(vec, mma)  # BUG: the 17th direction
    with mma:
        x = xs.mma(xs.load(a, [0, 0], [BM, BK]), xs.load(b, [0, 0], [BK, BN]))
        s0 = p0.acquire()
        s0.c = x
        p0.commit()
        s1 = p1.acquire()
        s1.c = x
        p1.commit()
        s2 = p2.acquire()
        s2.c = x
        p2.commit()
        s3 = p3.acquire()
        s3.c = x
        p3.commit()
        s4 = p4.acquire()
        s4.c = x
        p4.commit()
        s5 = p5.acquire()
        s5.c = x
        p5.commit()
        s6 = p6.acquire()
        s6.c = x
        p6.commit()
        s7 = p7.acquire()
        s7.c = x
        p7.commit()
        xs.wait(done)
    with vec:
        g0 = p0.wait()
        y = g0.c
        p0.release()
        g1 = p1.wait()
        y = y + g1.c
        p1.release()
        g2 = p2.wait()
        y = y + g2.c
        p2.release()
        g3 = p3.wait()
        y = y + g3.c
        p3.release()
        g4 = p4.wait()
        y = y + g4.c
        p4.release()
        g5 = p5.wait()
        y = y + g5.c
        p5.release()
        g6 = p6.wait()
        y = y + g6.c
        p6.release()
        g7 = p7.wait()
        y = y + g7.c
        p7.release()
        xs.store(out, [0, 0], y)
        xs.signal(done)


@xs.kernel(example=dict(EX, STAGES=16))
def sixteen_stages(a, b, out, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                   STAGES: xs.constexpr):
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    ring = xs.pipe(mma, vec, stages=STAGES, c=xs.tile([BM, BN], xs.float32))  # BUG
    for k in range(0, K, BK):
        with mma:
            s = ring.acquire()
            s.c = xs.mma(xs.load(a, [0, k], [BM, BK]), xs.load(b, [k, 0], [BK, BN]))
            ring.commit()
        with vec:
            g = ring.wait()
            xs.store(out, [0, k], g.c)
            ring.release()


@xs.kernel(example=EX)
def sixteen_pending_sets(a, b, out, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr):
    """The cube signals 16 times before the vector side waits once: flag counter overflow."""
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    ready = xs.event(mma, vec)  # BUG
    with mma:
        acc = xs.mma(xs.load(a, [0, 0], [BM, BK]), xs.load(b, [0, 0], [BK, BN]))
        xs.store(out, [0, 0], acc)
        for i in range(16):
            xs.signal(ready)
    with vec:
        for j in range(16):
            xs.wait(ready)


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16))
def no_cube_work(x, y, n, BLOCK: xs.constexpr):
    load = xs.role("load", kind="matrix")   # a matrix role without xs.mma: no cube side runs
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t * 2.0)
            ring.release()


@xs.kernel(example=EX)
def cube_loads_for_vector(a, b, out, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr):
    """A copy role (cube) loads a tile for the vector role: in 3.2.0 that load runs on the
    vector core while the FULL flag is set by the cube."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    raw = xs.pipe(load, vec, stages=1, t=xs.tile([BM, BN], xs.float32))
    with mma:
        acc = xs.mma(xs.load(a, [0, 0], [BM, BK]), xs.load(b, [0, 0], [BK, BN]))
        xs.store(out, [0, 0], acc)
    with load:
        s = raw.acquire()
        s.t = xs.load(out, [0, 0], [BM, BN])  # BUG
        raw.commit()
    with vec:
        g = raw.wait()
        xs.store(out, [BM, 0], g.t)
        raw.release()


@xs.kernel(example=dict(EX, TILES=2))
def replica_branch_sync(a, b, out, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                        TILES: xs.constexpr):
    """Only one replica waits: lockstep (no sub_vec_id) cannot express it."""
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector", replicas=2)
    ready = xs.event(mma, vec)
    with mma:
        acc = xs.mma(xs.load(a, [0, 0], [BM, BK]), xs.load(b, [0, 0], [BK, BN]))
        xs.store(out, [0, 0], acc)
        xs.signal(ready)
    with vec:
        if xs.replica_id() == 0:  # BUG
            xs.wait(ready)
        else:
            xs.wait(ready)


@xs.kernel(example=dict(EX, TILES=4))
def ping_pong(a, b, out, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
              TILES: xs.constexpr):
    """Two mma replicas (cube, lockstep) feed two vector replicas through an N -> N pipe
    (one workspace ring per replica pair) and a vector -> cube gather event."""
    mma = xs.role("mma", kind="matrix", replicas=2)
    soft = xs.role("soft", kind="vector", replicas=2)
    s_pipe = xs.pipe(mma, soft, stages=2, s=xs.tile([BM, BN], xs.float32))
    done = xs.event(soft, mma)
    for t in range(TILES // 2):
        with mma:
            row = (2 * t + xs.replica_id()) * BM
            acc = xs.zeros([BM, BN], xs.float32)
            for k in range(0, K, BK):
                acc = xs.mma(xs.load(a, [row, k], [BM, BK]), xs.load(b, [k, 0], [BK, BN]), acc)
            sl = s_pipe.acquire()
            sl.s = acc
            s_pipe.commit()
        with soft:
            r = (2 * t + xs.replica_id()) * BM
            got = s_pipe.wait()
            y = xs.exp2(got.s - xs.max(got.s, 1)[:, None])
            s_pipe.release()
            xs.store(out, [r, 0], y / xs.sum(y, 1)[:, None])
            xs.signal(done)
        with mma:
            xs.wait(done)


@xs.kernel(example=EX)
def cube_roles_meet_once(a, b, out, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr):
    """load and mma share the cube and both call team.sync() each step: the cube meets the
    barrier once per step, the vector core once (sync_block_all "all")."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    tiles = xs.pipe(load, mma, stages=2, a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    res = xs.pipe(mma, vec, stages=1, c=xs.tile([BM, BN], xs.float32))
    team = xs.barrier(load, mma, vec)
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for k in range(0, K, BK):
        with load:
            s = tiles.acquire()
            s.a = xs.load(a, [0, k], [BM, BK])
            s.b = xs.load(b, [k, 0], [BK, BN])
            tiles.commit()
            team.sync()
        with mma:
            g = tiles.wait()
            acc = xs.mma(g.a, g.b, acc)
            tiles.release()
            team.sync()
        with vec:
            team.sync()
    with mma:
        r = res.acquire()
        r.c = acc
        res.commit()
    with vec:
        got = res.wait()
        xs.store(out, [0, 0], got.c)
        res.release()
