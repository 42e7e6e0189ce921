"""The Hopper schedule passes (xsync/backends/nvidia/passes): a log line per candidate with
the numbered rule, the verifier checks what they emit (a bug planted in a pass is rejected),
their barriers exist only where they fire, and the placement types every agent."""
import dataclasses

import pytest

import xsync as xs
from tests.core import pass_kernels
from xsync.backends.nvidia.passes import defer_wait, merge_pipes, overlap, pingpong
from xsync.errors import DeadlockError, LeftoverError, PhaseAliasingError, ProtocolError
from xsync.kernels import gemm_variants
from xsync.kernels.flash_attn import attention_fwd
from xsync.kernels.gemm import gemm
from xsync.lowering import ir
from xsync.lowering.placement import Unit


THREE_STAGES = dict(attention_fwd.specialization()[0], STAGES=3)   # what the ops launch on Hopper


def notes(lowered, pass_name):
    return [n for n in lowered.passes.notes if n.pass_name == pass_name]


def test_every_candidate_gets_a_log_line_with_its_rule():
    low = attention_fwd.lower("nvidia")
    text = low.passes.text()
    # the two mmas of the attention loop: S is used as a score (rule 3), PV is fused
    fuse = notes(low, "fuse-accumulating-mma")
    assert [n.applied for n in fuse] == [False, True] and "rule 3" in fuse[0].why
    # both loops (tile loop, key loop) are candidates of defer-mma-wait and overlap-softmax
    assert all(not n.applied and n.why.startswith("rule 2") for n in notes(low, "defer-mma-wait"))
    assert [n.applied for n in notes(low, "overlap-softmax")] == [True, False]
    assert "pass pingpong: not applied to agent 'consumer': rule 4" in text
    assert notes(gemm.lower("nvidia"), "defer-mma-wait")[0].applied


def test_switches_turn_passes_off():
    with xs.options(nv_defer_mma_wait=False):
        assert notes(gemm.lower("nvidia"), "defer-mma-wait") == []
    with xs.options(nv_overlap=False, nv_fuse_mma=False):
        low = attention_fwd.lower("nvidia")
    assert notes(low, "overlap-softmax") == [] and notes(low, "fuse-accumulating-mma") == []
    assert [n.applied for n in notes(low, "pingpong")] == [True]


def planted(monkeypatch, module, name, edit):
    """Replace ``module.name`` (a pass's rewrite step) by the original followed by ``edit``."""
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: edit(original(*a, **k)))


def drop(stmts, pred):
    """``stmts`` without the statements ``pred`` selects, at every depth."""
    out = []
    for s in stmts:
        if pred(s):
            continue
        if isinstance(s, ir.For):
            s = dataclasses.replace(s, body=drop(s.body, pred))
        elif isinstance(s, ir.If):
            s = ir.If(s.cond, drop(s.body, pred), drop(s.orelse, pred), s.loc)
        elif isinstance(s, ir.RoleBlock):
            s = ir.RoleBlock(s.role, drop(s.body, pred), s.loc)
        out.append(s)
    return tuple(out)


def test_planted_bug_dropped_release_after_deferred_loop(monkeypatch):
    """defer-mma-wait without the release of the last held slot: the producer's next acquire
    (STAGES later) never passes, or the slot is left over -- the verifier says which."""
    assert gemm.lower("nvidia", check=True).report.complete
    planted(monkeypatch, defer_wait, "_apply", lambda out: [s for s in out if not (
        isinstance(s, ir.SyncOp) and s.verb == "release")])
    with pytest.raises((LeftoverError, DeadlockError)) as err:
        gemm.lower("nvidia", check=True)
    assert "tiles" in str(err.value)


def test_planted_bug_missing_wait_in_rotated_loop(monkeypatch):
    """overlap-softmax whose epilogue forgets to wait for the last V tile: PV would read a
    slot that is not filled, and the last V slot is never waited."""
    def no_last_v_wait(out):
        (guard,) = out
        body = list(guard.body)
        k = max(i for i, s in enumerate(body) if isinstance(s, ir.SyncOp) and s.verb == "wait" and s.obj == "v_in")
        return [ir.If(guard.cond, tuple(body[:k] + body[k + 1:]), guard.orelse, guard.loc)]
    planted(monkeypatch, overlap, "_rotate", no_last_v_wait)
    with pytest.raises(ProtocolError) as err, xs.options(nv_merge_pipes=False):
        attention_fwd.lower("nvidia", THREE_STAGES, check=True)
    assert "v_in" in str(err.value)


def test_planted_bug_pingpong_without_closing_handshake(monkeypatch):
    """The first version of the ping-pong pass ended with a bare arrive of replica 0: in a
    persistent tile loop replica 1 can then be two meetings ahead on a turn barrier."""
    def bare_last_arrive(out):
        first, loop, last = out
        arrive = ir.SyncOp("arrive", last.body[0].obj, None, last.loc)
        return [first, loop, ir.If(last.cond, (arrive,), (), last.loc)]
    planted(monkeypatch, pingpong._Rewriter, "plan",
            lambda out: out if out is None else bare_last_arrive(out))
    # plan is a method: the wrapper above receives (self, loop, uniform, role)
    with xs.options(nv_overlap=False):
        with pytest.raises((PhaseAliasingError, DeadlockError, LeftoverError)) as err:
            attention_fwd.lower("nvidia", check=True)
    assert "consumer_turn" in str(err.value)


def test_pingpong_barriers_exist_only_where_the_pass_fires():
    def turn_barriers(low):
        return sorted(b.name for b in low.kernel.barriers if b.made_by == pingpong.NAME)
    assert turn_barriers(gemm.lower("nvidia")) == []                 # one consumer warpgroup
    assert turn_barriers(attention_fwd.lower("nvidia")) == []        # rotated: rule 4
    low = gemm_variants.gemm_2wg.lower("nvidia")
    assert turn_barriers(low) == ["consumer_turn0", "consumer_turn1"]
    ids = {b.obj: b.id for b in low.allocation.named_barriers if b.made_by == pingpong.NAME}
    assert sorted(ids) == ["consumer_turn0", "consumer_turn1"] and len(set(ids.values())) == 2


def test_copy_roles_with_different_replica_counts_are_producer_partitions():
    """Two copy roles (2 replicas and 1) on Hopper: each gets 1-warp producer partitions with
    the producer register budget, not a 4-warp consumer warpgroup."""
    low = gemm_variants.gemm_2wg.lower("nvidia")
    units = {a.name: (a.unit, a.replicas) for a in low.placement.agents}
    assert units == {"load_a": (Unit.PRODUCER, 2), "load_b": (Unit.PRODUCER, 1), "consumer": (Unit.CONSUMER, 2)}
    parts = low.allocation.partitions
    producers = [p for p in parts if p.unit == Unit.PRODUCER]
    consumers = [p for p in parts if p.unit == Unit.CONSUMER]
    assert len(producers) == 3 and all(p.warps == 1 for p in producers)
    assert len(consumers) == 2 and all(p.warps == 4 for p in consumers)
    assert len({p.regs for p in producers}) == 1 and all(p.regs < c.regs for p in producers for c in consumers)


# ---------------------------------------------------------------- merge-pipes
def test_merge_pipes_gives_k_and_v_one_ring_at_three_stages():
    low = attention_fwd.lower("nvidia", THREE_STAGES, check=True)
    (note,) = notes(low, "merge-pipes")
    assert note.applied and "'k_in' and 'v_in'" in note.where, note
    (ring,) = [p for p in low.kernel.pipes if p.made_by == merge_pipes.NAME]
    assert (ring.name, ring.origin, ring.stages) == ("k_in_v_in", "k_in+v_in", 3)
    assert [f.name for f in ring.fields] == ["k", "v"] and ring.slot_bytes == 2 * 128 * 128 * 2
    assert not {"k_in", "v_in"} & {p.name for p in low.kernel.pipes}
    assert low.report.complete, low.report.summary()
    ops = [s for s in ir.walk(low.kernel.all_statements()) if isinstance(s, ir.SyncOp) and s.obj == ring.name]
    assert sorted({s.verb for s in ops}) == ["acquire", "commit", "release", "wait"]
    # the GEMM written with A and B in two pipes gets one ring too
    assert notes(gemm_variants.gemm_two_pipes.lower("nvidia", check=True), "merge-pipes")[0].applied


def test_merge_pipes_refusals_name_their_rule():
    (two_stages,) = notes(attention_fwd.lower("nvidia", dict(THREE_STAGES, STAGES=2)), "merge-pipes")
    assert not two_stages.applied and two_stages.why.startswith("rule 5"), two_stages
    with xs.options(nv_merge_pipes=False):
        assert notes(attention_fwd.lower("nvidia", THREE_STAGES), "merge-pipes") == []
    # B filled only after the consumer answered A: merging would hold A back behind that answer
    low = pass_kernels.b_after_an_answer.lower("nvidia", check=True)
    (note,) = notes(low, "merge-pipes")
    assert not note.applied and note.why.startswith("rule 2") and low.report.complete, note
    (note,) = notes(pass_kernels.released_b_first.lower("nvidia", check=True), "merge-pipes")
    assert not note.applied and note.why.startswith("rule 3"), note


def test_planted_bug_merged_ring_never_released(monkeypatch):
    """merge-pipes that drops the merged release: the producer's acquire STAGES blocks later
    never passes (or the slots are left over) -- rejected before anything is rendered."""
    def no_release(out):
        kernel, name = out
        return dataclasses.replace(kernel, body=drop(kernel.body, lambda s: isinstance(s, ir.SyncOp)
                                                     and s.verb == "release" and s.obj == name)), name
    planted(monkeypatch, merge_pipes, "_merge", no_release)
    with pytest.raises((LeftoverError, DeadlockError)) as err:
        attention_fwd.lower("nvidia", THREE_STAGES, check=True)
    assert "k_in_v_in" in str(err.value)
