"""The subtile-replicas pass (xsync/lowering/passes/subtile_replicas.py): a role with more
replicas than the two vector cores takes its slots first and gives them back last, so each
replica's work of a step is one run the renderer emits replica by replica; verified after the
pass, with one replica's tiles live at a time (memory.py, render.py)."""
import re

import pytest

import xsync as xs
from xsync.backends.ascend import render_source
from xsync.kernels.flash_attn import ops
from xsync.kernels.flash_attn.kernel import attention_fwd
from xsync.lowering import ir
from xsync.lowering.passes import subtile_replicas


def lowered(replicas=4, bm=32, bn=512, causal=0):
    cx, dtypes = attention_fwd.specialization()
    cx.update(ops.block_sizes("ascend", 128, bool(causal)), BM=bm, BN=bn, REPLICAS=replicas, D=128,
              CAUSAL=causal)
    return attention_fwd.lower("ascend", cx, dtypes, check=True)


def step_order(kernel, role):
    """Sync verbs of ``role``'s role blocks in the step loop (for n in ...), in order."""
    loop = next(s for s in ir.walk(kernel.body) if isinstance(s, ir.For) and s.var == "n")
    return [[f"{x.obj}.{x.verb}" for x in b.body if isinstance(x, ir.SyncOp)]
            for b in loop.body if isinstance(b, ir.RoleBlock) and b.role == role]


def test_the_d128_schedule_runs_sub_tile_replicas():
    assert ops.block_sizes("ascend", 128)["REPLICAS"] == 4


@pytest.mark.parametrize("causal", [0, 1])
def test_slots_taken_first_and_given_back_last_and_proven(causal):
    low = lowered(causal=causal)
    assert low.report.proven, low.report.summary()
    text = low.passes.text()
    assert "subtile-replicas: applied to role 'softmax'" in text and "subtile-replicas: applied to role 'mma'" in text
    assert step_order(low.kernel, "softmax")[0] == ["s_out.wait", "p_in.acquire", "s_out.release", "p_in.commit"]
    assert step_order(low.kernel, "mma")[-1] == ["p_in.wait", "v_in.wait", "pv_out.acquire", "v_in.release",
                                                 "p_in.release", "pv_out.commit"]


def test_two_replicas_are_lowered_as_written():
    low = lowered(replicas=2, bm=64, bn=128)
    assert "subtile-replicas" not in low.passes.text()
    assert step_order(low.kernel, "softmax")[0] == ["s_out.wait", "s_out.release", "p_in.acquire", "p_in.commit"]


def test_each_replica_loads_its_s_runs_its_softmax_and_stores_its_p_in_turn():
    low = lowered()
    src = render_source(low.kernel, low.placement, low.allocation, form="release")
    vector = src[src.index("vector cores (AIV)"):]
    marks = [(m.start(), m.group(0)) for m in re.finditer(r"sc_r\d_s = tl\.load|\(p_r\d\.to", vector)]
    assert [w for _, w in marks] == [w for r in range(4) for w in (f"sc_r{r}_s = tl.load", f"(p_r{r}.to")]
    cube = src[:src.index("vector cores (AIV)")]
    dots = [m.group(1) for m in re.finditer(r"(s_r\d = tl\.dot|s_out\.s -> GM slot)", cube)]
    assert dots[:4] == ["s_r0 = tl.dot", "s_out.s -> GM slot", "s_r1 = tl.dot", "s_out.s -> GM slot"]


def test_l0c_holds_one_replicas_product():
    plan = lowered().allocation.memory
    assert plan.need("cc") == 32 * 512 * 4       # one replica's S (64 KB); PV takes its turn


def test_a_dropped_release_planted_in_the_pass_is_rejected(monkeypatch):
    real = subtile_replicas._join

    def buggy(block, log):
        out = real(block, log)
        return None if out is None else tuple(s for s in out if not (
            isinstance(s, ir.SyncOp) and s.verb is ir.Verb.RELEASE and s.obj == "s_out"))
    monkeypatch.setattr(subtile_replicas, "_join", buggy)
    with pytest.raises(xs.ProtocolError):
        lowered()


def test_a_pipe_taken_again_after_a_release_is_lowered_as_written():
    """Rule 5: wait, release, wait, release on one pipe in one block would become wait, wait,
    release, release (two slots held): the block stays as written, and the log says why."""
    from xsync.errors import SourceLoc
    from xsync.lowering.passes import PassLog

    loc = SourceLoc("k.py", 1, "")
    act = lambda verb, target=None: ir.SyncOp(ir.Verb(verb), "ring", target, loc)   # noqa: E731
    use = lambda name: ir.Assign((name,), ir.Name("a"), loc)                         # noqa: E731
    block = ir.RoleBlock("vec", (act("wait", "a"), use("x"), act("release"), act("wait", "a"), use("y"),
                                 act("release")), loc)
    log = PassLog()
    assert subtile_replicas._join(block, log) is None
    assert "rule 5: pipe 'ring'" in log.text()


def lowered_backward(kernel, replicas, causal=0, backend="ascend", **over):
    from xsync.kernels.flash_attn import grad

    cx, dtypes = kernel.specialization()
    cx.update(grad.block_sizes("ascend", 128, bool(causal), dq=kernel.__name__ == "attention_bwd_dq"),
              REPLICAS=replicas, D=128, CAUSAL=causal, **over)
    return kernel.lower(backend, cx, dtypes, check=True)


def test_the_d128_backward_schedule_runs_dq_in_sub_tile_replicas():
    """d128: dQ in four 32-row replicas of 256 keys a step (128 rows a program), dK/dV in two."""
    from xsync.kernels.flash_attn import grad

    for causal in (False, True):
        assert grad.block_sizes("ascend", 128, causal, dq=True) == dict(BM=32, BN=256, STAGES=2, PERSISTENT=1,
                                                                        REPLICAS=4)
        assert grad.block_sizes("ascend", 128, causal)["REPLICAS"] == 2
    assert grad.block_sizes("ascend", 64, dq=True)["REPLICAS"] == 2
    assert grad.block_sizes("nvidia", 128, dq=True)["REPLICAS"] == 2


@pytest.mark.parametrize("causal", [0, 1])
def test_dq_slots_taken_first_and_given_back_last_and_proven(causal):
    from xsync.kernels.flash_attn.backward import attention_bwd_dq

    low = lowered_backward(attention_bwd_dq, 4, causal)
    assert low.report.proven, low.report.summary()
    text = low.passes.text()
    assert "subtile-replicas: applied to role 'grad'" in text and "subtile-replicas: applied to role 'mma'" in text
    assert step_order(low.kernel, "grad")[0] == ["sdp.wait", "ds_in.acquire", "sdp.release", "ds_in.commit"]
    # L0C: the four replicas' dQ accumulators, and one replica's S and dP at a time (all of it)
    assert low.allocation.memory.need("cc") == 4 * 32 * 128 * 4 + 2 * 32 * 256 * 4 == 131072


def test_dkdv_in_four_replicas_overflows_l0c():
    """dK/dV's accumulators of four 32-key replicas fill L0C before any product (memory.py)."""
    from xsync.kernels.flash_attn.backward import attention_bwd_dkdv

    with pytest.raises(xs.AllocationError, match="L0C"):
        lowered_backward(attention_bwd_dkdv, 4)


def test_num_replicas_is_folded_and_a_replica_only_constexpr_is_not_named():
    """The backward's REPLICAS only sets replicas=, and the body reads xs.num_replicas(mma): the
    generated code spells the number (Hopper and CPU sources as before the constexpr)."""
    from xsync.kernels.flash_attn.backward import attention_bwd_dq

    for replicas, bn in ((2, 128), (4, 256)):
        low = lowered_backward(attention_bwd_dq, replicas, BN=bn)
        assert "REPLICAS" not in dict(low.kernel.constexprs)
        src = render_source(low.kernel, low.placement, low.allocation, form="release")
        assert "REPLICAS" not in src and f"tl.cdiv(max_q, {replicas} * BM)" in src


def test_num_replicas_names_a_role():
    @xs.kernel
    def k(x, BM: xs.constexpr):
        work = xs.role("work", kind="vector", replicas=2)
        with work:
            y = xs.num_replicas(x) * BM
    with pytest.raises(xs.KernelSourceError, match="does not name a role"):
        k.lower("cpu", dict(BM=4), dict(x=xs.float32))
