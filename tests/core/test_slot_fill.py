"""Each field of a slot written exactly once between its acquire and the commit that hands it
over (xsync/lowering/slot_fill.py): the paths the corpus does not spell out."""
import pytest

import xsync as xs

EX = dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=2)


@xs.kernel(example=EX)
def written_under_if_in_loop(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, a=xs.tile([BLOCK, BLOCK], xs.float32))
    for j in range(n):
        with load:
            s = ring.acquire()
            for q in range(2):
                if q == 0:
                    s.a = xs.load(x, [(j + q) * BLOCK, 0], [BLOCK, BLOCK])
                else:
                    s.a = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [j * BLOCK, 0], got.a)
            ring.release()


@xs.kernel(example=EX)
def rotated_slot(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the slot variable names the slot acquired at the end of the trip before: written once a trip
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, a=xs.tile([BLOCK, BLOCK], xs.float32))
    m = xs.maximum(n, 0)
    with load:
        s = ring.acquire()
        for k in range(m):
            s.a = xs.load(x, [k * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
            s = ring.acquire()
        s.a = xs.load(x, [m * BLOCK, 0], [BLOCK, BLOCK])
        ring.commit()
    with work:
        for k in range(m + 1):
            got = ring.wait()
            xs.store(y, [k * BLOCK, 0], got.a)
            ring.release()


@xs.kernel(example=EX)
def rotated_slot_left_empty(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # the first slot is written before the loop, the ones acquired in it never
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, a=xs.tile([BLOCK, BLOCK], xs.float32))
    m = xs.maximum(n, 0)
    with load:
        s = ring.acquire()
        s.a = xs.load(x, [0, 0], [BLOCK, BLOCK])
        for k in range(m):
            ring.commit()
            s = ring.acquire()
        s.a = xs.load(x, [m * BLOCK, 0], [BLOCK, BLOCK])
        ring.commit()
    with work:
        for k in range(m + 1):
            got = ring.wait()
            xs.store(y, [k * BLOCK, 0], got.a)
            ring.release()


@xs.kernel(example=EX)
def two_slots_in_flight(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # two acquires before their commits (commits hand slots over in acquire order), each
    # slot's field written once, one of them on both branches of an `if`
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=4, a=xs.tile([BLOCK, BLOCK], xs.float32))
    for j in range(n):
        with load:
            s = ring.acquire()
            t = ring.acquire()
            if j % 2 == 0:
                t.a = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            else:
                t.a = xs.load(x, [(j + 1) * BLOCK, 0], [BLOCK, BLOCK])
            s.a = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
            ring.commit()
        with work:
            g = ring.wait()
            xs.store(y, [2 * j * BLOCK, 0], g.a)
            ring.release()
            h = ring.wait()
            xs.store(y, [(2 * j + 1) * BLOCK, 0], h.a)
            ring.release()


@xs.kernel(example=EX)
def second_slot_left_empty(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=4, a=xs.tile([BLOCK, BLOCK], xs.float32))
    for j in range(n):
        with load:
            s = ring.acquire()
            t = ring.acquire()
            t.a = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            t.a = xs.load(x, [j * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
            ring.commit()
        with work:
            g = ring.wait()
            xs.store(y, [2 * j * BLOCK, 0], g.a)
            ring.release()
            h = ring.wait()
            xs.store(y, [(2 * j + 1) * BLOCK, 0], h.a)
            ring.release()


def test_a_write_under_an_if_inside_a_loop_counts_per_trip():
    with pytest.raises(xs.KernelSourceError, match=r"field 'a' of pipe 'ring' is written inside the loop over `q`"):
        written_under_if_in_loop.lower("cpu")


def test_two_slots_in_flight_each_written_once():
    import torch

    two_slots_in_flight.lower("nvidia")
    x, y = torch.randn(16 * 8, 16), torch.zeros(16 * 8, 16)
    two_slots_in_flight[(1,)](x, y, 3, BLOCK=16, STAGES=2, backend="cpu")
    for j in range(3):
        torch.testing.assert_close(y[2 * j * 16:(2 * j + 1) * 16], x[j * 16:(j + 1) * 16])
        src = j if j % 2 == 0 else j + 1
        torch.testing.assert_close(y[(2 * j + 1) * 16:(2 * j + 2) * 16], x[src * 16:(src + 1) * 16])


def test_the_second_write_is_the_slip_named():
    # `t` is written twice (and `s` never): the first slip met is the second write of `t`
    with pytest.raises(xs.KernelSourceError) as info:
        second_slot_left_empty.lower("cpu")
    assert "is written a second time" in str(info.value) and info.value.loc.line == \
        second_slot_left_empty.fn.__code__.co_firstlineno + 10


def test_a_slot_acquired_again_at_the_end_of_each_trip():
    import torch

    rotated_slot.lower("nvidia")
    x, y = torch.randn(16 * 8, 16), torch.zeros(16 * 8, 16)
    rotated_slot[(1,)](x, y, 4, BLOCK=16, STAGES=2, backend="cpu")
    torch.testing.assert_close(y[:5 * 16], x[:5 * 16])
    with pytest.raises(xs.KernelSourceError, match=r"field 'a' of pipe 'ring' is never written between "
                                                   r"ring.acquire\(\) \(line \d+\) and this commit"):
        rotated_slot_left_empty.lower("cpu")
