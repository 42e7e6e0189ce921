"""Deliberately broken protocols. Each carries a `# BUG` marker on the line the
diagnosis must point at; tests/core/test_verifier.py finds the marker's line number."""
import xsync as xs

EX = dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=1)


@xs.kernel(example=EX)
def missing_release(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
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
            if i % 2 == 0:
                ring.release()  # odd iterations forget to give the slot back


@xs.kernel(example=EX)
def three_way_cycle(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    a = xs.role("a", kind="copy")
    b = xs.role("b", kind="matrix")
    c = xs.role("c", kind="vector")
    ab = xs.event(a, b)
    bc = xs.event(b, c)
    ca = xs.event(c, a)
    with a:
        xs.wait(ca)  # BUG
        xs.signal(ab)
    with b:
        xs.wait(ab)
        xs.signal(bc)
    with c:
        xs.wait(bc)
        xs.signal(ca)


@xs.kernel(example=EX)
def wait_in_producer(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([BLOCK, BLOCK], xs.float32))
    with load:
        s = ring.acquire()
        s.t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        ring.commit()
        got = ring.wait()  # BUG
    with work:
        ring.release()


@xs.kernel(example=EX)
def signal_from_wrong_role(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ready = xs.event(load, work)
    with work:
        xs.signal(ready)  # BUG
    with load:
        xs.wait(ready)


@xs.kernel(example=EX)
def zero_stages(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=0, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    with load:
        s = ring.acquire()
        ring.commit()
    with work:
        got = ring.wait()
        ring.release()


@xs.kernel(example=EX)
def too_many_event_ids(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    cube = xs.role("cube", kind="matrix")
    vec = xs.role("vec", kind="vector")
    e0 = xs.event(cube, vec)
    e1 = xs.event(cube, vec)
    e2 = xs.event(cube, vec)
    e3 = xs.event(cube, vec)
    e4 = xs.event(cube, vec)
    e5 = xs.event(cube, vec)
    e6 = xs.event(cube, vec)
    e7 = xs.event(cube, vec)
    e8 = xs.event(vec, cube)
    e9 = xs.event(vec, cube)
    e10 = xs.event(vec, cube)
    e11 = xs.event(vec, cube)  # BUG: the 12th direction; CANN documents IDs 0-10
    e12 = xs.event(vec, cube)
    e13 = xs.event(vec, cube)
    e14 = xs.event(vec, cube)
    e15 = xs.event(vec, cube)
    e16 = xs.event(vec, cube)
    with cube:
        xs.signal(e0)
        xs.signal(e1)
        xs.signal(e2)
        xs.signal(e3)
        xs.signal(e4)
        xs.signal(e5)
        xs.signal(e6)
        xs.signal(e7)
    with vec:
        xs.wait(e0)
        xs.wait(e1)
        xs.wait(e2)
        xs.wait(e3)
        xs.wait(e4)
        xs.wait(e5)
        xs.wait(e6)
        xs.wait(e7)
        xs.signal(e8)
        xs.signal(e9)
        xs.signal(e10)
        xs.signal(e11)
        xs.signal(e12)
        xs.signal(e13)
        xs.signal(e14)
        xs.signal(e15)
        xs.signal(e16)
    with cube:
        xs.wait(e8)
        xs.wait(e9)
        xs.wait(e10)
        xs.wait(e11)
        xs.wait(e12)
        xs.wait(e13)
        xs.wait(e14)
        xs.wait(e15)
        xs.wait(e16)


@xs.kernel(example=EX)
def sixteen_stage_flag(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    cube = xs.role("cube", kind="matrix")
    vec = xs.role("vec", kind="vector")
    ring = xs.pipe(cube, vec, stages=16, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    for i in range(n):
        with cube:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with vec:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def event_runs_ahead(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    tick = xs.event(load, work)  # BUG
    for i in range(n):
        with load:
            xs.signal(tick)
        with work:
            xs.wait(tick)


@xs.kernel(example=EX)
def flag_overflow(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    cube = xs.role("cube", kind="matrix")
    vec = xs.role("vec", kind="vector")
    tick = xs.event(cube, vec)  # BUG
    for i in range(16):
        with cube:
            xs.signal(tick)
    for i in range(16):
        with vec:
            xs.wait(tick)


@xs.kernel(example=EX)
def loop_count_mismatch(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    with load:
        for i in range(n):
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
    with work:
        for i in range(n - 1):
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            ring.release()


@xs.kernel(example=EX)
def cross_role_value(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ready = xs.event(load, work)
    with load:
        tile = xs.load(x, [0, 0], [BLOCK, BLOCK])
        xs.signal(ready)
    with work:
        xs.wait(ready)
        xs.store(y, [0, 0], tile)  # BUG


@xs.kernel(example=EX)
def commit_without_acquire(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([BLOCK, BLOCK], xs.float32))
    with load:
        ring.commit()  # BUG
        s = ring.acquire()
        s.t = xs.load(x, [0, 0], [BLOCK, BLOCK])
    with work:
        got = ring.wait()
        ring.release()


@xs.kernel(example=EX)
def sync_outside_role(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ready = xs.event(load, work)
    xs.signal(ready)  # BUG
    with work:
        xs.wait(ready)


@xs.kernel(example=EX)
def mma_in_vector_role(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        acc = xs.mma(t, t)  # BUG
        xs.store(y, [0, 0], acc)


@xs.kernel(example=EX)
def barrier_non_member(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector", replicas=2)
    team = xs.barrier(work)
    with load:
        team.sync()  # BUG
    with work:
        team.sync()


@xs.kernel(example=EX)
def signal_never_waited(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    done = xs.event(load, work)  # BUG
    for i in range(n):
        with load:
            xs.signal(done)
        with work:
            xs.wait(done)
    with load:
        xs.signal(done)


@xs.kernel(example=EX)
def register_handoff_out_of_order(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # mma and softmax share one warpgroup on Hopper (asked): the softmax waits for a value
    # that the same agent only produces later in program order.
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


@xs.kernel(example=dict(x=xs.bfloat16, y=xs.float32, BLOCK=128, STAGES=8))
def too_much_shared_memory(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="matrix")
    ring = xs.pipe(load, work, stages=STAGES,  # BUG
                   a=xs.tile([BLOCK, BLOCK], xs.bfloat16), b=xs.tile([BLOCK, BLOCK], xs.bfloat16))
    for i in range(n):
        with load:
            s = ring.acquire()
            s.a = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            s.b = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            acc = xs.mma(got.a, got.b)
            acc = xs.mma_wait(acc, pending=0)
            ring.release()
            xs.store(y, [i * BLOCK, 0], acc)


@xs.kernel(example=EX)
def nested_roles(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    with load:
        with work:  # BUG
            t = xs.load(x, [0, 0], [BLOCK, BLOCK])


@xs.kernel(example=EX)
def while_loop(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    work = xs.role("work", kind="vector")
    i = 0
    while i < n:  # BUG
        i += 1


@xs.kernel(example=EX)
def release_while_mma_in_flight(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    ring = xs.pipe(load, mma, stages=2, a=xs.tile([BLOCK, BLOCK], xs.float32))
    with mma:
        acc = xs.zeros([BLOCK, BLOCK], xs.float32)
    for i in range(n):
        with load:
            s = ring.acquire()
            s.a = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with mma:
            got = ring.wait()
            acc = xs.mma(got.a, got.a, acc)
            ring.release()  # BUG
    with mma:
        acc = xs.mma_wait(acc, pending=0)
        xs.store(y, [0, 0], acc)
