"""The verifier's corpus: kernels a user could plausibly write, one per case, named by the
class of mistake the verifier once made on them (issue 11) or must keep making right.

A line marked ``# BUG`` is where the diagnosis must point. ``tests/core/test_corpus.py``
holds the expectation of each kernel (error class, wording, backends); kernels whose name
ends in ``_fixed`` apply the fix the verifier's message proposes for the kernel of the same
stem, and must verify.

Classes:
* late: accepted before, then hung or overflowed at larger trip counts;
* correct: correct kernels that were rejected (every placement must accept them);
* consistent: the counterexample must be one that can happen (related trip counts);
* hint: the proposed fix must fix (the ``_fixed`` variants);
* emulator: with the verifier off, the CPU emulator must report what the verifier would;
* pairing: replica pairing corners (1 -> N, N -> N, N -> 1).
"""
import xsync as xs

EX = dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=2)
GEMM = dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=32, BN=32, BK=16, STAGES=2)


# ====================================================================== late
@xs.kernel(example=EX)
def late_skip_release_every_8th(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for j in range(n):
        with load:
            s = ring.acquire()  # BUG
            s.t = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [j * BLOCK, 0], got.t)
            if j % 8 != 7:
                ring.release()


@xs.kernel(example=EX)
def late_skip_release_every_8th_fixed(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for j in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            if j % 8 != 7:
                xs.store(y, [j * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def late_flag_overflow(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # matrix and vector roles: different cores on Ascend, one warpgroup on Hopper
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    tick = xs.event(mma, vec)  # BUG
    for i in range(n):
        with mma:
            xs.signal(tick)
        with vec:
            xs.wait(tick)


@xs.kernel(example=EX)
def late_flag_overflow_fixed(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    tick = xs.event(mma, vec)
    done = xs.event(vec, mma)          # back-pressure: one tick in flight at a time
    for i in range(n):
        with mma:
            if i > 0:
                xs.wait(done)
            xs.signal(tick)
        with vec:
            xs.wait(tick)
            if i < n - 1:
                xs.signal(done)


@xs.kernel(example=EX)
def late_phase_aliasing(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")       # the Hopper producer warp
    work = xs.role("work", kind="vector")     # a consumer warpgroup
    tick = xs.event(load, work)  # BUG
    for i in range(n):
        with load:
            xs.signal(tick)
        with work:
            xs.wait(tick)


@xs.kernel(example=EX)
def late_leak_after_threshold(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=4, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            s = ring.acquire()  # BUG
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            if i < 5:
                ring.release()


@xs.kernel(example=EX)
def late_gather_runs_ahead(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # two vector warpgroups signal one copy warp; nothing holds the fast one back, and an
    # mbarrier counts arrivals, not who arrived
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector", replicas=2)
    done = xs.event(work, load)  # BUG
    for i in range(n):
        with work:
            xs.signal(done)
        with load:
            xs.wait(done)


@xs.kernel(example=EX)
def late_arrive_runs_ahead(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    team = xs.barrier(load, work)  # BUG
    for i in range(n):
        with load:
            team.arrive()
        with work:
            team.sync()


@xs.kernel(example=EX)
def late_arrive_runs_ahead_fixed(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    team = xs.barrier(load, work)
    for i in range(n):
        with load:
            team.sync()
        with work:
            team.sync()


@xs.kernel(example=EX)
def late_nested_inner_short(x, y, n, m, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for t in range(n):
        with load:
            for k in range(m):
                s = ring.acquire()  # BUG
                s.t = xs.load(x, [k * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
        with work:
            for k in range(m - 1):
                got = ring.wait()
                xs.store(y, [k * BLOCK, 0], got.t)
                ring.release()


# Found by the differential test (tests/core/protogen.py) against a verifier that, like the
# first one, tried run-time trip counts only up to stages + 2: each was accepted there and
# fails on the emulator at a larger n.
@xs.kernel(example=EX)
def late_found_wait_skipped_every_8th(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # generated protocol 45: a release on the path where the wait was skipped (n >= 8)
    r0 = xs.role("r0", kind="matrix", replicas=2)
    r1 = xs.role("r1", kind="matrix")
    p0 = xs.pipe(r1, r0, stages=1)
    for i in range(n):
        with r1:
            p0.acquire()
            p0.commit()
        with r0:
            if i % 8 != 7:
                p0.wait()
            p0.release()  # BUG


@xs.kernel(example=EX)
def late_found_barrier_after_threshold(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # generated protocol 87: from i = 10 on only one member meets the barrier (n >= 12)
    r0 = xs.role("r0", kind="vector")
    r1 = xs.role("r1", kind="vector")
    e0 = xs.event(r1, r0)
    e1 = xs.event(r0, r1)
    b2 = xs.barrier()
    if n > 2:
        for i in range(n - 1):
            with r1:
                xs.signal(e0)
                xs.wait(e1)
                if i > 9:
                    b2.sync()  # BUG
            with r0:
                xs.wait(e0)
                xs.signal(e1)
                if i > 9:
                    if i < 9:
                        b2.sync()


@xs.kernel(example=EX)
def late_found_arrive_stops_after_8(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # generated protocol 237: one member stops arriving after 8 meetings (n >= 17)
    r1 = xs.role("r1", kind="copy", replicas=2)
    r2 = xs.role("r2", kind="copy")
    r3 = xs.role("r3", kind="vector", replicas=2)
    b0 = xs.barrier(r2, r1, r3)
    for i in range(xs.cdiv(n, 2)):
        with r3:
            b0.sync()
        with r2:
            if i < 8:
                b0.arrive()
        with r1:
            b0.sync()  # BUG


@xs.kernel(example=EX)
def late_found_release_skipped_once(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # generated protocol 257: the 8th slot of p1 is never released (n >= 15)
    r0 = xs.role("r0", kind="matrix")
    r1 = xs.role("r1", kind="matrix")
    r2 = xs.role("r2", kind="copy")
    p0 = xs.pipe(r0, r1, stages=4)
    p1 = xs.pipe(r0, r2, stages=2)  # BUG
    p2 = xs.pipe(r1, r0, stages=1)
    for i in range(xs.cdiv(n, 2)):
        with r1:
            p0.wait()  # BUG nvidia ascend (r1 and r0 share an agent there: wrong source order)
            p0.release()
            p2.acquire()
            p2.commit()
        with r2:
            p1.wait()
            if i != 7:
                p1.release()
        with r0:
            p0.acquire()
            p0.commit()
            p1.acquire()
            p1.commit()
            p2.wait()
            p2.release()


# ====================================================================== correct
@xs.kernel(example=EX)
def correct_peeled_first_iteration(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    if n > 0:
        with load:
            s0 = ring.acquire()
            s0.t = xs.load(x, [0, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            g0 = ring.wait()
            xs.store(y, [0, 0], g0.t)
            ring.release()
    for i in range(1, n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def correct_cdiv_and_floor_agree(x, y, K, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # full blocks in the main loop, the partial one in a guarded tail
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    full = K // BLOCK
    for k in range(full):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [k * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [k * BLOCK, 0], got.t)
            ring.release()
    if xs.cdiv(K, BLOCK) > full:
        with load:
            st = ring.acquire()
            st.t = xs.load(x, [full * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            gt = ring.wait()
            xs.store(y, [full * BLOCK, 0], gt.t)
            ring.release()


@xs.kernel(example=EX)
def correct_replica_barrier_on_cube(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the Ascend cube runs both replicas of 'mma' one after the other: the barrier among
    # them is met by program order there, and by the two warpgroups on Hopper
    mma = xs.role("mma", kind="matrix", replicas=2)
    soft = xs.role("soft", kind="vector", replicas=2)
    s_pipe = xs.pipe(mma, soft, stages=1, s=xs.tile([BLOCK, BLOCK], xs.float32))
    team = xs.barrier(mma)
    for i in range(n):
        with mma:
            t = xs.load(x, [xs.replica_id() * BLOCK, 0], [BLOCK, BLOCK])
            out = s_pipe.acquire()
            out.s = xs.mma(t, t)
            s_pipe.commit()
            team.sync()
        with soft:
            got = s_pipe.wait()
            xs.store(y, [xs.replica_id() * BLOCK, 0], got.s)
            s_pipe.release()


@xs.kernel(example=EX)
def correct_barrier_of_roles_sharing_an_agent(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # mma and softmax share the Hopper consumer warpgroup; load and mma share the Ascend
    # cube: each agent meets the barrier once per meeting
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    soft = xs.role("softmax", kind="vector")
    tiles = xs.pipe(load, mma, stages=STAGES, a=xs.tile([BLOCK, BLOCK], xs.float32))
    s_pipe = xs.pipe(mma, soft, stages=1, s=xs.tile([BLOCK, BLOCK], xs.float32))
    team = xs.barrier(load, mma, soft)
    for i in range(n):
        with load:
            sl = tiles.acquire()
            sl.a = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            tiles.commit()
            team.sync()
        with mma:
            g = tiles.wait()
            o = s_pipe.acquire()
            o.s = xs.mma_wait(xs.mma(g.a, g.a), pending=0)
            s_pipe.commit()
            tiles.release()
            team.sync()
        with soft:
            got = s_pipe.wait()
            xs.store(y, [i * BLOCK, 0], got.s)
            s_pipe.release()
            team.sync()


@xs.kernel(example=EX)
def correct_all_roles_barrier(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    soft = xs.role("softmax", kind="vector", replicas=2)
    tiles = xs.pipe(load, mma, stages=STAGES, a=xs.tile([BLOCK, BLOCK], xs.float32))
    s_pipe = xs.pipe(mma, soft, stages=1, s=xs.tile([BLOCK, BLOCK], xs.float32))
    everyone = xs.barrier()
    for i in range(n):
        with load:
            sl = tiles.acquire()
            sl.a = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            tiles.commit()
        with mma:
            g = tiles.wait()
            o = s_pipe.acquire()
            o.s = xs.mma_wait(xs.mma(g.a, g.a), pending=0)
            s_pipe.commit()
            tiles.release()
        with soft:
            got = s_pipe.wait()
            xs.store(y, [i * BLOCK + xs.replica_id() * BLOCK, 0], got.s)
            s_pipe.release()
        with load:
            everyone.sync()
        with mma:
            everyone.sync()
        with soft:
            everyone.sync()


@xs.kernel(example=GEMM)
def correct_named_bound_with_prologue(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr,
                                      BK: xs.constexpr, STAGES: xs.constexpr):
    # the first K step is peeled under `if n_k > 0`; the main loop starts at 1
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES, a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    n_k = xs.cdiv(K, BK)
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    if n_k > 0:
        with load:
            s0 = tiles.acquire()
            s0.a = xs.load(a, [0, 0], [BM, BK])
            s0.b = xs.load(b, [0, 0], [BK, BN])
            tiles.commit()
        with mma:
            g0 = tiles.wait()
            acc = xs.mma(g0.a, g0.b, acc)
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
    for k in range(1, n_k):
        with load:
            s = tiles.acquire()
            s.a = xs.load(a, [0, k * BK], [BM, BK])
            s.b = xs.load(b, [k * BK, 0], [BK, BN])
            tiles.commit()
        with mma:
            g = tiles.wait()
            acc = xs.mma(g.a, g.b, acc)
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
    with mma:
        xs.store(c, [0, 0], acc)


@xs.kernel(example=EX)
def correct_periodic_both_sides(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for j in range(n):
        if j % 8 == 7:          # every 8th block travels; the condition is replicated
            with load:
                s = ring.acquire()
                s.t = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
            with work:
                got = ring.wait()
                xs.store(y, [j * BLOCK, 0], got.t)
                ring.release()


@xs.kernel(example=EX)
def correct_nested_runtime_loops(x, y, n, m, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # n tiles of m K-steps each; after each tile the consumer hands a slot back to the
    # producer (a pipe has back-pressure, so it stays correct for m = 0 too)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    done = xs.pipe(work, load, stages=1)
    for t in range(n):
        for k in range(m):
            with load:
                s = ring.acquire()
                s.t = xs.load(x, [k * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
            with work:
                got = ring.wait()
                xs.store(y, [k * BLOCK, 0], got.t)
                ring.release()
        with work:
            done.acquire()
            done.commit()
        with load:
            done.wait()
            done.release()


@xs.kernel(example=EX)
def correct_persistent_tiles(x, y, tiles_total, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # every agent walks the same tiles: pid, pid + programs, ...
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for tile in range(xs.program_id(0), tiles_total, xs.num_programs(0)):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [tile * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [tile * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, cu=xs.int32, BLOCK=16, STAGES=2))
def correct_sequence_lengths(x, y, cu, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # a variable-length batch: the trip count comes from two load_scalar values
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    b = xs.program_id(0)
    start = xs.load_scalar(cu, b)
    length = xs.load_scalar(cu, b + 1) - start
    if length > 0:
        for k in range(0, length, BLOCK):
            with load:
                s = ring.acquire()
                s.t = xs.load(x, [start + k, 0], [BLOCK, BLOCK])
                ring.commit()
            with work:
                got = ring.wait()
                xs.store(y, [start + k, 0], got.t)
                ring.release()


@xs.kernel(example=EX)
def correct_credit_backpressure(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # two credits: the signaller runs at most two ticks ahead, whatever n
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    tick = xs.event(mma, vec)
    credit = xs.event(vec, mma)
    with vec:
        xs.signal(credit)
        xs.signal(credit)
    for i in range(n):
        with mma:
            xs.wait(credit)
            xs.signal(tick)
        with vec:
            xs.wait(tick)
            xs.signal(credit)
    with mma:
        xs.wait(credit)
        xs.wait(credit)


@xs.kernel(example=EX)
def correct_broadcast_with_team(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # one producer, two consumer replicas that each release every slot and meet after it
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector", replicas=2)
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    team = xs.barrier(work)
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            if i % 2 == xs.replica_id():
                xs.store(y, [i * BLOCK, 0], got.t)
            ring.release()
            team.sync()


@xs.kernel(example=EX)
def correct_deferred_release(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the consumer releases one slot late (it keeps the previous one), so it needs 2 stages
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            if i > 0:
                ring.release()
    if n > 0:
        with work:
            ring.release()


# ====================================================================== consistent
@xs.kernel(example=EX)
def consistent_range_one_short(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    with load:
        for i in range(n):
            s = ring.acquire()  # BUG ascend (one vector core: per-role loops)
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
    with work:
        for i in range(1, n):
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def consistent_cdiv_vs_floor(x, y, K, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    with load:
        for k in range(xs.cdiv(K, BLOCK)):
            s = ring.acquire()  # BUG ascend (one vector core: per-role loops)
            s.t = xs.load(x, [k * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
    with work:
        for k in range(K // BLOCK):
            got = ring.wait()
            xs.store(y, [k * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def consistent_producer_runs_longer(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the consumer releases everything it waits for; it just stops early: a hang in the
    # producer's acquire, blamed on the trip counts, not on a missing release
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=1, t=xs.tile([BLOCK, BLOCK], xs.float32))
    with load:
        for i in range(n + 2):
            s = ring.acquire()  # BUG
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
    with work:
        for i in range(n):
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def consistent_blames_the_waiter(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # 'c' finishes; only 'a' and 'b' are stuck (a waits for b's signal that b never sends)
    a = xs.role("a", kind="copy")
    b = xs.role("b", kind="vector")
    c = xs.role("c", kind="matrix")
    ab = xs.event(b, a)
    bc = xs.event(c, b)
    ready = xs.event(a, b)
    with c:
        xs.signal(bc)
    with b:
        xs.wait(bc)
        xs.wait(ready)
        xs.signal(ab)
    with a:
        xs.wait(ab)  # BUG
        xs.signal(ready)


@xs.kernel(example=EX)
def consistent_leftover_not_release(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # one extra slot committed after the loop: a leftover, not a missing release
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=4, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            ring.release()
    with load:
        extra = ring.acquire()
        extra.t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        ring.commit()


# ====================================================================== hint
@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=2))
def hint_per_role_loops_on_cube(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES, a=xs.tile([BLOCK, BLOCK], xs.float32))
    with load:
        for i in range(n):
            sl = tiles.acquire()  # BUG
            sl.a = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            tiles.commit()
    with mma:
        acc = xs.zeros([BLOCK, BLOCK], xs.float32)
        for i in range(n):
            g = tiles.wait()
            acc = xs.mma(g.a, g.a, acc)
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
        xs.store(y, [0, 0], acc)


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=2))
def hint_per_role_loops_on_cube_fixed(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES, a=xs.tile([BLOCK, BLOCK], xs.float32))
    with mma:
        acc = xs.zeros([BLOCK, BLOCK], xs.float32)
    for i in range(n):
        with load:
            sl = tiles.acquire()
            sl.a = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            tiles.commit()
        with mma:
            g = tiles.wait()
            acc = xs.mma(g.a, g.a, acc)
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
    with mma:
        xs.store(y, [0, 0], acc)


@xs.kernel(example=EX)
def hint_too_few_stages(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the consumer keeps two slots before it releases the oldest: 2 stages are not enough
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            s = ring.acquire()  # BUG
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            if i > 1:
                ring.release()
    with work:
        if n > 0:
            ring.release()
        if n > 1:
            ring.release()


@xs.kernel(example=EX)
def hint_too_few_stages_fixed(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=3, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            if i > 1:
                ring.release()
    with work:
        if n > 0:
            ring.release()
        if n > 1:
            ring.release()


@xs.kernel(example=EX)
def hint_handoff_order(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    mma = xs.role("mma", kind="matrix")
    soft = xs.role("softmax", kind="vector", placement="merged")
    s_pipe = xs.pipe(mma, soft, stages=2, s=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with soft:
            got = s_pipe.wait()  # BUG
            xs.store(y, [i * BLOCK, 0], got.s)
            s_pipe.release()
        with mma:
            t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            out = s_pipe.acquire()
            out.s = xs.mma(t, t)
            s_pipe.commit()


@xs.kernel(example=EX)
def hint_handoff_order_fixed(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    mma = xs.role("mma", kind="matrix")
    soft = xs.role("softmax", kind="vector", placement="merged")
    s_pipe = xs.pipe(mma, soft, stages=2, s=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with mma:
            t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            out = s_pipe.acquire()
            out.s = xs.mma(t, t)
            s_pipe.commit()
        with soft:
            got = s_pipe.wait()
            xs.store(y, [i * BLOCK, 0], got.s)
            s_pipe.release()


@xs.kernel(example=EX)
def hint_loop_bounds(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    with load:
        for i in range(n):
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
    with work:
        for i in range(n + 1):
            got = ring.wait()  # BUG
            xs.store(y, [i * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def hint_loop_bounds_fixed(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def hint_barrier_calls_do_not_pair(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # on Hopper mma and softmax share a warpgroup; their barrier calls sit in different loops
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    soft = xs.role("softmax", kind="vector")
    team = xs.barrier(load, mma, soft)
    with load:
        for i in range(n):
            team.sync()  # BUG ascend
    with mma:
        for i in range(n):
            team.sync()  # BUG
    with soft:
        for i in range(n):
            team.sync()


@xs.kernel(example=EX)
def hint_barrier_calls_do_not_pair_fixed(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    soft = xs.role("softmax", kind="vector")
    team = xs.barrier(load, mma, soft)
    for i in range(n):
        with load:
            team.sync()
        with mma:
            team.sync()
        with soft:
            team.sync()


@xs.kernel(example=EX)
def hint_arrive_waits_on_ascend(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # cube arrives and only then signals; the vector syncs and waits for the signal first:
    # fine where arrive() does not wait, a deadlock on Ascend where it does
    cube = xs.role("cube", kind="copy")
    vec = xs.role("vec", kind="vector")
    team = xs.barrier(cube, vec)
    go = xs.event(cube, vec)  # BUG nvidia (arrive does not wait there: no back-pressure)
    for i in range(n):
        with vec:
            xs.wait(go)  # BUG ascend (one vector core: source order)
            team.sync()
        with cube:
            team.arrive()  # BUG
            xs.signal(go)


@xs.kernel(example=EX)
def hint_arrive_waits_on_ascend_fixed(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    cube = xs.role("cube", kind="copy")
    vec = xs.role("vec", kind="vector")
    team = xs.barrier(cube, vec)
    go = xs.event(cube, vec)  # BUG nvidia (still no back-pressure on Hopper)
    for i in range(n):
        with vec:
            xs.wait(go)  # BUG ascend (one vector core: source order)
            team.sync()
        with cube:
            xs.signal(go)
            team.arrive()


# ====================================================================== emulator
@xs.kernel(example=EX)
def emulator_release_without_slot(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            if i > 0:
                ring.release()
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
    with work:
        ring.release()  # BUG: with n = 0 nothing was waited


@xs.kernel(example=EX)
def emulator_incomplete_meeting(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    team = xs.barrier(load, work)  # BUG
    for i in range(n):
        with load:
            team.arrive()  # BUG ascend
        with work:
            if i > 0:
                team.arrive()


# ====================================================================== pairing
@xs.kernel(example=EX)
def pairing_broadcast_one_replica_skips(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # 1 -> N: every replica must release every slot; replica 1 skips odd ones
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector", replicas=2)
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            s = ring.acquire()  # BUG
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            if xs.replica_id() == 0 or i % 2 == 0:  # BUG ascend
                ring.release()


@xs.kernel(example=EX)
def pairing_paired_replicas(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # N -> N: replica i feeds replica i (each pair has its own ring)
    mma = xs.role("mma", kind="matrix", replicas=2)
    soft = xs.role("soft", kind="vector", replicas=2)
    ring = xs.pipe(mma, soft, stages=2, s=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with mma:
            t = xs.load(x, [xs.replica_id() * BLOCK, 0], [BLOCK, BLOCK])
            o = ring.acquire()
            o.s = xs.mma(t, t)
            ring.commit()
        with soft:
            got = ring.wait()
            xs.store(y, [xs.replica_id() * BLOCK, 0], got.s)
            ring.release()


@xs.kernel(example=EX)
def pairing_gather_needs_every_source(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # N -> 1: the waiter needs both replicas' signals; replica 1 signals one less
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector", replicas=2)
    done = xs.event(work, load)
    ack = xs.event(load, work)
    for i in range(n):
        with work:
            if xs.replica_id() == 0 or i > 0:  # BUG ascend
                xs.signal(done)
        with load:
            xs.wait(done)  # BUG
            xs.signal(ack)
        with work:
            xs.wait(ack)


@xs.kernel(example=EX)
def pairing_gather_with_ack(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # N -> 1 done, 1 -> N ack: the sources stay in step, so the gather is safe on Hopper
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector", replicas=2)
    done = xs.event(work, load)
    ack = xs.event(load, work)
    for i in range(n):
        with work:
            xs.signal(done)
        with load:
            xs.wait(done)
            xs.signal(ack)
        with work:
            xs.wait(ack)


@xs.kernel(example=EX)
def pairing_paired_event_replica_short(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # N -> N event: replica 1 of 'mma' signals its partner one time less
    mma = xs.role("mma", kind="matrix", replicas=2)
    soft = xs.role("soft", kind="vector", replicas=2)
    ev = xs.event(mma, soft)
    for i in range(n):
        with mma:
            if xs.replica_id() == 0 or i > 0:  # BUG ascend
                xs.signal(ev)
        with soft:
            xs.wait(ev)  # BUG


@xs.kernel(example=EX)
def pairing_paired_across_agents(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # N -> N between two agents on Hopper (two copy warps, two consumer warpgroups): each
    # pair has its own ring, so the full/empty arrays hold rings x stages mbarriers
    load = xs.role("load", kind="copy", replicas=2)
    work = xs.role("work", kind="vector", replicas=2)
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [xs.replica_id() * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [xs.replica_id() * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def consistent_data_dependent_release(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # a release under a condition on tile data: not a function of the scalars, so the
    # verifier tries both truth values (the same at every evaluation) and says so
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            s = ring.acquire()  # BUG
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            if xs.max(xs.max(got.t, 1), 0) > 0:
                ring.release()


# ====================================================================== episode
# Persistent tile loops (the attention kernel's shape): the body's trip counts grow with the
# tile counter, so the verifier checks such a loop iteration by iteration
# (xsync.lowering.verifier.episodes.episode_loops) and falls back to the general check when an
# iteration hands slots to the next.
PERSISTENT = dict(x=xs.float32, y=xs.float32, cu=xs.int32, BLOCK=16, STAGES=2)


@xs.kernel(example=PERSISTENT)
def episode_tiles_grow(x, y, cu, tiles, rows, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # longest tile first: tile t runs over (rows_blocks - t // 2) key blocks
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    done = xs.pipe(work, load, stages=1, t=xs.tile([BLOCK, BLOCK], xs.float32))
    row_blocks = xs.cdiv(rows, BLOCK)
    for tile in range(xs.program_id(0), tiles, xs.num_programs(0)):
        seq = tile % 3
        start = xs.load_scalar(cu, seq)
        length = xs.load_scalar(cu, seq + 1) - start
        hi = xs.minimum(length, (row_blocks - tile // 3) * BLOCK)
        for k in range(0, hi, BLOCK):
            with load:
                s = ring.acquire()
                s.t = xs.load(x, [start + k, 0], [BLOCK, BLOCK])
                ring.commit()
            with work:
                got = ring.wait()
                out = done.acquire()
                out.t = got.t
                done.commit()
                ring.release()
            with load:
                back = done.wait()
                xs.store(y, [start + k, 0], back.t)
                done.release()


@xs.kernel(example=EX)
def episode_skip_for_one_tile(x, y, tiles, rows, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the producer skips the first commit of every 4th tile's block: a hang for tile 3 only
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for tile in range(xs.program_id(0), tiles, xs.num_programs(0)):
        kind = tile % 4
        hi = (xs.cdiv(rows, BLOCK) - tile // 4) * BLOCK
        for k in range(0, hi, BLOCK):
            with load:
                s = ring.acquire()
                s.t = xs.load(x, [k, 0], [BLOCK, BLOCK])
                if kind != 3 or k > 0:
                    ring.commit()
            with work:
                got = ring.wait()  # BUG
                xs.store(y, [k, 0], got.t)
                ring.release()


@xs.kernel(example=EX)
def episode_signal_runs_ahead(x, y, tiles, rows, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # one signal per tile and no way back: the signaller runs ahead across tiles (an Ascend
    # flag counts 15, a Hopper mbarrier tells two phases apart)
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    tick = xs.event(mma, vec)  # BUG
    for tile in range(xs.program_id(0), tiles, xs.num_programs(0)):
        hi = (xs.cdiv(rows, BLOCK) - tile) * BLOCK
        for k in range(0, hi, BLOCK):
            with vec:
                xs.store(y, [k, 0], xs.zeros([BLOCK, BLOCK], xs.float32))
        with mma:
            xs.signal(tick)
        with vec:
            xs.wait(tick)


@xs.kernel(example=EX)
def episode_handoff_to_next_tile(x, y, tiles, rows, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # correct: each tile's last block is consumed in the next tile (a software-pipelined
    # hand-off across tiles); the last tile drains it. No iteration ends empty, so the
    # per-iteration check fails and the general one decides.
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    first = xs.program_id(0)
    step = xs.num_programs(0)
    for tile in range(first, tiles, step):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [tile * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            if tile > first:
                got = ring.wait()
                xs.store(y, [tile * BLOCK, 0], got.t)
                ring.release()
            if tile + step >= tiles:
                got = ring.wait()
                xs.store(y, [tile * BLOCK, 0], got.t)
                ring.release()


# The loop's counter (and a value computed from it alone) meets a constant, or bounds a nested
# loop, beyond the few iterations the tile sweep runs for small scalars: the per-iteration
# check must try those counters too (Scalars._episode_dims). Each was accepted once.
@xs.kernel(example=EX)
def episode_counter_meets_constant(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # a triangular loop nest; one release skipped at i = 6, j = 4
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    for i in range(n):
        for j in range(i):
            with load:
                s = ring.acquire()
                s.t = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
            with work:
                got = ring.wait()
                xs.store(y, [j * BLOCK, 0], got.t)
                if i != 6 or j != 4:
                    ring.release()


@xs.kernel(example=EX)
def episode_coordinate_meets_constant(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the nested loop runs i // 2 times; one release skipped where i // 2 = 6
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        half = i // 2
        for j in range(half):
            with load:
                s = ring.acquire()  # BUG
                s.t = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
            with work:
                got = ring.wait()
                xs.store(y, [j * BLOCK, 0], got.t)
                if half != 6 or j != 4:
                    ring.release()


@xs.kernel(example=EX)
def episode_persistent_tile_meets_constant(x, y, tiles, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # tile t has t blocks; tile 9 never releases (reached by 10 tiles on any program count)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for tile in range(xs.program_id(0), tiles, xs.num_programs(0)):
        for k in range(tile):
            with load:
                s = ring.acquire()  # BUG
                s.t = xs.load(x, [k * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
            with work:
                got = ring.wait()
                xs.store(y, [k * BLOCK, 0], got.t)
                if tile != 9:
                    ring.release()


@xs.kernel(example=EX)
def episode_coordinate_bounded(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # correct: i % 4 never reaches 5, so the skipped release never happens
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        lane = i % 4
        for j in range(lane):
            with load:
                s = ring.acquire()
                s.t = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
            with work:
                got = ring.wait()
                xs.store(y, [j * BLOCK, 0], got.t)
                if lane != 5 or j != 4:
                    ring.release()


@xs.kernel(example=EX)
def episode_triangle(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # correct: a triangular loop nest, every slot released
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        for j in range(i):
            with load:
                s = ring.acquire()
                s.t = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
            with work:
                got = ring.wait()
                xs.store(y, [j * BLOCK, 0], got.t)
                ring.release()


@xs.kernel(example=EX)
def episode_coordinate_of_runtime_shape(x, y, tiles, rows, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the row block, counted from the last, is taken modulo the run-time block count: row 640
    # (rows > 640) skips a release. The general check cannot bound the tile loop (its counter is
    # taken modulo a run-time value): the tile-by-tile finding stands.
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    blocks = xs.cdiv(rows, 64)
    for tile in range(xs.program_id(0), tiles, xs.num_programs(0)):
        m_block = (blocks - 1 - tile % blocks) * 64
        for k in range(3):
            with load:
                s = ring.acquire()  # BUG
                s.t = xs.load(x, [m_block + k * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
            with work:
                got = ring.wait()
                xs.store(y, [m_block + k * BLOCK, 0], got.t)
                if m_block != 640 or k != 1:
                    ring.release()


@xs.kernel(example=EX)
def episode_coordinate_never_equal(x, y, tiles, rows, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # correct: a multiple of 64 is never 650
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    blocks = xs.cdiv(rows, 64)
    for tile in range(xs.program_id(0), tiles, xs.num_programs(0)):
        m_block = (blocks - 1 - tile % blocks) * 64
        for k in range(3):
            with load:
                s = ring.acquire()
                s.t = xs.load(x, [m_block + k * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
            with work:
                got = ring.wait()
                xs.store(y, [m_block + k * BLOCK, 0], got.t)
                if m_block != 650 or k != 1:
                    ring.release()


@xs.kernel(example=EX)
def episode_head_meets_constant(x, y, tiles, heads, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # head h = tile % heads has h + 1 blocks; head 12 (reached with 13 heads) skips a release.
    # The head reads the run-time head count: the tile sweep runs again with more heads.
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for tile in range(xs.program_id(0), tiles, xs.num_programs(0)):
        h = tile % heads
        for k in range(h + 1):
            with load:
                s = ring.acquire()  # BUG
                s.t = xs.load(x, [k * BLOCK, h * BLOCK], [BLOCK, BLOCK])
                ring.commit()
            with work:
                got = ring.wait()
                xs.store(y, [k * BLOCK, h * BLOCK], got.t)
                if h != 12:
                    ring.release()


@xs.kernel(example=EX)
def episode_head_bounds_nested_loop(x, y, tiles, heads, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # head h = tile % heads has h + 1 blocks; block 9 (a head of 10 or more) skips a release.
    # Only the head bounds the nested loop: the sweep runs again until it can reach 10 blocks.
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for tile in range(xs.program_id(0), tiles, xs.num_programs(0)):
        h = tile % heads
        for k in range(h + 1):
            with load:
                s = ring.acquire()  # BUG
                s.t = xs.load(x, [k * BLOCK, h * BLOCK], [BLOCK, BLOCK])
                ring.commit()
            with work:
                got = ring.wait()
                xs.store(y, [k * BLOCK, h * BLOCK], got.t)
                if k != 9:
                    ring.release()


@xs.kernel(example=EX)
def episode_output_tile_meets_constant(x, y, M, N, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # a persistent GEMM-like tile order; output tile (5, 2) skips a release. It needs 6 x 3
    # tiles: the shapes must pass the constants the tile's row and column are compared with.
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    ring = xs.pipe(load, mma, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    tiles_m = xs.cdiv(M, 128)
    tiles_n = xs.cdiv(N, 128)
    for tile in range(xs.program_id(0), tiles_m * tiles_n, xs.num_programs(0)):
        tm = tile // tiles_n
        tn = tile % tiles_n
        for k in range(4):
            with load:
                s = ring.acquire()  # BUG
                s.t = xs.load(x, [tm * BLOCK, k * BLOCK], [BLOCK, BLOCK])
                ring.commit()
            with mma:
                got = ring.wait()
                xs.store(y, [tm * BLOCK, tn * BLOCK], got.t)
                if tm != 5 or tn != 2:
                    ring.release()


@xs.kernel(example=EX)
def episode_tile_and_scalar_bound_a_loop(x, y, tiles, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # tile t has t % 3 + n blocks; block 11 skips its wait (the release then has no slot). The
    # nested loop's bound reads the tile counter and the scalar n, so the general check must
    # let n alone reach the loop's bound (found by the differential test's tile loops).
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for tile in xs.tile_range(tiles, persistent=1):
        blocks = tile % 3 + n
        for k in range(blocks):
            with load:
                s = ring.acquire()
                s.t = xs.load(x, [k * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
            with work:
                if k != 11:
                    got = ring.wait()
                    xs.store(y, [k * BLOCK, 0], got.t)
                ring.release()  # BUG


@xs.kernel(example=EX)
def episode_tile_and_scalar_bound_a_loop_balanced(x, y, tiles, n, BLOCK: xs.constexpr,
                                                 STAGES: xs.constexpr):
    # the correct neighbour: block 11 skips its wait and its release
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for tile in xs.tile_range(tiles, persistent=1):
        blocks = tile % 3 + n
        for k in range(blocks):
            with load:
                if k != 11:
                    s = ring.acquire()
                    s.t = xs.load(x, [k * BLOCK, 0], [BLOCK, BLOCK])
                    ring.commit()
            with work:
                if k != 11:
                    got = ring.wait()
                    xs.store(y, [k * BLOCK, 0], got.t)
                    ring.release()


@xs.kernel(example=EX)
def episode_idle_role_late_tile(x, y, tiles, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # a role with no sync action, and tile 5 skips its waits: slots left over (found by the
    # differential test). The idle role once hid the tile loop from the tile-by-tile check,
    # and the general one accepted within its bounds.
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    idle = xs.role("idle", kind="matrix")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    with idle:
        xs.store(y, [0, 0], xs.zeros([BLOCK, BLOCK], xs.float32))
    for tile in xs.tile_range(tiles, persistent=1):
        blocks = xs.maximum(n - tile, 0)
        for k in range(blocks):
            with load:
                s = ring.acquire()  # BUG
                s.t = xs.load(x, [k * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
            with work:
                if tile != 5:
                    got = ring.wait()
                    xs.store(y, [k * BLOCK, 0], got.t)
                    ring.release()


@xs.kernel(example=EX)
def late_carried_value_meets_constant(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # a running offset carried across iterations reaches 20 at the 10th: one release skipped.
    # Carried values make the loop unprovable beyond a bound (the report says so); the bound
    # reaches the constant the carried value is compared with.
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    offset = 0
    for i in range(n):
        offset = offset + 2
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [offset * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [offset * BLOCK, 0], got.t)
            if offset != 20:
                ring.release()


@xs.kernel(example=EX)
def bounded_carried_count(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # correct, but not provable for every trip count: a count carried from one iteration to
    # the next decides which blocks are handed over twice (checked only up to a bound)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    c = 0
    for i in range(n):
        c = c + 3
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
            if c % 7 == 0:
                s = ring.acquire()
                s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            ring.release()
            if c % 7 == 0:
                got = ring.wait()
                ring.release()


# ====================================================================== hold (issue 39.2)
# Holding more than one slot (split counters: waits and releases counted apart) and rings that
# replica pairs share with a stride (interleave=): xsync/lowering/holding.py.
@xs.kernel(example=EX)
def hold_next_before_release(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # correct: wait for slot i + 1 before releasing slot i (advance_on_wait), in a 2-stage ring
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([BLOCK, BLOCK], xs.float32))
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
            b = ring.wait()
            xs.store(y, [i * BLOCK, 0], a.t + b.t)
            ring.release(a)
            ring.release(b)


@xs.kernel(example=EX)
def hold_one_slot_too_many(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the consumer holds three slots of a 2-stage ring: the third wait never gets its slot
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            for j in range(3):
                s = ring.acquire()  # BUG
                s.t = xs.load(x, [(3 * i + j) * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
        with work:
            a = ring.wait()
            b = ring.wait()
            c = ring.wait()
            xs.store(y, [i * BLOCK, 0], a.t + b.t + c.t)
            ring.release(a)
            ring.release(b)
            ring.release(c)


@xs.kernel(example=EX)
def hold_release_out_of_order(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # releases free the oldest slot first; naming the newer one is refused
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([BLOCK, BLOCK], xs.float32))
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
            b = ring.wait()
            xs.store(y, [i * BLOCK, 0], a.t + b.t)
            ring.release(b)  # BUG
            ring.release(a)


@xs.kernel(example=EX)
def hold_release_stale_slot(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the second iteration names `first`, released in the first one
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n + 1):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
    with work:
        first = ring.wait()
    for i in range(n):
        with work:
            nxt = ring.wait()
            xs.store(y, [i * BLOCK, 0], nxt.t)
            ring.release(first)  # BUG
    with work:
        ring.release()


@xs.kernel(example=EX)
def hold_interleave_does_not_divide(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy", replicas=2)
    work = xs.role("work", kind="vector", replicas=2)
    ring = xs.pipe(load, work, stages=3, interleave=2, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [(2 * i + xs.replica_id()) * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            a = ring.wait()
            xs.store(y, [(2 * i + xs.replica_id()) * BLOCK, 0], a.t)
            ring.release(a)


@xs.kernel(example=EX)
def hold_interleave_on_broadcast(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector", replicas=2)
    ring = xs.pipe(load, work, stages=4, interleave=2, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            a = ring.wait()
            xs.store(y, [(2 * i + xs.replica_id()) * BLOCK, 0], a.t)
            ring.release(a)


@xs.kernel(example=EX)
def hold_interleaved_pair_holds_too_many(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # 4 stages shared by 2 pairs: 2 slots per pair, and each consumer holds 3
    load = xs.role("load", kind="copy", replicas=2)
    work = xs.role("work", kind="vector", replicas=2)
    ring = xs.pipe(load, work, stages=4, interleave=2, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            for j in range(3):
                s = ring.acquire()  # BUG
                s.t = xs.load(x, [(6 * i + 2 * j + xs.replica_id()) * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
        with work:
            a = ring.wait()
            b = ring.wait()
            c = ring.wait()
            xs.store(y, [(2 * i + xs.replica_id()) * BLOCK, 0], a.t + b.t + c.t)
            ring.release()
            ring.release()
            ring.release()


@xs.kernel(example=EX)
def hold_interleaved_pair_holds_too_many_fixed(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy", replicas=2)
    work = xs.role("work", kind="vector", replicas=2)
    ring = xs.pipe(load, work, stages=6, interleave=2, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            for j in range(3):
                s = ring.acquire()
                s.t = xs.load(x, [(6 * i + 2 * j + xs.replica_id()) * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
        with work:
            a = ring.wait()
            b = ring.wait()
            c = ring.wait()
            xs.store(y, [(2 * i + xs.replica_id()) * BLOCK, 0], a.t + b.t + c.t)
            ring.release()
            ring.release()
            ring.release()


# ====================================================================== pairing: N -> 1 pipes
@xs.kernel(example=EX)
def pairing_gather_pipe(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # N -> 1 pipe: each replica of 'mma' commits into its own ring; one wait of 'sum' takes
    # slot k of every ring (got[r] is replica r's), one release frees them all
    mma = xs.role("mma", kind="matrix", replicas=2)
    red = xs.role("sum", kind="vector")
    ring = xs.pipe(mma, red, stages=STAGES, s=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with mma:
            t = xs.load(x, [xs.replica_id() * BLOCK, 0], [BLOCK, BLOCK])
            o = ring.acquire()
            o.s = xs.mma(t, t)
            ring.commit()
        with red:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got[0].s + got[1].s)
            ring.release()


@xs.kernel(example=EX)
def pairing_gather_pipe_waits_too_few(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # N -> 1 pipe: the consumer takes every other round only; the producers run out of slots
    mma = xs.role("mma", kind="matrix", replicas=2)
    red = xs.role("sum", kind="vector")
    ring = xs.pipe(mma, red, stages=STAGES, s=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with mma:
            t = xs.load(x, [xs.replica_id() * BLOCK, 0], [BLOCK, BLOCK])
            o = ring.acquire()  # BUG
            o.s = xs.mma(t, t)
            ring.commit()
        with red:
            if i % 2 == 0:
                got = ring.wait()
                xs.store(y, [i * BLOCK, 0], got[0].s + got[1].s)
                ring.release()


@xs.kernel(example=EX)
def pairing_gather_pipe_waits_per_replica(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # N -> 1 pipe: the consumer waits once per producer replica, but one wait already takes
    # every replica's slot: the second wait of a round waits for a round never committed
    mma = xs.role("mma", kind="matrix", replicas=2)
    red = xs.role("sum", kind="vector")
    ring = xs.pipe(mma, red, stages=STAGES, s=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with mma:
            t = xs.load(x, [xs.replica_id() * BLOCK, 0], [BLOCK, BLOCK])
            o = ring.acquire()
            o.s = xs.mma(t, t)
            ring.commit()
        with red:
            for r in range(2):
                got = ring.wait()  # BUG
                xs.store(y, [(2 * i + r) * BLOCK, 0], got[0].s)
                ring.release()


@xs.kernel(example=EX)
def pairing_gather_pipe_replica_short(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # N -> 1 pipe: counts are per producer replica; replica 1 commits one round less
    load = xs.role("load", kind="copy", replicas=2)
    red = xs.role("sum", kind="vector")
    ring = xs.pipe(load, red, stages=STAGES, s=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            if xs.replica_id() == 0 or i > 0:  # BUG ascend
                o = ring.acquire()
                o.s = xs.load(x, [xs.replica_id() * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
        with red:
            got = ring.wait()  # BUG
            xs.store(y, [i * BLOCK, 0], got[0].s + got[1].s)
            ring.release()


# ====================================================================== cluster
# xs.cluster(n) with a multicast field (issue 39): the programs of a cluster share every slot of
# a multicast pipe, so each program's producer waits for every program's releases. Program p
# writes rows (p * n + j) * BLOCK of y: the shared tile x[j] plus its own x[j + rank].
@xs.kernel(example=EX)
def cluster_copy_pipeline(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    xs.cluster(2)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, shared=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True),
                   own=xs.tile([BLOCK, BLOCK], xs.float32))
    for j in range(n):
        with load:
            s = ring.acquire()
            s.shared = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            s.own = xs.load(x, [(j + xs.cluster_rank()) * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [(xs.program_id(0) * n + j) * BLOCK, 0], got.shared + got.own)
            ring.release()


@xs.kernel(example=EX)
def cluster4_copy_pipeline(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the same over 4 programs, the program's own tile in a pipe of its own (per program), and a
    # barrier of each program's roles after the loop (per program too)
    xs.cluster(4)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, shared=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    mine = xs.pipe(load, work, stages=STAGES, own=xs.tile([BLOCK, BLOCK], xs.float32))
    team = xs.barrier(load, work)
    for j in range(n):
        with load:
            s = ring.acquire()
            s.shared = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
            o = mine.acquire()
            o.own = xs.load(x, [(j + xs.cluster_rank()) * BLOCK, 0], [BLOCK, BLOCK])
            mine.commit()
        with work:
            got = ring.wait()
            own = mine.wait()
            xs.store(y, [(xs.program_id(0) * n + j) * BLOCK, 0], got.shared + own.own)
            mine.release()
            ring.release()
    with load:
        team.sync()
    with work:
        team.sync()


@xs.kernel(example=EX)
def cluster_rank1_never_releases(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # program 1 of the cluster keeps every slot: program 0's producer waits for its releases
    xs.cluster(2)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, shared=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    for j in range(n):
        with load:
            s = ring.acquire()  # BUG
            s.shared = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [(xs.program_id(0) * n + j) * BLOCK, 0], got.shared)
            if xs.cluster_rank() == 0:
                ring.release()


@xs.kernel(example=EX)
def cluster_trips_depend_on_rank(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # program 1 runs one step more: its wait needs a commit of program 0, which has finished
    # (the multicast load reads the cluster's own rows: offsets from `j` would differ by program)
    xs.cluster(2)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, shared=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    for j in range(n + xs.cluster_rank()):
        with load:
            s = ring.acquire()
            s.shared = xs.load(x, [xs.cluster_id() * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()  # BUG
            xs.store(y, [(xs.program_id(0) * n + j) * BLOCK, 0], got.shared)
            ring.release()


@xs.kernel(example=EX)
def cluster_multicast_offsets_depend_on_rank(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    xs.cluster(2)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, shared=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    for j in range(n):
        with load:
            s = ring.acquire()
            s.shared = xs.load(x, [(j + xs.cluster_rank()) * BLOCK, 0], [BLOCK, BLOCK])  # BUG
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [(xs.program_id(0) * n + j) * BLOCK, 0], got.shared)
            ring.release()


# The slot's bytes, armed once and delivered once (xsync/lowering/slot_fill.py): a Hopper TMA
# slot completes when each field's tile has arrived exactly once -- one arm per acquire, of bytes
# derived from the fields, the multicast field's load issued by the lead CTA alone. A kernel
# cannot spell the byte count or the leader, so these are the slips that would get them wrong.
@xs.kernel(example=EX)
def cluster_multicast_written_twice(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # two loads into the multicast field: twice the bytes its full barrier expects
    xs.cluster(2)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, shared=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    for j in range(n):
        with load:
            s = ring.acquire()
            s.shared = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            s.shared = xs.load(x, [(j + 1) * BLOCK, 0], [BLOCK, BLOCK])  # BUG
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [(xs.program_id(0) * n + j) * BLOCK, 0], got.shared)
            ring.release()


@xs.kernel(example=EX)
def cluster_leader_loads_by_hand(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the CUDA habit: only the leader issues the multicast load. Program 1 commits a slot whose
    # field it never wrote (its barrier expects bytes nobody delivers to it; xsync routes the
    # load to the lead CTA itself)
    xs.cluster(2)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, shared=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True),
                   own=xs.tile([BLOCK, BLOCK], xs.float32))
    for j in range(n):
        with load:
            s = ring.acquire()
            if xs.cluster_rank() == 0:
                s.shared = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])  # BUG
            s.own = xs.load(x, [(j + xs.cluster_rank()) * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [(xs.program_id(0) * n + j) * BLOCK, 0], got.shared + got.own)
            ring.release()


@xs.kernel(example=EX)
def slot_field_never_written(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the slot is committed without its second field: fewer bytes than the barrier expects
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, a=xs.tile([BLOCK, BLOCK], xs.float32),
                   b=xs.tile([BLOCK, BLOCK], xs.float32))
    for j in range(n):
        with load:
            s = ring.acquire()
            s.a = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()  # BUG
        with work:
            got = ring.wait()
            xs.store(y, [j * BLOCK, 0], got.a + got.b)
            ring.release()


@xs.kernel(example=EX)
def slot_field_written_per_trip(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # a field written in a loop between acquire and commit: once per trip
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, a=xs.tile([BLOCK, BLOCK], xs.float32))
    for j in range(n):
        with load:
            s = ring.acquire()
            for q in range(2):
                s.a = xs.load(x, [(j + q) * BLOCK, 0], [BLOCK, BLOCK])  # BUG
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [j * BLOCK, 0], got.a)
            ring.release()


@xs.kernel(example=EX)
def slot_field_on_both_branches(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # correct: each path writes the field once (the first tile comes from elsewhere)
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, a=xs.tile([BLOCK, BLOCK], xs.float32))
    for j in range(n):
        with load:
            s = ring.acquire()
            if j == 0:
                s.a = xs.load(x, [n * BLOCK, 0], [BLOCK, BLOCK])
            else:
                s.a = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [j * BLOCK, 0], got.a)
            ring.release()


@xs.kernel(example=GEMM)
def cluster_gemm(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                 STAGES: xs.constexpr):
    # persistent GEMM over clusters of 2 programs: a cluster's tile is 2 * BM x BN, program r
    # computes its rows r * BM..; A is its own, the B tile (the same for both) is multicast
    xs.cluster(2)
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES, a=xs.tile([BM, BK], a.dtype),
                    b=xs.tile([BK, BN], b.dtype, multicast=True))
    blocks_n = xs.cdiv(N, BN)
    for tile in xs.tile_range(xs.cdiv(M, 2 * BM) * blocks_n):
        off_m = ((tile // blocks_n) * 2 + xs.cluster_rank()) * BM
        off_n = (tile % blocks_n) * BN
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


@xs.kernel(example=GEMM)
def cluster_rows_past_the_end(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                              STAGES: xs.constexpr):
    # the cluster GEMM skipping the K loop for rows past M: where M is not a multiple of 2 * BM,
    # program 1's rows of the last row block lie past the end while program 0's do not, so
    # program 1 takes none of the B tiles program 0 waits for (multicast: the whole cluster hangs)
    xs.cluster(2)
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES, a=xs.tile([BM, BK], a.dtype),
                    b=xs.tile([BK, BN], b.dtype, multicast=True))
    blocks_n = xs.cdiv(N, BN)
    for tile in xs.tile_range(xs.cdiv(M, 2 * BM) * blocks_n):
        off_m = ((tile // blocks_n) * 2 + xs.cluster_rank()) * BM
        off_n = (tile % blocks_n) * BN
        with mma:
            acc = xs.zeros([BM, BN], xs.float32)
        if off_m < M:
            for k in range(0, K, BK):
                with load:
                    slot = tiles.acquire()  # BUG cpu
                    slot.a = xs.load(a, [off_m, k], [BM, BK])
                    slot.b = xs.load(b, [k, off_n], [BK, BN])
                    tiles.commit()
                with mma:
                    ab = tiles.wait()  # BUG nvidia ascend
                    acc = xs.mma(ab.a, ab.b, acc)
                    acc = xs.mma_wait(acc, pending=0)
                    tiles.release()
        with mma:
            xs.store(c, [off_m, off_n], acc)
