"""Holding more than one slot (split counters) and interleaved rings on the CPU emulator:
tests/core/holding_kernels.py against torch; the allocation tables show the counters; the
frontend's rules (xsync/lowering/holding.py). The corpus (tests/core/corpus.py, ``hold_*``) has
the broken cases with their verdicts on every placement."""
import re

import pytest
import torch

import xsync as xs
from tests.core import holding_kernels as H
from xsync.errors import SlotOrderError, KernelSourceError


@pytest.mark.parametrize("n", [0, 1, 3])
def test_pair_sums_holds_two_slots(n):
    torch.manual_seed(n)
    x = torch.randn(max(2 * n, 1) * 16, 16)
    y = torch.zeros_like(x)
    H.pair_sums[(1,)](x, y, n, BLOCK=16, STAGES=2, backend="cpu")
    torch.testing.assert_close(y[:2 * n * 16], H.pair_sums_ref(x, n, 16)[:2 * n * 16])


@pytest.mark.parametrize("n", [0, 1, 4])
def test_sliding_sums_carries_a_held_slot(n):
    torch.manual_seed(n)
    x = torch.randn((2 * n + 1) * 16, 16)
    y = torch.zeros(max(2 * n, 1) * 16, 16)
    H.sliding_sums[(1,)](x, y, n, BLOCK=16, STAGES=2, backend="cpu")
    if n:
        torch.testing.assert_close(y, H.sliding_sums_ref(x, n, 16))


@pytest.mark.parametrize("K", [32, 96, 160])
def test_interleaved_gemm(K):
    torch.manual_seed(K)
    a, b, c = torch.randn(128, K).bfloat16(), torch.randn(K, 64).bfloat16(), torch.zeros(128, 64)
    H.interleaved_gemm[(1,)](a, b, c, K, BM=64, BN=64, BK=32, STAGES=4, backend="cpu")
    torch.testing.assert_close(c, a.float() @ b.float(), atol=1e-2, rtol=1e-2)


def _scores(x, j):
    t = x[j * 16:(j + 1) * 16]
    return t @ t


def test_interleaved_scores():
    torch.manual_seed(3)
    n = 3
    x = torch.randn(2 * n * 16, 16)
    y = torch.zeros_like(x)
    H.interleaved_scores[(1,)](x, y, n, BLOCK=16, STAGES=4, backend="cpu")
    torch.testing.assert_close(y, torch.cat([_scores(x, j) * 0.5 for j in range(2 * n)]), atol=1e-4, rtol=1e-4)


def test_held_scores():
    torch.manual_seed(4)
    n = 2
    x = torch.randn(2 * n * 16, 16)
    y = torch.zeros_like(x)
    H.held_scores[(1,)](x, y, n, BLOCK=16, STAGES=2, backend="cpu")
    s = [_scores(x, j) for j in range(2 * n)]
    torch.testing.assert_close(y, torch.cat([s[0] + s[1], s[1], s[2] + s[3], s[3]]), atol=1e-4, rtol=1e-4)


def test_allocation_tables_show_the_counters():
    cpu = H.pair_sums.lower("cpu").allocation.table()
    assert "split counters" in cpu and "'work' holds up to 2 slot(s) at once" in cpu
    nv = H.interleaved_gemm.lower("nvidia").allocation.table()
    assert "ring_acquired, ring_committed (producer); ring_waited, ring_released (consumer)" in nv
    assert "mbarrier[4] count=1" in nv and "one ring: 2 pairs interleaved, stride 2" in nv
    assert "r + 2 * (k % 2), phase (k // 2) & 1" in nv and "4 x 8192 B = 32768 B" in nv
    asc = H.interleaved_scores.lower("ascend").allocation.table()
    assert "xs_ring_acq (producer), xs_ring_got (consumer)" in asc
    assert "2 interleaved ring(s) x 2" in asc and "ring r's slot i at (i % 2) * 2 + r" in asc
    held = H.held_scores.lower("ascend").allocation.table()
    assert "'soft' holds up to 2 slot(s) at once" in held
    in_core = H.pair_sums.lower("ascend").allocation.table()     # a GM ring inside one vector core
    assert "split counters" in in_core and "xs_ring_acq (producer), xs_ring_got (consumer)" in in_core
    assert "'work' holds up to 2 slot(s) at once (waits minus releases); the ring gives it" in in_core


def _source(kernel, backend):
    from xsync.backends import registry
    from xsync.cli import lower_and_render
    return lower_and_render(kernel, registry.get(backend))[1]


def test_hopper_spells_interleaved_slots_and_phases():
    src = _source(H.interleaved_gemm, "nvidia")
    assert "REPLICA + 2 * (ring_waited % 2)" in src and "(ring_waited // 2) & 1" in src
    assert "[4, 64, 32]" in src    # one ring of 4 slots, not 2 rings x 4


def test_hopper_passes_count_an_interleaved_pairs_slots():
    """Was: at stages=2, interleave=2 (one slot per pair) defer_mma_wait held the previous
    slot back, and the verifier then refused the user's correct kernel as a deadlock."""
    notes = {}
    for stages in (2, 4):
        low = H.interleaved_gemm.lower("nvidia", dict(H.GEMM, STAGES=stages))
        assert low.report.proven, low.report
        (notes[stages],) = [n for n in low.passes.notes if n.pass_name == "defer-mma-wait"]
    assert not notes[2].applied and "pipe 'ring' has 1 stage per replica pair" in notes[2].why
    assert notes[4].applied


def test_hopper_pair_sums_has_split_counters():
    src = _source(H.pair_sums, "nvidia")
    assert "ring_waited += 1" in src and "ring_released += 1" in src


def test_ascend_interleaved_gm_slots():
    src = _source(H.interleaved_scores, "ascend")
    assert "* 2 + " in src and "xs_ring_acq >= 2" in src


def _kernel(consumer: str, decl: str = "stages=2"):
    """A pipe kernel whose consumer block is ``consumer`` (source lines, indented by 12)."""
    import linecache
    code = ("import xsync as xs\n\n\n@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16))\n"
            "def k(x, y, n, BLOCK: xs.constexpr):\n"
            "    load = xs.role(\"load\", kind=\"copy\")\n"
            "    work = xs.role(\"work\", kind=\"vector\")\n"
            f"    ring = xs.pipe(load, work, {decl}, t=xs.tile([BLOCK, BLOCK], xs.float32))\n"
            "    for i in range(n):\n"
            "        with load:\n"
            "            s = ring.acquire()\n"
            "            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])\n"
            "            ring.commit()\n"
            "        with work:\n" + consumer)
    name = f"<holding-{abs(hash(code))}>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    ns = {}
    exec(compile(code, name, "exec"), ns)
    return ns["k"]


@pytest.mark.parametrize("call,needle", [
    ("ring.release(i)", "`i` is not a slot waited from pipe 'ring'"),
    ("ring.release(a, a)", "release takes at most the slot it frees"),
    ("ring.release(slot=a)", "release takes at most the slot it frees"),
])
def test_release_names_a_waited_slot(call, needle):
    k = _kernel("            a = ring.wait()\n"
                "            xs.store(y, [i * BLOCK, 0], a.t)\n"
                f"            {call}\n")
    with pytest.raises(KernelSourceError) as info:
        k.lower("cpu")
    assert needle in str(info.value) and info.value.loc.line == 17


@pytest.mark.parametrize("consumer,line,release_line", [
    # the plain release frees the one slot held
    ("            a = ring.wait()\n            ring.release()\n            xs.store(y, [i * BLOCK, 0], a.t)\n",
     17, 16),
    # a named release of the older of two held slots, then a read of it
    ("            a = ring.wait()\n            b = ring.wait()\n            ring.release(a)\n"
     "            xs.store(y, [i * BLOCK, 0], a.t + b.t)\n            ring.release(b)\n", 18, 17),
    # read in a branch after the release
    ("            a = ring.wait()\n            ring.release()\n            if i > 0:\n"
     "                xs.store(y, [i * BLOCK, 0], a.t)\n", 18, 16),
    # released on one arm of a branch only
    ("            a = ring.wait()\n            if i % 2 == 0:\n                ring.release(a)\n"
     "            else:\n                ring.release()\n            xs.store(y, [i * BLOCK, 0], a.t * 2.0)\n",
     20, 19),
])
def test_a_slot_is_not_read_after_its_release(consumer, line, release_line):
    """Was: accepted on every backend; the emulator then read a slot the producer had refilled."""
    with pytest.raises(SlotOrderError) as info:
        _kernel(consumer).lower("cpu")
    err = info.value
    assert err.loc.line == line and f"reads slot `a` of pipe 'ring' after its release at line {release_line}" in str(err)
    assert err.objects == ("ring", "work") and "move the release after this line" in err.fix


def test_releasing_a_rebound_name_says_so():
    k = _kernel("            a = ring.wait()\n            a = ring.wait()\n"
                "            xs.store(y, [i * BLOCK, 0], a.t)\n            ring.release(a)\n            ring.release()\n",
                "stages=4")
    with pytest.raises(SlotOrderError) as info:
        k.lower("cpu")
    assert "give that wait a name of its own, or free the oldest slot with `ring.release()`" in info.value.fix


def test_a_slot_waited_again_may_be_read():
    k = _kernel("            a = ring.wait()\n            xs.store(y, [i * BLOCK, 0], a.t)\n            ring.release(a)\n")
    assert k.lower("cpu").report.proven


def test_named_release_matches_release():
    """release(a) and release() free the same slot: the same generated source on every backend."""
    from xsync.backends import registry
    from xsync.cli import lower_and_render
    body = "            a = ring.wait()\n            xs.store(y, [i * BLOCK, 0], a.t)\n            ring.release({})\n"
    for b in ("cpu", "nvidia", "ascend"):
        named = lower_and_render(_kernel(body.format("a")), registry.get(b))[1]
        plain = lower_and_render(_kernel(body.format("")), registry.get(b))[1]
        same = re.sub(r"<holding-\d+>", "<k>", named.replace("ring.release(a)", "ring.release()"))
        assert same == re.sub(r"<holding-\d+>", "<k>", plain), b


def test_interleave_value_is_checked():
    with pytest.raises(KernelSourceError) as info:
        _kernel("            a = ring.wait()\n            ring.release(a)\n", "stages=2, interleave=0").lower("cpu")
    assert "interleave=0" in str(info.value)


def test_interleave_needs_paired_replicas():
    from tests.core import corpus as C
    with pytest.raises(KernelSourceError) as info:
        C.hold_interleave_on_broadcast.lower("cpu")
    assert "interleave=2" in str(info.value) and "replicas=2" in info.value.fix


HOLD_CASES = ["hold_next_before_release", "hold_one_slot_too_many", "hold_interleaved_pair_holds_too_many",
              "hold_interleaved_pair_holds_too_many_fixed"]


@pytest.mark.parametrize("name", HOLD_CASES)
@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
def test_greedy_run_agrees_with_every_interleaving(name, backend):
    """Holding several slots adds no rule to the verifier: its greedy verdict equals the search
    of every interleaving (exhaustive=True) on the hold cases of the corpus."""
    from tests.core import corpus as C
    from xsync.backends import place
    from xsync.errors import XSyncError
    from xsync.lowering.frontend import parse_kernel
    from xsync.lowering.verify import verify

    kernel = getattr(C, name)

    def verdict(exhaustive):
        try:
            cx, dt = kernel.specialization()
            kir = parse_kernel(kernel.fn, cx, dt)
            verify(kir, place(kir, backend), exhaustive=exhaustive)
            return "ok"
        except XSyncError as err:
            return (type(err).__name__, err.loc.line if err.loc else None)

    assert verdict(True) == verdict(False)


@pytest.mark.parametrize("name,stages", [("hold_one_slot_too_many", 2), ("hold_interleaved_pair_holds_too_many", 4)])
def test_emulator_stalls_where_the_verifier_rejects(name, stages):
    """With the verifier off, the CPU emulator hangs on the kernel that holds one slot too many
    and reports the stall (the verifier's counterexample is one that happens)."""
    from tests.core import corpus as C
    from xsync.errors import StallError
    x, y = torch.randn(12 * 16, 16), torch.zeros(12 * 16, 16)
    with pytest.raises(StallError) as info, xs.options(verify=False, cpu_timeout=5):
        getattr(C, name)[(1,)](x, y, 1, BLOCK=16, STAGES=stages, backend="cpu")
    assert "ring" in str(info.value)


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=3))
def hold_grows_with_the_trip_count(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            for j in range(2):
                s = ring.acquire()
                s.t = xs.load(x, [(2 * i + j) * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
        with work:
            a = ring.wait()
            b = ring.wait()
            xs.store(y, [i * BLOCK, 0], a.t + b.t)
            ring.release()        # one of the two: the other stays held
    for i in range(n):
        with work:
            ring.release()


@pytest.mark.parametrize("stages", [3, 6])
def test_a_hold_that_grows_with_the_trip_count_is_not_cured_by_stages(stages):
    """Was: "raise stages to at least S + 1" at every S, though the hold grows by one slot an
    iteration."""
    with pytest.raises(xs.DeadlockError) as info:
        hold_grows_with_the_trip_count.lower("cpu", dict(BLOCK=16, STAGES=stages))
    fix = info.value.fix
    assert "holding 1 more slot(s) of pipe 'ring'" in fix and "more stages only move the deadlock" in fix, fix
    assert "raise stages" not in fix
