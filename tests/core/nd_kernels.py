"""Kernels that load and store tensors of 1 to 4 dimensions (issue 38): one offset per tensor
dimension, a 1-D or 2-D tile over the tensor's last dimensions (each leading offset picks one
index). Shared by the core, nvidia and ascend tests of tests/*/test_nd_load_store.py."""
import xsync as xs


@xs.kernel
def bias_add(X, B, OUT, BM: xs.constexpr, BN: xs.constexpr):
    """OUT = X + B with a 1-D bias B[N] broadcast over the rows (like torch)."""
    w = xs.role("w", kind="vector")
    with w:
        m = xs.program_id(0) * BM
        n = xs.program_id(1) * BN
        x = xs.load(X, [m, n], [BM, BN])
        b = xs.load(B, [n], [BN])
        xs.store(OUT, [m, n], x + b)            # b broadcasts over the rows


@xs.kernel
def row_sums(X, OUT, BM: xs.constexpr, BN: xs.constexpr):
    """OUT[m] = sum of row m of X (a 1-D store of a 1-D tile)."""
    w = xs.role("w", kind="vector")
    with w:
        m = xs.program_id(0) * BM
        x = xs.load(X, [m, 0], [BM, BN])
        xs.store(OUT, [m], xs.sum(x.to(xs.float32), 1))


@xs.kernel
def scale_3d(X, OUT, S, BM: xs.constexpr, D: xs.constexpr):
    """OUT[b, s, :] = 2 * X[b, s, :] on [B, S, D] tensors, one [BM, D] tile a program."""
    w = xs.role("w", kind="vector")
    with w:
        nb = xs.cdiv(S, BM)
        b = xs.program_id(0) // nb
        m = (xs.program_id(0) % nb) * BM
        x = xs.load(X, [b, m, 0], [BM, D])
        xs.store(OUT, [b, m, 0], x * 2.0)


@xs.kernel
def heads_4d(Q, OUT, H, S, BM: xs.constexpr, D: xs.constexpr):
    """OUT[b, h, s, :] = Q[b, h, s, :] * 2 + 1 on [B, H, S, D] views (e.g. a [B, S, H, D]
    tensor's transpose(1, 2)), rows past S masked."""
    w = xs.role("w", kind="vector")
    with w:
        nb = xs.cdiv(S, BM)
        bh = xs.program_id(0) // nb
        m = (xs.program_id(0) % nb) * BM
        q = xs.load(Q, [bh // H, bh % H, m, 0], [BM, D])
        xs.store(OUT, [bh // H, bh % H, m, 0], q * 2.0 + 1.0)


@xs.kernel
def bounded_4d(Q, OUT, H, S, s_end, BM: xs.constexpr, D: xs.constexpr):
    """heads_4d, with rows at or past ``s_end`` not written (bounds: one end per dimension)."""
    w = xs.role("w", kind="vector")
    with w:
        nb = xs.cdiv(S, BM)
        bh = xs.program_id(0) // nb
        m = (xs.program_id(0) % nb) * BM
        q = xs.load(Q, [bh // H, bh % H, m, 0], [BM, D])
        xs.store(OUT, [bh // H, bh % H, m, 0], q, bounds=[bh // H + 1, H, s_end, D])


@xs.kernel
def add_3d(X, OUT, S, Z, BM: xs.constexpr, D: xs.constexpr, STAGES: xs.constexpr):
    """OUT[0, s, :] += X[z, s, :] for every z (reduce="add" into a 3-D tensor): program (m, p)
    adds the z = p, p + programs, ... of its row block, read through a pipe from a copy role."""
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    rows = xs.pipe(load, work, stages=STAGES, t=xs.tile([BM, D], xs.float32))
    m = xs.program_id(0) * BM
    for z in range(xs.program_id(1), Z, xs.num_programs(1)):
        with load:
            s = rows.acquire()
            s.t = xs.load(X, [z, m, 0], [BM, D])
            rows.commit()
        with work:
            got = rows.wait()
            xs.store(OUT, [0, m, 0], got.t, reduce="add")
            rows.release()


@xs.kernel
def batched_gemm(a, b, bias, c, M, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                 STAGES: xs.constexpr):
    """c[z] = a[z] @ b[z] + bias on [Z, M, K] @ [Z, K, N] (any strides but the last), a copy role
    filling a pipe from the 3-D tensors (program (m block, n block, z))."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    off_m = xs.program_id(0) * BM
    off_n = xs.program_id(1) * BN
    z = xs.program_id(2)
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for k in range(0, K, BK):
        with load:
            slot = tiles.acquire()
            slot.a = xs.load(a, [z, off_m, k], [BM, BK])
            slot.b = xs.load(b, [z, k, off_n], [BK, BN])
            tiles.commit()
        with mma:
            ab = tiles.wait()
            acc = xs.mma(ab.a, ab.b, acc)
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
    with mma:
        acc = acc + xs.load(bias, [off_n], [BN])[None, :]
        xs.store(c, [z, off_m, off_n], acc)


@xs.kernel
def rows_as_vectors(X, OUT, BN: xs.constexpr):
    """OUT[r, :] = 2 * X[r, :], one row a program as a 1-D tile of a 2-D tensor (columns past
    the end masked)."""
    w = xs.role("w", kind="vector")
    with w:
        r = xs.program_id(0)
        v = xs.load(X, [r, 0], [BN])
        xs.store(OUT, [r, 0], v * 2.0)
