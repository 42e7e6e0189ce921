"""Cluster kernels (xs.cluster, multicast pipe fields) for tests/core/test_cluster.py, the ascend
simulator and the nvidia compile tests: correct ones, and ones the frontend refuses (a line
marked ``# BUG`` is where the error must point); and the two steps the Hopper CTA-split tests
share (:func:`decide`, :func:`cluster_program`)."""
import dataclasses

import xsync as xs

EX = dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=2, CLUSTER=2)


def decide(kernel, cx, gluon=True):
    """xsync/backends/nvidia/cluster_ctas.py's decision for ``kernel`` lowered for nvidia at
    ``cx``, rule 1's fact given (no Triton needed)."""
    from xsync.backends.nvidia import cluster_ctas
    from xsync.backends.nvidia.alloc import is_tma_pipe

    lw = kernel.lower("nvidia", cx)
    return cluster_ctas.plan(lw.kernel, lw.placement, is_tma_pipe, gluon)


def cluster_program(kernel, cx, dtypes):
    """The cluster's one program (the CTA-split rewrite, decided on the kernel as parsed) as an
    ordinary kernel compiled for the CPU emulator, one program per cluster, after the verifier
    proved its protocol as one program."""
    from xsync.backends import get
    from xsync.backends.cpu import compile_kernel
    from xsync.backends.nvidia import cluster_ctas
    from xsync.backends.nvidia.alloc import is_tma_pipe
    from xsync.lowering.alloc import allocate
    from xsync.lowering.frontend import parse_kernel
    from xsync.lowering.protocol import derive
    from xsync.lowering.verify import verify

    consts, dtypes = kernel.specialization(cx, dtypes)
    parsed = parse_kernel(kernel.fn, consts, dtypes)
    split = cluster_ctas.plan(parsed, get("nvidia").place(parsed), is_tma_pipe, True).split
    one = dataclasses.replace(split.kernel, cluster=1, pipes=tuple(
        dataclasses.replace(p, fields=tuple(dataclasses.replace(f, multicast=False) for f in p.fields))
        for p in split.kernel.pipes))
    placement = get("cpu").place(one)
    skeleton = derive(one, placement)
    assert verify(one, placement, skeleton).proven
    return compile_kernel(one, placement, allocate(one, placement, skeleton))


@xs.kernel(example=EX)
def rank_rows(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    """Each cluster takes row blocks; every program gets the shared block (multicast) and its
    own block, and writes shared + own + rank into its rows of y ([n * CLUSTER * BLOCK, BLOCK])."""
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, shared=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True),
                   own=xs.tile([BLOCK, BLOCK], xs.float32))
    for tile in xs.tile_range(n):
        row = (tile * CLUSTER + xs.cluster_rank()) * BLOCK
        with load:
            s = ring.acquire()
            s.shared = xs.load(x, [tile * BLOCK, 0], [BLOCK, BLOCK])
            s.own = xs.load(x, [row, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [row, 0], got.shared + got.own + xs.cluster_rank())
            ring.release()


def rank_rows_ref(x, n, block, cluster):
    import torch

    y = torch.empty(n * cluster * block, block)
    for t in range(n):
        for r in range(cluster):
            row = (t * cluster + r) * block
            y[row:row + block] = x[t * block:(t + 1) * block] + x[row:row + block] + r
    return y


@xs.kernel(example=EX)
def single_tile_rows(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    """rank_rows with one tile per cluster (persistent=False): launch n * CLUSTER programs."""
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, shared=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True),
                   own=xs.tile([BLOCK, BLOCK], xs.float32))
    for tile in xs.tile_range(n, persistent=False):
        row = (tile * CLUSTER + xs.cluster_rank()) * BLOCK
        with load:
            s = ring.acquire()
            s.shared = xs.load(x, [tile * BLOCK, 0], [BLOCK, BLOCK])
            s.own = xs.load(x, [row, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [row, 0], got.shared + got.own + xs.cluster_rank())
            ring.release()


# ---------------------------------------------------------------- refused by the frontend
@xs.kernel(example=EX)
def multicast_offsets_by_rank(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    for tile in xs.tile_range(n):
        row = (tile * CLUSTER + xs.cluster_rank()) * BLOCK
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [row, 0], [BLOCK, BLOCK])  # BUG
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [row, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def multicast_offsets_by_program_id(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    me = xs.program_id(0)
    for j in range(me, n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])  # BUG
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [j * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def multicast_computed(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    for tile in xs.tile_range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [tile * BLOCK, 0], [BLOCK, BLOCK]) * 2.0  # BUG
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [tile * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def multicast_from_vector(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    xs.cluster(CLUSTER)
    make = xs.role("make", kind="vector")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(make, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))  # BUG
    for tile in xs.tile_range(n):
        with make:
            s = ring.acquire()
            s.t = xs.load(x, [tile * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [tile * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def cluster_after_role(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    work = xs.role("work", kind="vector")
    xs.cluster(CLUSTER)  # BUG
    with work:
        xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]))


@xs.kernel(example=EX)
def cluster_twice(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    xs.cluster(CLUSTER)
    xs.cluster(CLUSTER)  # BUG
    work = xs.role("work", kind="vector")
    with work:
        xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]))


@xs.kernel(example=EX)
def cluster_in_a_role(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        xs.cluster(CLUSTER)  # BUG
        xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]))


@xs.kernel(example=dict(EX, CLUSTER=3))
def cluster_of_three(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    xs.cluster(CLUSTER)  # BUG
    work = xs.role("work", kind="vector")
    with work:
        xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]))


@xs.kernel(example=EX)
def tile_unknown_keyword(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32, broadcast=True))  # BUG
    for tile in xs.tile_range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [tile * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [tile * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def multicast_offsets_carried(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    """The rank reaches the offsets around the loop: from the second iteration on."""
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    row = 0
    for j in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [row, 0], [BLOCK, BLOCK])  # BUG
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [(j * CLUSTER + xs.cluster_rank()) * BLOCK, 0], got.t)
            ring.release()
        row = row + BLOCK + xs.cluster_rank() * BLOCK


@xs.kernel(example=EX)
def multicast_offsets_by_branch(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    """The offsets are assigned in a branch on the rank: each arm a rank-free value."""
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    for tile in xs.tile_range(n):
        if xs.cluster_rank() == 0:
            row = tile * BLOCK
        else:
            row = tile * BLOCK + BLOCK
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [row, 0], [BLOCK, BLOCK])  # BUG
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [(tile * CLUSTER + xs.cluster_rank()) * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def multicast_written_by_branch(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    """Each arm of a branch on the rank writes the field once, from another row."""
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    for tile in xs.tile_range(n):
        with load:
            s = ring.acquire()
            if xs.cluster_rank() == 0:
                s.t = xs.load(x, [tile * BLOCK, 0], [BLOCK, BLOCK])  # BUG
            else:
                s.t = xs.load(x, [tile * BLOCK + BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [(tile * CLUSTER + xs.cluster_rank()) * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def multicast_by_grid_row(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    """A 2-D grid, clusters along axis 0: program_id(1) is the same for a cluster's programs,
    so it may place a multicast load (each grid row its own column block of x)."""
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    col = xs.program_id(1) * BLOCK
    for tile in xs.tile_range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [tile * BLOCK, col], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [(tile * CLUSTER + xs.cluster_rank()) * BLOCK, col], got.t + xs.cluster_rank())
            ring.release()


@xs.kernel(example=EX)
def multicast_without_cluster(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    """No xs.cluster: every program is a cluster of one, so the tile of xs.tile_range (its
    program id) may place a multicast load, as with xs.cluster(1)."""
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    for tile in xs.tile_range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [tile * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [tile * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, BK=32, CLUSTER=2))
def gemm_holds_two_multicast_slots(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                                   CLUSTER: xs.constexpr):
    """The matrix role holds two slots (wait, wait, release, release): fine on its own agent;
    on Ascend copy and matrix share the cube, where a pipe holds one value at a time."""
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=2, a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype, multicast=True))
    off_m = (xs.cluster_id() * CLUSTER + xs.cluster_rank()) * BM
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for k in range(0, K, 2 * BK):
        with load:
            s = tiles.acquire()
            s.a = xs.load(a, [off_m, k], [BM, BK])
            s.b = xs.load(b, [k, 0], [BK, BN])
            tiles.commit()
            s2 = tiles.acquire()
            s2.a = xs.load(a, [off_m, k + BK], [BM, BK])
            s2.b = xs.load(b, [k + BK, 0], [BK, BN])
            tiles.commit()
        with mma:
            g1 = tiles.wait()
            g2 = tiles.wait()
            acc = xs.mma(g1.a, g1.b, acc)
            acc = xs.mma(g2.a, g2.b, acc)
            acc = xs.mma_wait(acc, pending=0)
            tiles.release(g1)
            tiles.release(g2)
    with mma:
        xs.store(c, [off_m, 0], acc)


@xs.kernel(example=EX)
def consumer_trips_by_rank(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    """The consumer's loop is one trip shorter in every program but the first: program 1's
    last slot is left committed and never waited (a leftover, not a deadlock)."""
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    with work:
        acc = xs.zeros([BLOCK, BLOCK], xs.float32)
    for j in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
    for j2 in range(n - xs.cluster_rank()):
        with work:
            got = ring.wait()
            acc = acc + got.t
            ring.release()
    with work:
        xs.store(y, [xs.program_id(0) * BLOCK, 0], acc)


REFUSED = (
    (multicast_offsets_by_rank, "depend on `row` (computed from xs.cluster_rank())"),
    (multicast_offsets_by_program_id,
     "depend on `j` (computed from xs.program_id(), through the bounds of the loop at line"),
    (multicast_offsets_carried, "depend on `row` (computed from xs.cluster_rank())"),
    (multicast_offsets_by_branch, "depend on `row` (computed from xs.cluster_rank(), through the branch at line"),
    (multicast_written_by_branch, "slot `s`, acquired before the branch at line"),
    (multicast_computed, "not written by xs.load"),
    (multicast_from_vector, "producer 'make' is a vector role"),
    (cluster_after_role, "after a role declaration"),
    (cluster_twice, "declared twice"),
    (cluster_in_a_role, "inside a loop, branch or role block"),
    (cluster_of_three, "is 3 programs"),
    (tile_unknown_keyword, "unknown arguments ['broadcast']"),
)
