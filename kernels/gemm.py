"""Pipelined GEMM: a copy role streams A and B tiles through a ring of `STAGES` slots
to a matrix role that accumulates C = A @ B in fp32.

On Hopper the copy role is a 1-warp TMA producer and the ring lives in shared memory;
on Ascend both roles sit on the cube core and the ring becomes program order; on the
CPU emulator each role is a thread.

Default tiles (BM = BN = 128, BK = 64, STAGES = 3): on Hopper the ring takes 3 x 32 KB of
shared memory. On the Ascend 910B the HIVM compiler places the A and B tiles in L1 (64 KB of
512 KB, double-buffered) and the fp32 accumulator in L0C (64 KB of 128 KB); there is no
cross-core flag (measured by the ascend matrix's compiler stage, hivm-plan-memory).
"""
import xsync as xs


def _trace_args(settings):
    """Small launch for `xsync trace` (CPU emulator): 2 programs, 4 K steps each, so
    the 2-slot ring fills and the producer waits for releases. --set overrides tiles."""
    import torch

    cx = dict(BM=16, BN=16, BK=16, STAGES=2)
    cx.update({k: v for k, v in settings.items() if k in cx})
    M, N, K = cx["BM"], 2 * cx["BN"], 4 * cx["BK"]
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.zeros(M, N)
    return (1, 2), (a, b, c, M, N, K), cx


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32,
                        BM=128, BN=128, BK=64, STAGES=3), trace=_trace_args)
def gemm(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
         STAGES: xs.constexpr, GROUP_M: xs.constexpr = 8):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))

    # Programs take output tiles in groups of GROUP_M row blocks, column by column, so
    # the programs running at once share their A and B tiles in L2.
    blocks_m = xs.num_programs(0)
    pid = xs.program_id(1) * blocks_m + xs.program_id(0)
    per_group = GROUP_M * xs.num_programs(1)
    first_m = (pid // per_group) * GROUP_M
    group_rows = xs.minimum(blocks_m - first_m, GROUP_M)
    off_m = (first_m + pid % per_group % group_rows) * BM
    off_n = (pid % per_group // group_rows) * BN
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for k in range(0, K, BK):
        with load:
            slot = tiles.acquire()
            slot.a = xs.load(a, [off_m, k], [BM, BK])
            slot.b = xs.load(b, [k, off_n], [BK, BN])
            tiles.commit()
        with mma:
            ab = tiles.wait()
            acc = xs.mma(ab.a, ab.b, acc)
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
    with mma:
        xs.store(c, [off_m, off_n], acc)


def _persistent_trace_args(settings, replicas: int = 1):
    """Small launch for `xsync trace`: 2 programs walking 3 output tiles (of `replicas` * BM
    rows) of 4 K steps."""
    import torch

    cx = dict(BM=16, BN=16, BK=16, STAGES=2)
    cx.update({k: v for k, v in settings.items() if k in cx})
    M, N, K = replicas * cx["BM"], 3 * cx["BN"], 4 * cx["BK"]
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.zeros(M, N)
    return (2,), (a, b, c, M, N, K), cx


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32,
                        BM=128, BN=128, BK=64, STAGES=4), trace=_persistent_trace_args)
def gemm_persistent(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                    STAGES: xs.constexpr, GROUP_M: xs.constexpr = 8):
    """The same GEMM with a persistent tile loop: launch one program per SM (or AI core),
    each walks output tiles p, p + P, ... in the grouped order above. The ring's counters
    run on from tile to tile, so the load role fetches the next tile's A and B while the
    matrix role stores this tile's C: the epilogue overlaps the next mainloop."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))

    blocks_m = xs.cdiv(M, BM)
    blocks_n = xs.cdiv(N, BN)
    per_group = GROUP_M * blocks_n
    for tile in xs.tile_range(blocks_m * blocks_n):
        first_m = (tile // per_group) * GROUP_M
        group_rows = xs.minimum(blocks_m - first_m, GROUP_M)
        off_m = (first_m + tile % per_group % group_rows) * BM
        off_n = (tile % per_group // group_rows) * BN
        with mma:
            acc = xs.zeros([BM, BN], xs.float32)
        for k in range(0, K, BK):
            with load:
                slot = tiles.acquire()
                slot.a = xs.load(a, [off_m, k], [BM, BK])
                slot.b = xs.load(b, [k, off_n], [BK, BN])
                tiles.commit()
            with mma:
                ab = tiles.wait()
                acc = xs.mma(ab.a, ab.b, acc)
                acc = xs.mma_wait(acc, pending=0)
                tiles.release()
        with mma:
            xs.store(c, [off_m, off_n], acc)


def _persistent_2wg_trace_args(settings):
    return _persistent_trace_args(settings, replicas=2)


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32,
                        BM=128, BN=128, BK=64, STAGES=4), trace=_persistent_2wg_trace_args)
def gemm_persistent_2wg(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                        STAGES: xs.constexpr, GROUP_M: xs.constexpr = 8):
    """The persistent GEMM with output tiles of 2*BM x BN: two matrix replicas, replica r
    computing rows r*BM.. of the tile. Each replica's A tiles come through a paired pipe
    from its own copy replica; the B tile, which both need, through one pipe from a
    one-replica copy role to both (a broadcast: one load per K step, two consumers). One
    program per SM (or AI core) walks the tiles p, p + P, ... in the grouped order; as in
    gemm_persistent the rings run on across tiles, so the next tile's loads overlap this
    tile's epilogue. On Hopper: two consumer warpgroups sharing each B tile, as CUTLASS's
    cooperative 256x128 schedule; ring of STAGES x (2 x BM x BK + BK x BN) bf16 (4 x 48 KB).
    The verifier proves it on every placement, for every value of M, N and K: its tile loop
    holds every action, so it is checked tile by tile, one tile standing for any number
    (the general check, combining program ids with M, N and K, could only thin them)."""
    load_a = xs.role("load_a", kind="copy", replicas=2)
    load_b = xs.role("load_b", kind="copy")
    mma = xs.role("mma", kind="matrix", replicas=2)
    a_in = xs.pipe(load_a, mma, stages=STAGES, a=xs.tile([BM, BK], a.dtype))   # paired: r -> r
    b_in = xs.pipe(load_b, mma, stages=STAGES, b=xs.tile([BK, BN], b.dtype))   # 1 -> both

    blocks_m = xs.cdiv(M, 2 * BM)
    blocks_n = xs.cdiv(N, BN)
    per_group = GROUP_M * blocks_n
    for tile in xs.tile_range(blocks_m * blocks_n):
        first_m = (tile // per_group) * GROUP_M
        group_rows = xs.minimum(blocks_m - first_m, GROUP_M)
        off_m = (first_m + tile % per_group % group_rows) * (2 * BM)
        off_n = (tile % per_group // group_rows) * BN
        with mma:
            acc = xs.zeros([BM, BN], xs.float32)
        for k in range(0, K, BK):
            with load_a:
                sa = a_in.acquire()
                sa.a = xs.load(a, [off_m + xs.replica_id() * BM, k], [BM, BK])
                a_in.commit()
            with load_b:
                sb = b_in.acquire()
                sb.b = xs.load(b, [k, off_n], [BK, BN])
                b_in.commit()
            with mma:
                ta = a_in.wait()
                tb = b_in.wait()
                acc = xs.mma(ta.a, tb.b, acc)
                acc = xs.mma_wait(acc, pending=0)
                a_in.release()
                b_in.release()
        with mma:
            xs.store(c, [off_m + xs.replica_id() * BM, off_n], acc)


def _cluster_trace_args(settings):
    """Small launch for `xsync trace`: one cluster of 2 programs walking 2 output tiles of
    2*BM x BN (each program BM rows), 4 K steps each."""
    import torch

    cx = dict(BM=16, BN=16, BK=16, STAGES=2, CLUSTER=2)
    cx.update({k: v for k, v in settings.items() if k in cx})
    M, N, K = cx["CLUSTER"] * cx["BM"], 2 * cx["BN"], 4 * cx["BK"]
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.zeros(M, N)
    return (cx["CLUSTER"],), (a, b, c, M, N, K), cx


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32,
                        BM=128, BN=128, BK=64, STAGES=4, CLUSTER=2), trace=_cluster_trace_args)
def gemm_cluster(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                 STAGES: xs.constexpr, CLUSTER: xs.constexpr = 2, GROUP_M: xs.constexpr = 8):
    """The persistent GEMM over clusters of CLUSTER programs stacked along M: a cluster takes
    an output tile of CLUSTER*BM x BN, program r its rows r*BM.., so the programs of a cluster
    need the same B tile at every K step. B is a multicast field: where the target has a
    multicast copy, one load reaches every program (Hopper: the lead CTA's TMA multicast; a
    slot is free once every program of the cluster released it); elsewhere each program
    loads its own copy (the allocation table says which). Launch a multiple of CLUSTER
    programs (one cluster per CLUSTER SMs or AI cores)."""
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype, multicast=True))

    blocks_m = xs.cdiv(M, CLUSTER * BM)
    blocks_n = xs.cdiv(N, BN)
    per_group = GROUP_M * blocks_n
    for tile in xs.tile_range(blocks_m * blocks_n):
        first_m = (tile // per_group) * GROUP_M
        group_rows = xs.minimum(blocks_m - first_m, GROUP_M)
        cluster_m = (first_m + tile % per_group % group_rows) * (CLUSTER * BM)
        off_n = (tile % per_group // group_rows) * BN
        off_m = cluster_m + xs.cluster_rank() * BM
        with mma:
            acc = xs.zeros([BM, BN], xs.float32)
        for k in range(0, K, BK):
            with load:
                slot = tiles.acquire()
                slot.a = xs.load(a, [off_m, k], [BM, BK])
                slot.b = xs.load(b, [k, off_n], [BK, BN])
                tiles.commit()
            with mma:
                ab = tiles.wait()
                acc = xs.mma(ab.a, ab.b, acc)
                acc = xs.mma_wait(acc, pending=0)
                tiles.release()
        with mma:
            xs.store(c, [off_m, off_n], acc)


def _cluster_2wg_trace_args(settings):
    """Small launch for `xsync trace`: one cluster of 2 programs walking 2 output tiles of
    2 * 2*BM x BN (each program two replicas of BM rows), 4 K steps each."""
    import torch

    cx = dict(BM=16, BN=16, BK=16, STAGES=2, CLUSTER=2)
    cx.update({k: v for k, v in settings.items() if k in cx})
    M, N, K = 2 * cx["CLUSTER"] * cx["BM"], 2 * cx["BN"], 4 * cx["BK"]
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.zeros(M, N)
    return (cx["CLUSTER"],), (a, b, c, M, N, K), cx


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32,
                        BM=128, BN=128, BK=64, STAGES=4, CLUSTER=2), trace=_cluster_2wg_trace_args)
def gemm_cluster_2wg(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                     STAGES: xs.constexpr, CLUSTER: xs.constexpr = 2, GROUP_M: xs.constexpr = 8):
    """gemm_cluster at gemm_persistent_2wg's shape: each program two matrix replicas (2*BM x BN),
    clusters of CLUSTER programs stacked along M, so a cluster takes 2*CLUSTER*BM x BN. Replica r
    of every program takes the band of CLUSTER*BM rows at r*CLUSTER*BM, program (rank) q its BM
    rows q*BM.. of it: the rank steps innermost, so each replica's rows over the cluster are one
    block (on Hopper its CTA split). B is a multicast field through a one-replica copy role to
    both replicas: one load serves 2 warpgroups x CLUSTER programs (Hopper: the lead CTA's TMA
    multicast; a slot is free once both replicas of every program released it); elsewhere each
    program loads its own B. Launch a multiple of CLUSTER programs. Fastest measured on Hopper:
    BM=64, BN=256, STAGES=3, bf16 C (128 x 256 a CTA, each warpgroup a 64 x 256 wgmma; docs/design.md §8)."""
    xs.cluster(CLUSTER)
    load_a = xs.role("load_a", kind="copy", replicas=2)
    load_b = xs.role("load_b", kind="copy")
    mma = xs.role("mma", kind="matrix", replicas=2)
    a_in = xs.pipe(load_a, mma, stages=STAGES, a=xs.tile([BM, BK], a.dtype))                   # paired: r -> r
    b_in = xs.pipe(load_b, mma, stages=STAGES, b=xs.tile([BK, BN], b.dtype, multicast=True))   # 1 -> both

    blocks_m = xs.cdiv(M, 2 * CLUSTER * BM)
    blocks_n = xs.cdiv(N, BN)
    per_group = GROUP_M * blocks_n
    for tile in xs.tile_range(blocks_m * blocks_n):
        first_m = (tile // per_group) * GROUP_M
        group_rows = xs.minimum(blocks_m - first_m, GROUP_M)
        cluster_m = (first_m + tile % per_group % group_rows) * (2 * CLUSTER * BM)
        off_n = (tile % per_group // group_rows) * BN
        off_m = cluster_m + xs.cluster_rank() * BM
        with mma:
            acc = xs.zeros([BM, BN], xs.float32)
        for k in range(0, K, BK):
            with load_a:
                sa = a_in.acquire()
                sa.a = xs.load(a, [off_m + xs.replica_id() * (CLUSTER * BM), k], [BM, BK])
                a_in.commit()
            with load_b:
                sb = b_in.acquire()
                sb.b = xs.load(b, [k, off_n], [BK, BN])
                b_in.commit()
            with mma:
                ta = a_in.wait()
                tb = b_in.wait()
                acc = xs.mma(ta.a, tb.b, acc)
                acc = xs.mma_wait(acc, pending=0)
                a_in.release()
                b_in.release()
        with mma:
            xs.store(c, [off_m + xs.replica_id() * (CLUSTER * BM), off_n], acc)
