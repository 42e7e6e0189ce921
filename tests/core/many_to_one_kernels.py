"""Kernels with an N -> 1 pipe (a gather: each replica of the producer role commits into its
own ring, one wait of the consumer takes slot k of every ring, ``slot[r].field`` reading
replica r's), shared by the core, nvidia and ascend matrices (tests/*/test_many_to_one.py)."""
import xsync as xs

SPLIT_K = dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, BK=32, STAGES=2)
ROW_SUM = dict(x=xs.float32, out=xs.float32, BM=16, BN=32)


@xs.kernel(example=SPLIT_K)
def gemm_split_k_gather(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                        STAGES: xs.constexpr):
    """C = A @ B with the K range of a tile split between two matrix replicas inside one
    program (replica r takes the K blocks r, r + 2, ...), each fed by its own copy replica; one
    vector role gathers the two partial tiles, adds them and stores C."""
    load = xs.role("load", kind="copy", replicas=2)
    mma = xs.role("mma", kind="matrix", replicas=2)
    epi = xs.role("epilogue", kind="vector")
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    part = xs.pipe(mma, epi, stages=1, acc=xs.tile([BM, BN], xs.float32))
    off_m = xs.program_id(0) * BM
    off_n = xs.program_id(1) * BN
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for k in range(0, K, 2 * BK):
        with load:
            kk = k + xs.replica_id() * BK
            slot = tiles.acquire()
            slot.a = xs.load(a, [off_m, kk], [BM, BK])
            slot.b = xs.load(b, [kk, off_n], [BK, BN])
            tiles.commit()
        with mma:
            ab = tiles.wait()
            acc = xs.mma(ab.a, ab.b, acc)
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
    with mma:
        out = part.acquire()
        out.acc = acc
        part.commit()
    with epi:
        got = part.wait()
        xs.store(c, [off_m, off_n], got[0].acc + got[1].acc)
        part.release()


@xs.kernel(example=ROW_SUM)
def row_sum_gather(x, out, M, N, BM: xs.constexpr, BN: xs.constexpr):
    """out[m] = sum of row m of x: two vector replicas add up the column blocks r, r + 2, ...
    of a row block into a [BM, BN] partial; one vector role gathers the two partials, adds
    them, sums the rows and stores."""
    work = xs.role("work", kind="vector", replicas=2)
    red = xs.role("reduce", kind="vector")
    part = xs.pipe(work, red, stages=1, s=xs.tile([BM, BN], xs.float32))
    off_m = xs.program_id(0) * BM
    with work:
        acc = xs.zeros([BM, BN], xs.float32)
        for n in range(0, N, 2 * BN):
            acc = acc + xs.load(x, [off_m, n + xs.replica_id() * BN], [BM, BN])
        p = part.acquire()
        p.s = acc
        part.commit()
    with red:
        got = part.wait()
        xs.store(out, [off_m], xs.sum(got[0].s + got[1].s, 1))
        part.release()


SCALED = dict(x=xs.float32, w=xs.bfloat16, y=xs.float32, BM=32, BN=32, BK=32)


@xs.kernel(example=SCALED)
def scaled_mma_gather(x, w, y, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr):
    """y = (x / 2) @ w, the other direction (vector replicas -> one matrix role): vector replica r
    scales the K blocks r, r + 2, ... of x to bf16; the matrix role gathers both per round and
    multiplies each with its block of w (brought by a copy role)."""
    prep = xs.role("prep", kind="vector", replicas=2)
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    ops = xs.pipe(prep, mma, stages=2, a=xs.tile([BM, BK], xs.bfloat16))
    wts = xs.pipe(load, mma, stages=2, b0=xs.tile([BK, BN], w.dtype), b1=xs.tile([BK, BN], w.dtype))
    off_m = xs.program_id(0) * BM
    off_n = xs.program_id(1) * BN
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for k in range(0, K, 2 * BK):
        with prep:
            s = ops.acquire()
            s.a = (xs.load(x, [off_m, k + xs.replica_id() * BK], [BM, BK]) * 0.5).to(xs.bfloat16)
            ops.commit()
        with load:
            t = wts.acquire()
            t.b0 = xs.load(w, [k, off_n], [BK, BN])
            t.b1 = xs.load(w, [k + BK, off_n], [BK, BN])
            wts.commit()
        with mma:
            got = ops.wait()
            b = wts.wait()
            acc = xs.mma(got[0].a, b.b0, acc)
            acc = xs.mma(got[1].a, b.b1, acc)
            acc = xs.mma_wait(acc, pending=0)
            wts.release()
            ops.release()
    with mma:
        xs.store(y, [off_m, off_n], acc)


PAIR_SUM = dict(x=xs.float16, y=xs.float32, BM=64, BN=64)


@xs.kernel(example=PAIR_SUM)
def pair_sum_gather(x, y, M, N, BM: xs.constexpr, BN: xs.constexpr):
    """y[:, j-th block] = x[:, block 2j] + x[:, block 2j + 1]: copy replica r brings the column
    blocks 2j + r (on Hopper each copy warp fills its own ring by TMA); one vector role gathers
    both per round. Without matrix work Ascend runs it vector-only: both replicas and the vector
    role on one vector core, the rings in GM in program order."""
    load = xs.role("load", kind="copy", replicas=2)
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([BM, BN], x.dtype))
    off_m = xs.program_id(0) * BM
    for n in range(0, N, 2 * BN):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [off_m, n + xs.replica_id() * BN], [BM, BN])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [off_m, n // 2], got[0].t.to(xs.float32) + got[1].t.to(xs.float32))
            ring.release()


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, BK=32))
def copy_gather_into_mma(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr):
    """C = A @ B with two copy replicas each bringing every other K block into their own ring and
    one matrix role gathering both per round (on Ascend copy and matrix share the cube: the
    gathered slots are plain values there; on Hopper two TMA warps fill two rings)."""
    load = xs.role("load", kind="copy", replicas=2)
    mma = xs.role("mma", kind="matrix")
    out = xs.role("out", kind="vector")
    ab = xs.pipe(load, mma, stages=2, a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    res = xs.pipe(mma, out, stages=1, t=xs.tile([BM, BN], xs.float32))
    off_m = xs.program_id(0) * BM
    off_n = xs.program_id(1) * BN
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for k in range(0, K, 2 * BK):
        with load:
            s = ab.acquire()
            s.a = xs.load(a, [off_m, k + xs.replica_id() * BK], [BM, BK])
            s.b = xs.load(b, [k + xs.replica_id() * BK, off_n], [BK, BN])
            ab.commit()
        with mma:
            got = ab.wait()
            acc = xs.mma(got[0].a, got[0].b, acc)
            acc = xs.mma(got[1].a, got[1].b, acc)
            acc = xs.mma_wait(acc, pending=0)
            ab.release()
    with mma:
        r = res.acquire()
        r.t = acc
        res.commit()
    with out:
        g = res.wait()
        xs.store(c, [off_m, off_n], g.t)
        res.release()
