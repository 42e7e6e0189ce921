"""The pipelined GEMM (kernels/gemm.py) written other ways with the same meaning.

One consumer warpgroup (the flagship ``gemm`` is the accumulate form with A and B in one pipe):

* ``gemm_split``: the split form ``t = mma(a, b); acc = acc + t``, one pipe;
* ``gemm_two_pipes``: the accumulate form ``acc = mma(a, b, acc)``, A and B in two pipes;
* ``gemm_two_pipes_split``: the split form, two pipes.

Two consumer warpgroups (a program computes 2*BM rows: replica r the rows r*BM..; the A tiles
come from a copy role with two replicas through a paired pipe, B from a one-replica copy role
to both):

* ``gemm_2wg``: the accumulate form (the reference of this pair);
* ``gemm_2wg_split``: the split form.

On Hopper the schedule passes must give each split form its accumulate form's schedule and
every one-warpgroup variant the flagship's wgmma sequence: tests/nvidia/test_variants.py
compares their PTX hot loops, benchmarks/attention.py (``variants``) their speed. Grid:
(cdiv(M, BM), cdiv(N, BN)) for one warpgroup, (cdiv(M, 2 * BM), cdiv(N, BN)) for two; programs
take output tiles in groups of GROUP_M row blocks as the flagship does.
"""
import xsync as xs

EXAMPLE = dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=128, BN=128, BK=64, STAGES=3)
EXAMPLE_2WG = EXAMPLE         # BM rows per consumer warpgroup: 2*BM per program


@xs.kernel(example=EXAMPLE)
def gemm_split(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
               STAGES: xs.constexpr, GROUP_M: xs.constexpr = 8):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
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
            t = xs.mma(ab.a, ab.b)
            t = xs.mma_wait(t, pending=0)
            tiles.release()
            acc = acc + t
    with mma:
        xs.store(c, [off_m, off_n], acc)


@xs.kernel(example=EXAMPLE)
def gemm_two_pipes(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                   STAGES: xs.constexpr, GROUP_M: xs.constexpr = 8):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    a_in = xs.pipe(load, mma, stages=STAGES, a=xs.tile([BM, BK], a.dtype))
    b_in = xs.pipe(load, mma, stages=STAGES, b=xs.tile([BK, BN], b.dtype))
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
            sa = a_in.acquire()
            sa.a = xs.load(a, [off_m, k], [BM, BK])
            a_in.commit()
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
        xs.store(c, [off_m, off_n], acc)


@xs.kernel(example=EXAMPLE)
def gemm_two_pipes_split(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                         STAGES: xs.constexpr, GROUP_M: xs.constexpr = 8):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    a_in = xs.pipe(load, mma, stages=STAGES, a=xs.tile([BM, BK], a.dtype))
    b_in = xs.pipe(load, mma, stages=STAGES, b=xs.tile([BK, BN], b.dtype))
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
            sa = a_in.acquire()
            sa.a = xs.load(a, [off_m, k], [BM, BK])
            a_in.commit()
            sb = b_in.acquire()
            sb.b = xs.load(b, [k, off_n], [BK, BN])
            b_in.commit()
        with mma:
            ta = a_in.wait()
            tb = b_in.wait()
            t = xs.mma(ta.a, tb.b)
            t = xs.mma_wait(t, pending=0)
            a_in.release()
            b_in.release()
            acc = acc + t
    with mma:
        xs.store(c, [off_m, off_n], acc)


@xs.kernel(example=EXAMPLE_2WG)
def gemm_2wg(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
             STAGES: xs.constexpr, GROUP_M: xs.constexpr = 8):
    load_a = xs.role("load_a", kind="copy", replicas=2)
    load_b = xs.role("load_b", kind="copy")
    mma = xs.role("mma", kind="matrix", replicas=2)
    a_in = xs.pipe(load_a, mma, stages=STAGES, a=xs.tile([BM, BK], a.dtype))   # paired: replica r -> r
    b_in = xs.pipe(load_b, mma, stages=STAGES, b=xs.tile([BK, BN], b.dtype))   # broadcast to both
    blocks_m = xs.num_programs(0)
    pid = xs.program_id(1) * blocks_m + xs.program_id(0)
    per_group = GROUP_M * xs.num_programs(1)
    first_m = (pid // per_group) * GROUP_M
    group_rows = xs.minimum(blocks_m - first_m, GROUP_M)
    off_m = (first_m + pid % per_group % group_rows) * (2 * BM)
    off_n = (pid % per_group // group_rows) * BN
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


@xs.kernel(example=EXAMPLE_2WG)
def gemm_2wg_split(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                   STAGES: xs.constexpr, GROUP_M: xs.constexpr = 8):
    load_a = xs.role("load_a", kind="copy", replicas=2)
    load_b = xs.role("load_b", kind="copy")
    mma = xs.role("mma", kind="matrix", replicas=2)
    a_in = xs.pipe(load_a, mma, stages=STAGES, a=xs.tile([BM, BK], a.dtype))
    b_in = xs.pipe(load_b, mma, stages=STAGES, b=xs.tile([BK, BN], b.dtype))
    blocks_m = xs.num_programs(0)
    pid = xs.program_id(1) * blocks_m + xs.program_id(0)
    per_group = GROUP_M * xs.num_programs(1)
    first_m = (pid // per_group) * GROUP_M
    group_rows = xs.minimum(blocks_m - first_m, GROUP_M)
    off_m = (first_m + pid % per_group % group_rows) * (2 * BM)
    off_n = (pid % per_group // group_rows) * BN
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
            t = xs.mma(ta.a, tb.b)
            t = xs.mma_wait(t, pending=0)
            a_in.release()
            b_in.release()
            acc = acc + t
    with mma:
        xs.store(c, [off_m + xs.replica_id() * BM, off_n], acc)
