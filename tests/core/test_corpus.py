"""The verifier's corpus (tests/core/corpus.py): every kernel gets the right verdict on
every placement -- error class, the line marked ``# BUG`` (``# BUG <backend>`` where the
placement moves it), the scalar values and wording of the counterexample, a fix -- and
every correct kernel is accepted on all three placements. A verdict that differs from the
CPU's names the placement fact behind it. The hints the messages give are applied
(``*_fixed`` kernels) and verified again; with the verifier off the CPU emulator reports
what the verifier would."""
import inspect
import re

import pytest
import torch

import xsync as xs
from tests.core import corpus as C
from xsync.errors import (CounterLimitError, DeadlockError, FlagOverflowError, KernelSourceError, LaunchError,
                          LeftoverError, PhaseAliasingError, ProtocolError, SlotOrderError, StallError,
                          VerifierLimitError, XSyncError)
from xsync.compiler import Kernel

BACKENDS = ("cpu", "nvidia", "ascend")
KERNELS = sorted(n for n, v in vars(C).items() if isinstance(v, Kernel))


def same(cls, *needles):
    return {b: (cls, needles) for b in BACKENDS}


def but(expect, **backends):
    """``expect`` with other verdicts on some backends (None: the backend accepts the kernel)."""
    out = {**expect, **backends}
    return {b: v for b, v in out.items() if v is not None}


# A kernel of copy and vector roles without matrix work runs on one Ascend vector core, its roles
# in source order and its pipes GM rings of `stages` slots (xsync/backends/ascend/placement.py):
# per-role loops, a wait before the signal it needs later in source order, and sync verbs under
# replica-dependent branches get other verdicts there.
ONE_VECTOR_CORE = r"share agent 'vector'"


# name -> {backend: (error class, regexes the message must contain)}; a backend left out
# accepts the kernel
EXPECT = {
    "late_skip_release_every_8th": same(
        DeadlockError, r"with n = 17: loop at line \d+ `range\(0, n, 1\)` runs 17 time\(s\)",
        r"\(j=16\): acquire on pipe 'ring'", r"'work' waits for 17 slot\(s\) of pipe 'ring' and releases 15"),
    "episode_skip_for_one_tile": same(DeadlockError, r"\(tile=3, k=0\): wait on pipe 'ring'"),
    "episode_signal_runs_ahead": {"ascend": (FlagOverflowError, (r"16 sets pending for vec",))},
    "episode_counter_meets_constant": same(
        LeftoverError, r"with n = 7: loop at line \d+ `range\(0, n, 1\)` runs 7 time\(s\)",
        r"pipe 'ring': 1 slot\(s\) waited by work[^\n]* never released", r"\(i=6, j=5\)"),
    "episode_coordinate_meets_constant": same(
        DeadlockError, r"with n = 14: loop at line \d+ `range\(0, n, 1\)` runs 14 time\(s\)",
        r"'work' waits for 42 slot\(s\) of pipe 'ring' and releases 40"),
    "episode_coordinate_of_runtime_shape": but(same(
        DeadlockError, r"rows = 641, tile = 0", r"'work' waits for \d+ slot\(s\) of pipe 'ring' and releases"),
        ascend=(DeadlockError, (r"'work' waits for \d+ slot\(s\) of pipe 'ring' and releases",))),
    "late_carried_value_meets_constant": same(
        LeftoverError, r"with n = 10", r"pipe 'ring': 1 slot\(s\) waited by work[^\n]* never released"),
    "episode_output_tile_meets_constant": same(DeadlockError, r"M = 641, N = 257"),
    "episode_tile_and_scalar_bound_a_loop": same(SlotOrderError, r"n = 12, tiles = 1", r"at iteration tile=0, k=11"),
    "episode_idle_role_late_tile": same(DeadlockError, r"n = 8, tiles = 6", r"wait\(s\) forever"),
    "episode_head_bounds_nested_loop": same(DeadlockError, r"h = 9", r"runs 10 time\(s\)"),
    "episode_head_meets_constant": same(DeadlockError, r"h = 12", r"runs 13 time\(s\)"),
    "episode_persistent_tile_meets_constant": same(
        DeadlockError, r"xs.num_programs\(0\) = 4, tiles = 10", r"'work' waits for 15 slot\(s\) of pipe 'ring'"),
    "late_flag_overflow": {"ascend": (FlagOverflowError, (
        r"with n = 16", r"event 'tick' has 16 sets pending for vec \(vector\)", r"at most 15"))},
    "late_phase_aliasing": {
        "nvidia": (PhaseAliasingError, (r"with n = 2", r"2 phases pending for work \(consumer\)", r"parity"))},
    "late_leak_after_threshold": same(DeadlockError, r"with n = 10", r"'work' waits for 10 slot\(s\) of pipe 'ring' and releases 5"),
    "late_gather_runs_ahead": {
        "nvidia": (PhaseAliasingError, (r"event 'done'", r"work\[0\] \(consumer\[0\]\), work\[1\]"))},
    "late_arrive_runs_ahead": {"nvidia": (PhaseAliasingError, (
        r"barrier 'team' \(producer\) arrives 2 meeting\(s\) ahead of consumer", r"use team.sync\(\)"))},
    "late_found_wait_skipped_every_8th": same(
        SlotOrderError, r"with n = 8: loop at line \d+ `range\(0, n, 1\)` runs 8 time\(s\)",
        r"at iteration i=7", r"r0\[0\][^\n]* does 7 wait\(s\)"),
    "late_found_barrier_after_threshold": {
        "cpu": (DeadlockError, (r"with n = 12", r"\(i=10\): sync on barrier 'b2'", r"r0, which has finished")),
        "nvidia": (ProtocolError, (r"roles 'r0' and 'r1' share agent 'consumer'",)),
        "ascend": (ProtocolError, (r"roles 'r0' and 'r1' share agent 'vector'",))},
    "late_found_arrive_stops_after_8": {
        "cpu": (DeadlockError, (r"with n = 17", r"\(meeting 9\): waiting for r2, which has finished")),
        "nvidia": (DeadlockError, (r"with n = 17", r"waiting for r2, which has finished")),
        "ascend": (ProtocolError, (r"roles 'r1', 'r2' and 'r3' share agent 'vector'",))},
    "late_found_release_skipped_once": {
        "cpu": (LeftoverError, (r"with n = 15", r"pipe 'p1': 1 slot\(s\) waited by r2 never released",
                                r"the first one: line \d+ \(i=7\)")),
        "nvidia": (DeadlockError, (r"placement: on the nvidia placement 'r0' and 'r1' share agent 'consumer'",)),
        "ascend": (DeadlockError, (r"placement: on the ascend placement 'r0' and 'r1' share agent 'cube'",))},
    "late_nested_inner_short": but(same(
        DeadlockError, r"with m = 1, n = 3", r"`range\(0, \(m - 1\), 1\)` runs 0 time\(s\)",
        r"\(t=2, k=0\): acquire", r"which has finished", r"'work' must release as many times as 'load'"),
        ascend=(DeadlockError, (r"with m = 2, n = 2", r"`range\(0, \(m - 1\), 1\)` runs 1 time\(s\)",
                                ONE_VECTOR_CORE, r"a ring of 2 slot\(s\)"))),
    "consistent_range_one_short": but(same(
        LeftoverError, r"with n = 1: loop at line \d+ `range\(0, n, 1\)` runs 1 time\(s\); "
                       r"loop at line \d+ `range\(1, n, 1\)` runs 0 time\(s\)",
        r"1 committed slot\(s\) never waited by work"),
        ascend=(DeadlockError, (r"with n = 3: loop at line \d+ `range\(0, n, 1\)` runs 3 time\(s\); "
                                r"loop at line \d+ `range\(1, n, 1\)` runs 2 time\(s\)", ONE_VECTOR_CORE,
                                r"cannot run more than 2 step\(s\) ahead", r"one shared loop"))),
    "consistent_cdiv_vs_floor": but(same(
        LeftoverError, r"with K = 1: loop at line \d+ `range\(0, xs.cdiv\(K, BLOCK\), 1\)` runs 1 "
                       r"time\(s\); loop at line \d+ `range\(0, \(K // BLOCK\), 1\)` runs 0 time\(s\)"),
        ascend=(DeadlockError, (r"with K = 33: loop at line \d+ `range\(0, xs.cdiv\(K, BLOCK\), 1\)` runs 3 "
                                r"time\(s\); loop at line \d+ `range\(0, \(K // BLOCK\), 1\)` runs 2 time\(s\)",
                                ONE_VECTOR_CORE, r"cannot run more than 2 step\(s\) ahead"))),
    "consistent_producer_runs_longer": but(same(
        DeadlockError, r"released by work[^\n]*which has finished",
        r"'work' must release as many times as 'load' acquires"),
        ascend=(DeadlockError, (r"with n = 0", r"'work' must release as many times as 'load' acquires"))),
    "consistent_blames_the_waiter": {
        "cpu": (DeadlockError, (r"cpu placement: a, b wait\(s\) forever", r"\n\s+c\s+finished")),
        "nvidia": (DeadlockError, (r"producer, consumer wait\(s\) forever",)),
        "ascend": (DeadlockError, (r"cube, vector wait\(s\) forever",))},
    "consistent_data_dependent_release": same(
        DeadlockError, r"condition `xs.max\(xs.max\(got.t, 1\), 0\) > 0` \(line \d+\) is False "
                       r"\(not computable from the scalars"),
    "consistent_leftover_not_release": same(LeftoverError, r"1 committed slot\(s\) never waited by work"),
    "hint_per_role_loops_on_cube": {"ascend": (DeadlockError, (
        r"share agent 'cube'", r"stages do not help", r"one shared loop",
        r"placement: on the ascend placement 'load' and 'mma' share agent 'cube'"))},
    "hint_too_few_stages": same(DeadlockError, r"raise stages to at least 3 \(now 2\)"),
    "hint_handoff_order": {"nvidia": (DeadlockError, (
        r"'mma' and 'softmax' share agent 'consumer'", r"one shared loop"))},
    "hint_loop_bounds": same(DeadlockError, r"with n = 0", r"'load' must commit as many times as 'work' waits"),
    "hint_barrier_calls_do_not_pair": {
        "nvidia": (ProtocolError, (r"roles 'mma' and 'softmax' share agent 'consumer' on the nvidia "
                                   r"placement", r"same point of the same loop")),
        "ascend": (ProtocolError, (r"roles 'load' and 'mma' share agent 'cube' on the ascend",))},
    # (the arrive hint on Ascend, with a cube core: tests/ascend/test_ascend_vector_only.py)
    "hint_arrive_waits_on_ascend": {
        "nvidia": (PhaseAliasingError, (r"event 'go'",)),
        "ascend": (DeadlockError, (ONE_VECTOR_CORE, r"put the block of 'cube' before the block of 'vec'"))},
    "hint_arrive_waits_on_ascend_fixed": {
        "nvidia": (PhaseAliasingError, (r"event 'go'",)),
        "ascend": (DeadlockError, (ONE_VECTOR_CORE, r"put the block of 'cube' before the block of 'vec'"))},
    "emulator_release_without_slot": same(SlotOrderError, r"with n = 0", r"release on pipe 'ring' without a slot"),
    "emulator_incomplete_meeting": {
        "cpu": (LeftoverError, (r"meeting 1 is left incomplete: load arrived 1 time\(s\), work 0",)),
        "nvidia": (PhaseAliasingError, (r"barrier 'team'",)),
        "ascend": (ProtocolError, (r"roles 'load' and 'work' share agent 'vector' on the ascend",))},
    "pairing_broadcast_one_replica_skips": but(
        same(DeadlockError, r"'work\[1\]' waits for \d+ slot\(s\) of pipe 'ring' and releases"),
        ascend=(ProtocolError, (r"agent 'vector' runs the replicas of 'work' one after another",))),
    "pairing_gather_needs_every_source": but(
        same(DeadlockError, r"'work\[1\]' must signal as many times as 'load'"),
        ascend=(ProtocolError, (r"agent 'vector' runs the replicas of 'work' one after another",))),
    "pairing_gather_pipe_waits_too_few": same(
        DeadlockError, r"'sum' waits for \d+ slot\(s\) of pipe 'ring' and releases|"
                       r"acquire on pipe 'ring': all 2 slot\(s\) in use"),
    "pairing_gather_pipe_waits_per_replica": same(
        DeadlockError, r"wait on pipe 'ring': slot 1 not committed yet \(1 committed by mma\[0\]",
        r"pipe 'ring' gathers 2 replicas of 'mma' into 'sum'", r"do not wait once per replica"),
    "pairing_gather_pipe_replica_short": but(
        same(DeadlockError, r"slot 0 not committed yet \(0 committed by load\[1\]",
             r"'load\[1\]' must commit as many times as 'sum' waits"),
        ascend=(ProtocolError, (r"agent 'vector' runs the replicas of 'load' one after another",))),
    "pairing_paired_event_replica_short": {
        "cpu": (DeadlockError, (r"soft\[1\] wait\(s\) forever", r"'mma\[1\]' must signal")),
        "nvidia": (DeadlockError, (r"consumer\[1\] wait\(s\) forever", r"'mma\[1\]' must signal")),
        "ascend": (ProtocolError, (r"runs the replicas of 'mma' one after another",))},
    # holding several slots and interleaved rings (issue 39.2, xsync/lowering/holding.py)
    "hold_one_slot_too_many": but(
        same(DeadlockError, r"'work' holds 2 slot\(s\) of pipe 'ring'", r"raise stages to at least 3 \(now 2\)"),
        ascend=(DeadlockError, (ONE_VECTOR_CORE, r"all 2 slot\(s\) in use"))),
    "hold_release_out_of_order": same(
        SlotOrderError, r"ring.release\(b\) frees slots out of order: `b` is the second oldest slot 'work' holds",
        r"held, oldest first: `a`, `b`"),
    "hold_release_stale_slot": same(
        SlotOrderError, r"ring.release\(first\) frees slot `first`, which 'work' does not hold here"),
    "hold_interleave_does_not_divide": same(
        KernelSourceError, r"pipe 'ring' has stages=3, which interleave=2 does not divide"),
    "hold_interleave_on_broadcast": same(
        KernelSourceError, r"pipe 'ring' has interleave=2, but it runs from 1 replica\(s\) of 'load' to 2"),
    "hold_interleaved_pair_holds_too_many": but(
        same(DeadlockError, r"'work' holds 2 slot\(s\) of pipe 'ring'",
             r"raise stages to at least 6 \(now 4: interleave=2 gives each replica pair 2 of them\)"),
        ascend=(DeadlockError, (ONE_VECTOR_CORE, r"lockstep"))),
    # clusters with a multicast pipe (issue 39): the programs of a cluster checked together
    "cluster_rank1_never_releases": same(
        DeadlockError, r"program 1 of the cluster never releases slot \d+ of multicast pipe 'ring'",
        r"program 0's 'load' waits for it", r"work \(program 1 of the cluster\)",
        r"pipe 'ring' is multicast in a cluster of 2 programs"),
    "cluster_trips_depend_on_rank": same(
        DeadlockError, r"program 0 of the cluster never commits slot \d+ of multicast pipe 'ring'",
        r"program 1's 'work' waits for it", r"no branch or trip count on xs.cluster_rank\(\)"),
    "cluster_rows_past_the_end": same(
        DeadlockError, r"M = 607", r"program 1 of the cluster never (releases|commits) slot \d+ of multicast pipe 'tiles'",
        r"\(program 0 of the cluster\)"),
    # each field of a slot armed and delivered once (xsync/lowering/slot_fill.py)
    "cluster_multicast_written_twice": same(
        KernelSourceError, r"field 'shared' \(multicast\) of pipe 'ring' is written a second time \(first at line \d+\)",
        r"TMA barrier expects each field's bytes exactly once"),
    "cluster_leader_loads_by_hand": same(
        KernelSourceError, r"field 'shared' \(multicast\) of pipe 'ring' is written under the condition at line \d+ "
                           r"but not in the `else` branch", r"do not route the load to a leader by hand"),
    "slot_field_never_written": same(
        KernelSourceError, r"field 'b' of pipe 'ring' is never written between ring.acquire\(\) \(line \d+\) "
                           r"and this commit", r"s.b = \.\.\."),
    "slot_field_written_per_trip": same(
        KernelSourceError, r"field 'a' of pipe 'ring' is written inside the loop over `q`", r"once per trip"),
    "cluster_multicast_offsets_depend_on_rank": same(
        KernelSourceError, r"field 'shared' of pipe 'ring' is multicast, but its load's offsets depend on "
                           r"xs.cluster_rank\(\)"),
}


# Kernels the verifier checks only up to bounds (not proven for every trip count) on every
# placement: lowering refuses them (VerifierLimitError at the kernel's line, naming what was not
# covered) unless accept_bounded=True accepts them, and then the report says NOT PROVEN.
# name -> regexes the message must contain
NOT_PROVEN = {
    "bounded_carried_count": (r"not proven on the \w+ placement",
                              r"not covered:\n\s+- loop at line \d+ \(a bound or condition in its body reads a value carried",
                              r"to help: compute the loop's bound before the loop", r"accept_bounded=True",
                              r"--accept-bounded"),
}


def marker_line(kernel, backend) -> int:
    lines, start = inspect.getsourcelines(kernel.fn)
    found = {}
    for k, text in enumerate(lines):
        m = re.search(r"# BUG((?: (?:cpu|nvidia|ascend)\b)*)", text)
        if m:
            for b in m.group(1).split() or [None]:
                found.setdefault(b, start + k)
    return found.get(backend, found.get(None))


def verdict(kernel, backend):
    try:
        kernel.lower(backend)
        return None
    except XSyncError as err:
        return err


def test_corpus_covers_every_class():
    assert len(KERNELS) >= 40, len(KERNELS)
    for cls in ("late", "correct", "consistent", "hint", "emulator", "pairing", "episode"):
        assert sum(n.startswith(cls + "_") for n in KERNELS) >= 2, cls
    assert set(EXPECT) <= set(KERNELS)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", KERNELS)
def test_corpus_verdict(name, backend):
    kernel = getattr(C, name)
    err = verdict(kernel, backend)
    if name in NOT_PROVEN:
        assert type(err) is VerifierLimitError, f"{name} must not be proven on {backend}:\n{err}"
        assert err.loc.line == kernel.fn.__code__.co_firstlineno + 1 and err.report.unproven, str(err)
        for needle in NOT_PROVEN[name]:
            assert re.search(needle, str(err)), f"{needle!r} not in:\n{err}"
        report = kernel.lower(backend, accept_bounded=True).report
        assert report.status == "bounded" and report.unproven == err.report.unproven
        assert report.summary().startswith("NOT PROVEN — accepted bounded by accept_bounded=True: "
                                           f"verified for {backend} up to the bounds below")
        return
    expected = EXPECT.get(name, {}).get(backend)
    if expected is None:
        assert err is None, f"{name} must verify on {backend}:\n{err}"
        return
    cls, needles = expected
    assert err is not None, f"{name} must be rejected on {backend} with {cls.__name__}"
    msg = str(err)
    assert type(err) is cls, f"{type(err).__name__} instead of {cls.__name__}:\n{msg}"
    assert err.loc.file.endswith("corpus.py") and err.loc.line == marker_line(kernel, backend), \
        f"expected line {marker_line(kernel, backend)}:\n{msg}"
    for needle in needles:
        assert re.search(needle, msg), f"{needle!r} not in:\n{msg}"
    assert err.fix
    # the same source gets the same verdict everywhere, unless the message says why not
    cpu = EXPECT.get(name, {}).get("cpu")
    if backend != "cpu" and (cpu is None or cpu[0] is not cls):
        assert isinstance(err, CounterLimitError) or "placement" in msg, msg


# (kernel, backend, words of the fix, the kernel with the fix applied)
HINTS = [
    ("late_skip_release_every_8th", "cpu", "call ring.release() after every ring.wait()",
     "late_skip_release_every_8th_fixed"),
    ("late_flag_overflow", "ascend", "add back-pressure", "late_flag_overflow_fixed"),
    ("late_arrive_runs_ahead", "nvidia", "use team.sync() (which waits) instead of arrive()",
     "late_arrive_runs_ahead_fixed"),
    ("hint_per_role_loops_on_cube", "ascend", "put both roles' steps in one shared loop",
     "hint_per_role_loops_on_cube_fixed"),
    ("hint_too_few_stages", "cpu", "raise stages to at least 3", "hint_too_few_stages_fixed"),
    ("hint_handoff_order", "nvidia", "`for ...: with mma: ... s_pipe.commit()` then `with softmax:",
     "hint_handoff_order_fixed"),
    ("hint_loop_bounds", "cpu", "compute the bound once in unannotated code and loop over it in both",
     "hint_loop_bounds_fixed"),
    ("hint_barrier_calls_do_not_pair", "nvidia", "at the same point of the same loop",
     "hint_barrier_calls_do_not_pair_fixed"),
]


@pytest.mark.parametrize("name,backend,words,fixed", HINTS, ids=[h[0] for h in HINTS])
def test_fix_hints_fix(name, backend, words, fixed):
    err = verdict(getattr(C, name), backend)
    assert err is not None and words in err.fix, err
    report = getattr(C, fixed).lower(backend).report
    assert report.complete and report.assignments > 0


def test_stages_hint_is_not_given_where_stages_do_not_help():
    """Per-role loops over a pipe inside one Ascend core: the message is the same at any
    number of stages, and it does not tell the user to raise them."""
    k = C.hint_per_role_loops_on_cube
    fixes = set()
    for stages in (2, 4):
        with pytest.raises(DeadlockError) as info:
            k.lower("ascend", dict(BLOCK=16, STAGES=stages))
        assert "raise stages" not in info.value.fix
        fixes.add(info.value.fix)
    assert len(fixes) == 1


def test_flagship_kernels_verify_on_every_placement():
    from xsync.kernels.flash_attn import attention_fwd
    from xsync.kernels.gemm import gemm
    from xsync.kernels.gemm_softmax import gemm_softmax
    for kernel in (attention_fwd, gemm, gemm_softmax):
        for backend in BACKENDS:
            report = kernel.lower(backend).report
            assert report.complete, report.summary()
            assert "every value of" in report.summary()
    # the persistent tile loop is checked tile by tile, causal or not
    for causal in (0, 1):
        cx, dtypes = attention_fwd.specialization()
        for backend in BACKENDS:
            report = attention_fwd.lower(backend, dict(cx, CAUSAL=causal), dtypes).report
            assert report.complete and report.episodes, report.summary()
            assert "its iterations are independent" in report.summary()


# ---------------------------------------------------------------- the emulator
def _args(n):
    return torch.randn(max(1, n) * 16 + 64, 16), torch.zeros(max(1, n) * 16 + 64, 16)


# (kernel, n, error class, regexes naming role, object, line, iteration)
EMULATED = [
    ("late_skip_release_every_8th", 8, LeftoverError,
     (r"slot 7 waited by work was never released", r"line \d+ \(j=7\)", r"with n = 8")),
    ("late_skip_release_every_8th", 20, StallError, (r"acquire on pipe 'ring'", r"\(j=16\)")),
    ("consistent_leftover_not_release", 2, LeftoverError,
     (r"slot 2 committed by load was never waited by work",)),
    ("consistent_range_one_short", 3, LeftoverError, (r"committed by load was never waited by work",
                                                     r"\(i=2\)")),
    ("emulator_release_without_slot", 0, SlotOrderError,
     (r"release on pipe 'ring' by work without a slot from wait",)),
    ("emulator_incomplete_meeting", 3, LeftoverError,
     (r"barrier 'team': meeting 3 is left incomplete \(load arrived, work did not\)", r"\(i=2\)")),
    ("late_flag_overflow", 4, None, ()),       # a counting semaphore: fine on the CPU
]


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
@pytest.mark.parametrize("name,n,cls,needles", EMULATED, ids=[f"{e[0]}-{e[1]}" for e in EMULATED])
def test_emulator_reports_what_the_verifier_would(name, n, cls, needles, mode):
    kernel = getattr(C, name)
    x, y = _args(n)
    with xs.options(verify=False, cpu_mode=mode):
        if cls is None:
            kernel[(1,)](x, y, n, BLOCK=16, STAGES=2, backend="cpu")
            return
        with pytest.raises(cls) as info:
            kernel[(1,)](x, y, n, BLOCK=16, STAGES=2, backend="cpu")
    msg = str(info.value)
    assert info.value.loc.file.endswith("corpus.py"), msg
    for needle in needles:
        assert re.search(needle, msg), f"{needle!r} not in:\n{msg}"


@pytest.mark.parametrize("name", [n for n in KERNELS if not EXPECT.get(n, {}).get("cpu")
                                  and n not in ("correct_named_bound_with_prologue",
                                                "correct_sequence_lengths", "correct_persistent_tiles",
                                                "episode_tiles_grow", "bounded_carried_count")
                                  and not n.startswith("cluster")])
def test_accepted_kernels_run_clean_on_the_emulator(name):
    kernel = getattr(C, name)
    params = [p for p in inspect.signature(kernel.fn).parameters if p not in ("x", "y", "BLOCK", "STAGES")]
    for n in (0, 1, 3, 9):
        x, y = _args(n)
        kernel[(1,)](x, y, *([n] * len(params)), BLOCK=16, STAGES=2, backend="cpu")


# ---------------------------------------------------------------- clusters on the emulator
CLUSTERS = {"cluster_copy_pipeline": 2, "cluster4_copy_pipeline": 4}


def _cluster_expected(x, n, programs, cluster):
    out = torch.zeros(programs * n * 16 + 64, 16)
    for p in range(programs):
        for j in range(n):
            r = p % cluster
            out[(p * n + j) * 16:(p * n + j + 1) * 16] = x[j * 16:(j + 1) * 16] + x[(j + r) * 16:(j + r + 1) * 16]
    return out


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_cluster_kernels_compute_on_the_emulator(name, mode):
    """The programs of each cluster run together, a multicast slot shared by all of them; each
    program still gets its own copy of the tile and its own per-program pipe."""
    kernel, cluster = getattr(C, name), CLUSTERS[name]
    for n, clusters in ((0, 1), (1, 1), (5, 2), (3, 3)):
        programs = cluster * clusters
        x, y = torch.randn((n + 8) * 16, 16), torch.zeros(programs * n * 16 + 64, 16)
        with xs.options(cpu_mode=mode):
            kernel[(programs,)](x, y, n, BLOCK=16, STAGES=2, backend="cpu")
        assert torch.equal(y, _cluster_expected(x, n, programs, cluster)), (n, programs)


@pytest.mark.parametrize("programs", [2, 4, 6])
def test_cluster_gemm_computes_on_the_emulator(programs):
    torch.manual_seed(0)
    M, N, K = 4 * 32, 3 * 32, 5 * 16
    a, b, c = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16(), torch.zeros(M, N)
    C.cluster_gemm[(programs,)](a, b, c, M, N, K, BM=32, BN=32, BK=16, STAGES=2, backend="cpu")
    torch.testing.assert_close(c, a.float() @ b.float(), atol=1e-2, rtol=1e-2)
    with pytest.raises(LaunchError, match="multiple of 2"):
        C.cluster_gemm[(3,)](a, b, c, M, N, K, BM=32, BN=32, BK=16, STAGES=2, backend="cpu")


# (kernel, regexes of the stall report: who waits on what, naming the program)
CLUSTER_STALLS = [
    ("cluster_rank1_never_releases",
     (r"load \(program 0 of the cluster\)\s+line \d+ \(j=2\): acquire on multicast pipe 'ring': all 2 "
      r"slot\(s\) in use \(2 acquired, 0 released by work \(program 1 of the cluster\)\)",)),
    ("cluster_trips_depend_on_rank",
     (r"work \(program 1 of the cluster\)\s+line \d+ \(j=5\): wait on multicast pipe 'ring': slot 5 "
      r"not committed \(5 committed by load \(program 0 of the cluster\)\)",
      r"load \(program 0 of the cluster\)\s+finished")),
]


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
@pytest.mark.parametrize("name,needles", CLUSTER_STALLS, ids=[c[0] for c in CLUSTER_STALLS])
def test_broken_clusters_stall_on_the_emulator(name, needles, mode):
    """With the verifier off, a cluster whose program skips a multicast release, or runs more
    steps than its peers, stalls (as the hardware would hang) and the report names the program."""
    x, y = torch.randn(16 * 16, 16), torch.zeros(4 * 5 * 16 + 64, 16)
    with xs.options(verify=False, cpu_mode=mode):
        with pytest.raises(StallError) as info:
            getattr(C, name)[(4,)](x, y, 5, BLOCK=16, STAGES=2, backend="cpu")
    msg = str(info.value)
    assert info.value.loc.file.endswith("corpus.py") and info.value.loc.line == marker_line(getattr(C, name), "cpu"), msg
    for needle in needles:
        assert re.search(needle, msg), f"{needle!r} not in:\n{msg}"


def test_cluster_rows_past_the_end_stalls_on_the_emulator():
    """The verifier's counterexample (M = 607: program 1's last rows lie past M) hangs the
    cluster on the emulator with the verifier off, the stall naming both programs."""
    M, N, K = 607, 32, 32
    a, b, c = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16(), torch.zeros(M + 64, N)
    with xs.options(verify=False, cpu_mode="cooperative"):
        with pytest.raises(StallError) as info:
            C.cluster_rows_past_the_end[(2,)](a, b, c, M, N, K, BM=32, BN=32, BK=16, STAGES=2, backend="cpu")
    msg = str(info.value)
    assert re.search(r"program 0 of the cluster\)\s+line \d+ [^\n]*multicast pipe 'tiles'", msg), msg
    assert re.search(r"(load|mma) \(program 1 of the cluster\)\s+finished", msg), msg
