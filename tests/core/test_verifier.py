"""Every broken protocol is rejected with the right diagnosis, at the right line,
naming the offending role/pipe/event and saying how to fix it."""
import inspect
import re

import pytest
import torch

import xsync as xs
from tests.core import broken_kernels as bk
from xsync.compiler import Kernel
from xsync.errors import (AllocationError, DeadlockError, KernelSourceError, ProtocolError,
                          VerifierLimitError, XSyncError)


def bug_line(kernel) -> int:
    lines, start = inspect.getsourcelines(kernel.fn)
    for k, text in enumerate(lines):
        if "# BUG" in text:
            return start + k
    raise AssertionError("no # BUG marker")


def expect(kernel, backend, exc_type, *needles, monkeypatch=None):
    with pytest.raises(exc_type) as info:
        kernel.lower(backend)
    err = info.value
    msg = str(err)
    assert err.loc is not None, msg
    assert err.loc.file.endswith("broken_kernels.py"), msg
    assert err.loc.line == bug_line(kernel), f"expected line {bug_line(kernel)}:\n{msg}"
    assert f"broken_kernels.py:{bug_line(kernel)}" in msg
    for needle in needles:
        assert re.search(needle, msg), f"{needle!r} not in:\n{msg}"
    assert err.fix, "every error says how to fix it"
    return err


def test_deadlock_by_missing_release():
    err = expect(bk.missing_release, "cpu", DeadlockError, "deadlock", "ring", r"load\s+.*acquire",
                 "release")
    assert "shortest interleaving" in str(err)
    assert "loop at line" in str(err)  # the trip count of the counterexample


def test_cyclic_wait_between_three_roles():
    err = expect(bk.three_way_cycle, "cpu", DeadlockError, r"a, b, c wait", "ca", "ab", "bc")
    for role in ("a", "b", "c"):
        assert re.search(rf"\n\s+{role}\s+\S+:\d+.*wait on event", str(err))


def test_wait_in_role_that_is_not_the_consumer():
    expect(bk.wait_in_producer, "cpu", KernelSourceError, "ring.wait\\(\\) in role 'load'",
           "consumer role 'work'")


def test_signal_from_wrong_role():
    expect(bk.signal_from_wrong_role, "cpu", KernelSourceError, "xs.signal\\(ready\\) in role 'work'",
           "source role 'load'")


def test_zero_stages():
    expect(bk.zero_stages, "cpu", KernelSourceError, "stages=0", "at least one slot")


def test_event_id_budget_exceeded():
    err = expect(bk.too_many_event_ids, "ascend", AllocationError, "17 cross-core event IDs",
                 r"budget is 11 \(IDs 0-10\)", "e16")
    assert "e0 (cube->vector)" in str(err)


def test_event_id_budget_cap(monkeypatch):
    monkeypatch.setenv("XSYNC_ASCEND_EVENT_IDS", "16")      # CANN documenting IDs 0-15
    with pytest.raises(AllocationError, match="budget is 16"):
        bk.too_many_event_ids.lower("ascend")
    monkeypatch.setenv("XSYNC_ASCEND_EVENT_IDS", "5")
    with pytest.raises(AllocationError, match="budget is 5"):
        bk.too_many_event_ids.lower("ascend")


def test_more_than_fifteen_pending_sets_by_stages():
    expect(bk.sixteen_stage_flag, "ascend", AllocationError, "stages=16", "ring", "at most 15")


def test_more_than_fifteen_pending_sets_by_event():
    expect(bk.flag_overflow, "ascend", ProtocolError, "flag overflow", "16 sets pending", "tick")


def test_phase_aliasing_on_hopper():
    expect(bk.event_runs_ahead, "nvidia", ProtocolError, "phase aliasing", "tick", "parity")
    bk.event_runs_ahead.lower("cpu")  # a counting semaphore has no phases: fine on the CPU


def test_wait_count_differs_from_signal_count_across_loop():
    # `range(n - 1)` is evaluated from the n that `range(n)` binds: always one slot short
    err = expect(bk.loop_count_mismatch, "cpu", ProtocolError, "ring",
                 r"1 committed slot\(s\) never waited by work")
    assert "range(0, n, 1)" in str(err) and "with n = 1" in str(err)


def test_cross_role_value_without_pipe():
    expect(bk.cross_role_value, "cpu", KernelSourceError, "role 'work' reads `tile`",
           "role 'load' produces", "xs.pipe\\(load, work")


def test_commit_without_acquire():
    expect(bk.commit_without_acquire, "cpu", ProtocolError, "commit on pipe 'ring' without a slot")


def test_sync_outside_role():
    expect(bk.sync_outside_role, "cpu", KernelSourceError, "outside any role block", "ready")


def test_mma_in_vector_role():
    expect(bk.mma_in_vector_role, "cpu", KernelSourceError, "xs.mma in role 'work' of kind 'vector'")


def test_barrier_sync_by_non_member():
    expect(bk.barrier_non_member, "cpu", KernelSourceError, "not a member of barrier 'team'")


def test_signal_never_consumed():
    expect(bk.signal_never_waited, "cpu", ProtocolError, "signal\\(s\\) never waited", "done")


def test_register_handoff_in_wrong_order_deadlocks_on_hopper_only():
    expect(bk.register_handoff_out_of_order, "nvidia", DeadlockError, "consumer", "s_pipe")
    bk.register_handoff_out_of_order.lower("cpu")
    bk.register_handoff_out_of_order.lower("ascend")


def test_stages_beyond_shared_memory():
    expect(bk.too_much_shared_memory, "nvidia", AllocationError, "shared memory", "stages=8")


def test_nested_role_blocks():
    expect(bk.nested_roles, "cpu", KernelSourceError, "nested")


def test_while_loop_rejected():
    expect(bk.while_loop, "cpu", KernelSourceError, "while")


def test_release_while_mma_reads_slot_is_caught_on_cpu():
    x, y = torch.randn(32, 16), torch.zeros(16, 16)
    with pytest.raises(ProtocolError, match="mma that reads it") as info:
        bk.release_while_mma_in_flight[(1,)](x, y, 2, BLOCK=16, STAGES=1, backend="cpu")
    assert info.value.loc.line == bug_line(bk.release_while_mma_in_flight)


def test_unknown_backend_lists_valid_values(monkeypatch):
    from xsync.backends import select
    monkeypatch.setenv("XSYNC_BACKEND", "tpu")
    with pytest.raises(xs.ConfigError) as info:
        select()
    assert "XSYNC_BACKEND=tpu" in str(info.value) and "cpu, nvidia, ascend" in str(info.value)


def test_unavailable_backend_says_why(monkeypatch):
    from xsync.backends import select
    monkeypatch.setenv("XSYNC_BACKEND", "ascend")
    with pytest.raises(xs.BackendError, match="cannot run on this machine: torch_npu"):
        select()


def test_all_errors_are_xsync_errors():
    assert issubclass(DeadlockError, XSyncError) and issubclass(AllocationError, XSyncError)


@pytest.mark.parametrize("name", sorted(n for n, v in vars(bk).items() if isinstance(v, Kernel)))
@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
def test_greedy_run_agrees_with_every_interleaving(name, backend):
    """The verifier decides each scalar assignment with one greedy run (the system is
    confluent, see the verify docstring); exhaustive=True also searches every interleaving
    of the small runs and fails if any ends elsewhere. Same verdict, same line."""
    from xsync.lowering.frontend import parse_kernel
    from xsync.backends import place
    from xsync.lowering.verify import verify

    kernel = getattr(bk, name)

    def verdict(exhaustive):
        try:
            cx, dt = kernel.specialization()
            kir = parse_kernel(kernel.fn, cx, dt)
            verify(kir, place(kir, backend), exhaustive=exhaustive)
            return "ok"
        except XSyncError as err:
            return (type(err).__name__, err.loc.line if err.loc else None)

    assert verdict(True) == verdict(False)


def test_software_pipelined_consumer_verifies_and_runs():
    """A tail loop `range(max(n_k - 1, 0), n_k)` is tied to the main loop `range(n_k)`:
    the verifier evaluates it from the main loop's trip count instead of guessing."""
    from tests.core.pipelined_kernels import gemm_overlap
    for backend in ("cpu", "nvidia"):
        assert gemm_overlap.lower(backend).report.complete
    M, N, K = 70, 50, 100
    a, b, c = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16(), torch.zeros(M, N)
    gemm_overlap[(3, 2)](a, b, c, M, N, K, BM=32, BN=32, BK=16, STAGES=2, backend="cpu")
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-4, atol=1e-4)


def test_pipelined_tail_that_runs_when_the_loop_does_not():
    from tests.core.pipelined_kernels import gemm_overlap_bad_tail as k
    with pytest.raises(ProtocolError) as info:
        k.lower("cpu")
    msg = str(info.value)
    assert "release on pipe 'tiles' without a slot" in msg and "runs 0 time(s)" in msg


def test_deferred_release_needs_two_slots_in_one_core_on_ascend():
    # load and mma share the Ascend cube core, where a pipe holds one value at a time: a
    # release one iteration late is a self-deadlock there, reported as such.
    from tests.core.pipelined_kernels import gemm_overlap
    with pytest.raises(DeadlockError, match="deadlock on the ascend placement: cube"):
        gemm_overlap.lower("ascend")


@xs.kernel
def _divides_by_a_runtime_count(tiles, rows):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2)
    blocks = xs.cdiv(rows, 64)
    for tile in range(tiles):
        lane = tile % blocks                 # no value where rows <= 0: blocks is 0
        for k in range(3):
            with load:
                ring.acquire()
                ring.commit()
            with work:
                ring.wait()
                if lane != 7 or k != 1:      # read under the inner counter: not an observation
                    ring.release()
    with load:                               # the pipe is used after the loop as well, so the
        ring.acquire()                       # loop is not checked tile by tile
        ring.commit()
    with work:
        ring.wait()
        ring.release()


@xs.kernel
def _divides_by_zero_always(tiles):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2)
    nothing = tiles - tiles
    for tile in range(tiles):
        for k in range(tile % nothing):
            with load:
                ring.acquire()
                ring.commit()
            with work:
                ring.wait()
                ring.release()


@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
def test_assignments_where_a_bound_has_no_value_are_skipped_and_said(backend):
    """A bound that divides by a run-time count of zero has no value at those scalars (the
    kernel faults there): those assignments are skipped, and the report says so and is
    bounded -- not a KeyError from inside the verifier (as before), not a full proof. Where no
    assignment has a value, nothing could be checked: a VerifierLimitError (before, an empty
    enumeration crashed, or was accepted having checked nothing)."""
    with pytest.raises(VerifierLimitError, match="not proven") as bounded:
        _divides_by_a_runtime_count.lower(backend, check=True)
    assert "guard the division" in bounded.value.fix
    report = _divides_by_a_runtime_count.lower(backend, check=True, accept_bounded=True).report
    assert not report.complete
    assert any("skipped: a loop bound or condition cannot be evaluated" in u for u in report.unproven)
    assert report.summary().startswith(f"NOT PROVEN — accepted bounded by accept_bounded=True: "
                                       f"verified for {backend} up to the bounds below")
    with pytest.raises(VerifierLimitError, match="cannot be evaluated for any value") as info:
        _divides_by_zero_always.lower(backend, check=True)
    assert "xs.maximum" in info.value.fix


# ---------------------------------------------------------------- clusters (issue 39)
def test_cluster_skeleton_copies_programs_and_joins_multicast_pipes():
    """A cluster with a multicast pipe is checked as its programs together
    (xsync/lowering/cluster_protocol.py): instances per program, named by it; a multicast pipe
    one channel joining every program, the other pipes and the barriers per program; each copy
    reads its own rank; a kernel without a multicast pipe keeps its one-program skeleton."""
    from tests.core import corpus as C
    from xsync.backends import place
    from xsync.lowering import ir
    from xsync.lowering.cluster_protocol import ClusterSkeleton, expand, program_expr
    from xsync.lowering.frontend import parse_kernel
    from xsync.lowering.protocol import Branch, Loop, derive

    k = C.cluster4_copy_pipeline
    kir = parse_kernel(k.fn, *k.specialization())
    base = derive(kir, place(kir, "nvidia"))
    skel = expand(kir, base)
    assert isinstance(skel, ClusterSkeleton) and skel.cluster == 4 and skel.multicast == ("ring",)
    assert len(skel.instances) == 4 * len(base.instances)
    assert skel.instances[len(base.instances)].label == "producer (program 1 of the cluster)"
    ring, mine = skel.link("ring"), skel.link("mine")
    assert len(ring.channels) == 1 and len(ring.channels[0].producers) == 4 and len(ring.channels[0].consumers) == 4
    assert len(mine.channels) == 4 and all(len(ch.producers) == 1 for ch in mine.channels)
    assert len(skel.barriers) == 4 and len({b.members for b in skel.barriers}) == 4
    assert skel.membership("team", skel.barriers[2].members[0]) is skel.barriers[2]
    assert skel.who(ring.channels[0].consumers[3]) == "work (consumer) (program 3 of the cluster)"
    # cluster_rank() (program_id(0) % 4) is the copy's rank; program_id(0) is 4 * C + rank
    pid = ir.Call(ir.TileOp.PROGRAM_ID, (ir.Const(0),))
    assert program_expr(ir.Compare("==", ir.BinOp("%", pid, ir.Const(4)), ir.Const(0)), 2, 4) == ir.Const(False)
    assert program_expr(ir.BinOp("//", pid, ir.Const(4)), 3, 4) == pid
    assert program_expr(pid, 3, 4) == ir.BinOp("+", ir.BinOp("*", ir.Const(4), pid), ir.Const(3))
    # one program's loops and branches keep their shape in every copy
    shape = lambda prog: [type(n) for n in prog if isinstance(n, (Loop, Branch))]  # noqa: E731
    assert all(shape(p) == shape(base.programs[i % len(base.programs)]) for i, p in enumerate(skel.programs))
    # no multicast pipe (or no cluster): the programs are independent, the skeleton stays
    plain = parse_kernel(C.late_skip_release_every_8th_fixed.fn, *C.late_skip_release_every_8th_fixed.specialization())
    one = derive(plain, place(plain, "cpu"))
    assert expand(plain, one) is one


def test_cluster_verdicts_cross_check_every_interleaving():
    """Joining a multicast pipe's channels across programs keeps the system confluent: the
    exhaustive search over interleavings ends where the greedy run does, on every placement."""
    from tests.core import corpus as C
    from xsync.backends import place
    from xsync.lowering.frontend import parse_kernel
    from xsync.lowering.verify import verify

    for name, ok in (("cluster_copy_pipeline", True), ("cluster_gemm", True), ("cluster_rank1_never_releases", False)):
        k = getattr(C, name)
        for backend in ("cpu", "nvidia", "ascend"):
            kir = parse_kernel(k.fn, *k.specialization())
            if ok:
                assert verify(kir, place(kir, backend), exhaustive=True).cross_checked > 0
            else:
                with pytest.raises(DeadlockError, match="program 1 of the cluster never releases"):
                    verify(kir, place(kir, backend), exhaustive=True)


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=2))
def _wait_in_if_release_after(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            if n > 2:
                a = ring.wait()
                xs.store(y, [i * BLOCK, 0], a.t)
            ring.release(a)


@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
def test_counterexample_names_the_branches_it_takes(backend):
    """A wait inside an `if`, its release after it: the counterexample says which way the
    kernel's own `if` went (a guard a Hopper pass adds is not named: it is not in the source)."""
    with pytest.raises(ProtocolError) as info:
        _wait_in_if_release_after.lower(backend)
    msg = str(info.value)
    lines, start = inspect.getsourcelines(_wait_in_if_release_after.fn)
    line = start + next(k for k, t in enumerate(lines) if "if n > 2" in t)
    assert f"`if n > 2` at line {line} is false" in msg, msg
    assert "`if 0 <" not in msg
