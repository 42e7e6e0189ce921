"""Kernels that hold more than one slot of a pipe (split counters) or share one ring between
replica pairs (``interleave=``): xsync/lowering/holding.py, docs/verifier.md "Holding several
slots". Each has the torch function it computes; the CPU, Hopper (sm_90a) and Ascend tests run
them."""
import xsync as xs

PAIRS = dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=2)
GEMM = dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, BK=32, STAGES=4)


@xs.kernel(example=PAIRS)
def pair_sums(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    """For 2n tiles: y[2i] = x[2i] + x[2i + 1], y[2i + 1] = x[2i + 1] - x[2i]. The consumer waits
    for tile 2i + 1 before it releases tile 2i (CuTeDSL's advance_on_wait), holding both slots
    of a 2-stage ring, and releases them oldest first."""
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [2 * i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
            s2 = ring.acquire()
            s2.t = xs.load(x, [(2 * i + 1) * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            a = ring.wait()
            b = ring.wait()     # the second slot, before the first is released
            xs.store(y, [2 * i * BLOCK, 0], a.t + b.t)
            xs.store(y, [(2 * i + 1) * BLOCK, 0], b.t - a.t)
            ring.release(a)     # oldest first
            ring.release(b)


def pair_sums_ref(x, n, block):
    y = x.clone()
    for i in range(n):
        a, b = x[2 * i * block:(2 * i + 1) * block], x[(2 * i + 1) * block:(2 * i + 2) * block]
        y[2 * i * block:(2 * i + 1) * block] = a + b
        y[(2 * i + 1) * block:(2 * i + 2) * block] = b - a
    return y


@xs.kernel(example=GEMM)
def interleaved_gemm(a, b, c, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr, STAGES: xs.constexpr):
    """c[r * BM:(r + 1) * BM] = a[rows of r] @ b for two replica pairs (copy r -> matrix r) that
    share one ring of STAGES slots with stride 2: pair r uses slots r, r + 2, ..."""
    load = xs.role("load", kind="copy", replicas=2)
    mma = xs.role("mma", kind="matrix", replicas=2)
    ring = xs.pipe(load, mma, stages=STAGES, interleave=2, a=xs.tile([BM, BK], xs.bfloat16),
                   b=xs.tile([BK, BN], xs.bfloat16))
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for k in range(0, K, BK):
        with load:
            s = ring.acquire()
            s.a = xs.load(a, [xs.replica_id() * BM, k], [BM, BK])
            s.b = xs.load(b, [k, 0], [BK, BN])
            ring.commit()
        with mma:
            t = ring.wait()
            acc = xs.mma(t.a, t.b, acc)
            acc = xs.mma_wait(acc, pending=0)
            ring.release(t)
    with mma:
        xs.store(c, [xs.replica_id() * BM, 0], acc)


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=4))
def interleaved_scores(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    """y[r][i] = x_r[i] @ x_r[i] from the matrix role to the vector role, two replica pairs on
    one interleaved ring (Ascend: cube -> the two vector cores, a GM ring with alternating
    slots; Hopper: one warpgroup per pair)."""
    mma = xs.role("mma", kind="matrix", replicas=2)
    soft = xs.role("soft", kind="vector", replicas=2)
    ring = xs.pipe(mma, soft, stages=STAGES, interleave=2, s=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with mma:
            t = xs.load(x, [(2 * i + xs.replica_id()) * BLOCK, 0], [BLOCK, BLOCK])
            out = ring.acquire()
            out.s = xs.mma(t, t)
            ring.commit()
        with soft:
            got = ring.wait()
            xs.store(y, [(2 * i + xs.replica_id()) * BLOCK, 0], got.s * 0.5)
            ring.release(got)


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=2))
def held_scores(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    """For 2n tiles, s[j] = x_j @ x_j; y[2i] = s[2i] + s[2i + 1], y[2i + 1] = s[2i + 1]: the vector
    role waits for score 2i + 1 before it releases score 2i, holding both slots of a 2-stage
    matrix -> vector ring (Ascend: cube -> vector flags)."""
    mma = xs.role("mma", kind="matrix")
    soft = xs.role("soft", kind="vector")
    ring = xs.pipe(mma, soft, stages=STAGES, s=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(2 * n):
        with mma:
            t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            out = ring.acquire()
            out.s = xs.mma(t, t)
            ring.commit()
    for i in range(n):
        with soft:
            p = ring.wait()
            q = ring.wait()
            xs.store(y, [2 * i * BLOCK, 0], p.s + q.s)
            xs.store(y, [(2 * i + 1) * BLOCK, 0], q.s)
            ring.release(p)
            ring.release(q)


@xs.kernel(example=PAIRS)
def sliding_sums(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    """y[j] = x[j] + x[j + 1] for j < 2n: each tile is used with its successor, so the consumer
    waits for tile j + 1 before it releases tile j and carries the held slot into the next step
    (two slot names alternate; CuTeDSL's advance_on_wait). A 2-stage ring is held whole."""
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    with load:
        s0 = ring.acquire()
        s0.t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        ring.commit()
    with work:
        a = ring.wait()
    for i in range(n):
        with load:
            s1 = ring.acquire()
            s1.t = xs.load(x, [(2 * i + 1) * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            b = ring.wait()          # tile 2i + 1 while tile 2i is still held
            xs.store(y, [2 * i * BLOCK, 0], a.t + b.t)
            ring.release(a)
        with load:
            s2 = ring.acquire()
            s2.t = xs.load(x, [(2 * i + 2) * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            a = ring.wait()          # tile 2i + 2 while tile 2i + 1 is still held
            xs.store(y, [(2 * i + 1) * BLOCK, 0], b.t + a.t)
            ring.release(b)
    with work:
        ring.release(a)


def sliding_sums_ref(x, n, block):
    t = x.view(-1, block, x.shape[1])
    return (t[:2 * n] + t[1:2 * n + 1]).reshape(-1, x.shape[1])
