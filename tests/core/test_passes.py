"""Schedule passes: what they rewrite, when they refuse (with the numbered rule), and that
the verifier checks what they emit (a bug planted in a pass is rejected)."""
import pytest

import pass_kernels as pk
import xsync as xs
from xsync.kernels.flash_attn import grad
from xsync.kernels.flash_attn.backward import attention_bwd_dkdv, attention_bwd_dq
from xsync.kernels.flash_attn.kernel import attention_fwd
from xsync.lowering import ir
from xsync.lowering.passes import cross_agent_pipeline
from xsync.lowering.verifier.forms import Atom, LoopVar, iterations_ahead


def sync_order(kernel, roles):
    """The sync verbs of ``roles`` in body order, loops unrolled once (for reading)."""
    out = []
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.RoleBlock) and s.role in roles:
            out += [f"{x.obj}.{x.verb}" for x in ir.walk(s.body) if isinstance(x, ir.SyncOp)]
    return out


def test_attention_on_ascend_issues_s_two_steps_ahead():
    low = attention_fwd.lower("ascend")
    text = low.passes.text()
    assert "cross-agent-pipeline: applied" in text and "'s_out'" in text and "'p_in'" in text
    assert "issued 2 iterations ahead" in text          # rule 8: s_out has 3 stages
    cube = sync_order(low.kernel, ("load", "mma"))
    # two prologue hand-offs, then in the loop: the S two ahead before this iteration's P
    first_p = cube.index("p_in.wait")
    assert cube[:first_p].count("s_out.commit") == 3


def test_the_windowed_attention_keeps_one_step_ahead():
    """WINDOW=1 declares s_out with two stages (kernel.py): its free lo and hi would take the
    verifier past its bound at two steps ahead."""
    cx, dtypes = attention_fwd.specialization()
    low = attention_fwd.lower("ascend", dict(cx, WINDOW=1, BM=32), dtypes)
    assert "issued one iteration ahead" in low.passes.text()
    assert low.report is not None        # verified after the pass


@pytest.mark.parametrize("backend", ["cpu", "nvidia"])
def test_not_run_where_mma_and_softmax_do_not_hand_off_across_agents(backend):
    low = attention_fwd.lower(backend)
    assert "cross-agent-pipeline" not in low.passes.text()
    assert sync_order(low.kernel, ("mma",)) == sync_order(attention_fwd.lower(backend).kernel, ("mma",))


def test_small_round_trip_is_rotated_and_verified():
    low = pk.round_trip.lower("ascend")
    assert "applied to loop at line" in low.passes.text()
    assert "(5 statement(s) rotated; 'fwd' has 2 stage(s))" in low.passes.text()


def test_a_carried_dependence_keeps_the_schedule():
    low = pk.carried_into_the_hand_off.lower("ascend")
    note = low.passes.text()
    assert "not applied" in note and "rule 5" in note and "['acc']" in note


def test_a_bug_planted_in_the_pass_is_rejected(monkeypatch):
    """The pass 'forgets' its prologue (the first hand-off): the consumer would wait for a
    slot nobody commits. Verification runs after the passes and refuses it."""
    real = cross_agent_pipeline._rewrite

    def buggy(loop, agent, stage_a_ids, depth=1):
        _prologue, rewritten = real(loop, agent, stage_a_ids, depth)
        return [rewritten]
    monkeypatch.setattr(cross_agent_pipeline, "_rewrite", buggy)
    with pytest.raises(xs.ProtocolError) as err:
        pk.round_trip.lower("ascend")
    assert "fwd" in str(err.value)


def test_a_dropped_release_planted_in_the_pass_is_rejected(monkeypatch):
    real = cross_agent_pipeline._rewrite

    def buggy(loop, agent, stage_a_ids, depth=1):
        prologue, rewritten = real(loop, agent, stage_a_ids, depth)

        def drop(stmts):
            out = []
            for s in stmts:
                if isinstance(s, ir.SyncOp) and s.verb == "release" and s.obj == "back":
                    continue
                if isinstance(s, ir.RoleBlock):
                    s = ir.RoleBlock(s.role, tuple(drop(s.body)), s.loc)
                elif isinstance(s, ir.If):
                    s = ir.If(s.cond, tuple(drop(s.body)), tuple(drop(s.orelse)), s.loc)
                out.append(s)
            return out
        return [prologue, ir.For(rewritten.var, rewritten.start, rewritten.stop, rewritten.step,
                                 tuple(drop(rewritten.body)), rewritten.loc)]
    monkeypatch.setattr(cross_agent_pipeline, "_rewrite", buggy)
    with pytest.raises(xs.ProtocolError) as err:
        pk.round_trip.lower("ascend")
    assert "back" in str(err.value)


def test_a_tile_both_stages_read_is_loaded_again_by_the_later_stage():
    """Rule 9: the rotated stage's same-core slot (the attention backward's Q) reaches the later
    stage as its own load, not as the slot the next iteration overwrites."""
    low = pk.tile_read_by_both_stages.lower("ascend")
    assert "applied" in low.passes.text() and "loaded again for the later stage: 'at.a'" in low.passes.text()
    assert low.report.complete                          # verified after the pass
    loop = next(s for s in ir.walk(low.kernel.body) if isinstance(s, ir.For))
    again = [s for s in ir.walk(loop.body) if isinstance(s, ir.Assign) and s.targets == ("xs_at_a_again",)]
    assert len(again) == 1 and again[0].value.op is ir.TileOp.LOAD
    later = [s for s in ir.walk(loop.body) if isinstance(s, ir.Assign) and s.targets == ("z",)
             and isinstance(s.value, ir.Call) and s.value.op is ir.TileOp.MMA]
    assert later and later[0].value.args[1] == ir.Name("xs_at_a_again")


def test_a_tile_from_a_running_value_keeps_the_schedule():
    note = pk.tile_from_a_running_value.lower("ascend").passes.text()
    assert "not applied" in note and "rule 9" in note and "['row']" in note


@pytest.mark.parametrize("kernel,what", [(attention_bwd_dkdv, "'qt.do', 'qt.q'"), (attention_bwd_dq, "'kt.k'")])
def test_the_attention_backward_on_ascend_runs_the_cube_a_step_ahead(kernel, what):
    cx, dtypes = kernel.specialization()
    low = kernel.lower("ascend", dict(cx, **grad.block_sizes("ascend", 128)), dtypes)
    assert "issued one iteration ahead" in low.passes.text() and what in low.passes.text()
    assert low.report.proven          # (a relaxed value proves too: verifier.relaxation)


def test_the_verifier_reads_a_rotated_guard_from_the_trip_count():
    """``i + j * step < stop`` at iteration k holds iff k + j < trips: no value of its own."""
    i, n = LoopVar("i", 1), Atom("n", "int")
    assert iterations_ahead(ir.Compare("<", ir.BinOp("+", i, ir.Const(128)), n), i, n, ir.Const(64))
    assert not iterations_ahead(ir.Compare("<", ir.BinOp("+", i, ir.Const(100)), n), i, n, ir.Const(64))
    assert not iterations_ahead(ir.Compare("<=", ir.BinOp("+", i, ir.Const(64)), n), i, n, ir.Const(64))
    assert not iterations_ahead(ir.Compare("<", ir.BinOp("+", i, ir.Const(64)), Atom("m", "int")), i, n,
                                ir.Const(64))


def test_a_rewrite_proven_only_up_to_bounds_is_not_kept():
    """Rule 7: the windowed fused dK/dV on Ascend (32-row steps: dQ's share fits L0C) rotated is
    proven only up to the verifier's bounds, as written for every value: lowering keeps the
    kernel as written, and the log says why."""
    cx, dtypes = attention_bwd_dkdv.specialization()
    cx.update(grad.fused_block_sizes("ascend", 128), CAUSAL=0, WINDOW=1)
    low = attention_bwd_dkdv.lower("ascend", cx, dtypes)
    assert low.report.proven and "not kept" in low.passes.text()
    assert "cross-agent-pipeline: applied" not in low.passes.text()
