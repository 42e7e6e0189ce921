"""Same meaning, same schedule: kernels written other ways than the flagships (the split and
accumulate forms, one pipe or two, the waits and releases in another order) get the
flagship's Hopper schedule from the passes. Compared on the PTX hot loops (sm_90a, compiled
without a GPU): the sequence of wgmma issues, fences, commits and group waits, mbarrier and
named-barrier operations of every innermost loop that issues a wgmma."""
import functools

import pytest

import xsync as xs
from tests.nvidia.ptx_loops import hot_loops
from xsync.backends.nvidia import compile_ptx
from xsync.kernels import gemm_variants
from xsync.kernels.flash_attn import attention_fwd, ops, variants
from xsync.kernels.gemm import gemm

GEMM_DTYPES = dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32)


@functools.cache
def attention_loops(name: str, merge: bool = True, causal: int = 0):
    """Hot loops at a schedule the ops launch with three K/V stages (where merge-pipes applies):
    non-causal short d64 (persistent tile loop) or causal long d128 (one program per tile, no
    tile loop). (d128's short non-causal rows take two stages, for the TMA-store staging: there
    the two pipes stay two rings, and one pipe, spelled so, one ring.)"""
    kernel = attention_fwd if name == "flagship" else variants.VARIANTS[name]
    cx, dtypes = attention_fwd.specialization()
    d = 128 if causal else 64
    cx.update(ops.block_sizes("nvidia", d, bool(causal), 1024 if not causal else 8192), D=d, CAUSAL=causal)
    with xs.options(nv_merge_pipes=merge):
        lowered = kernel.lower("nvidia", cx, dtypes)
    return hot_loops(compile_ptx(lowered, scalar_types={"sm_scale": "fp32"}).ptx), lowered.passes.text()


@functools.cache
def gemm_loops(name: str, merge: bool = True):
    kernel = gemm if name == "gemm" else getattr(gemm_variants, name)
    with xs.options(nv_merge_pipes=merge):
        lowered = kernel.lower("nvidia", dict(BM=128, BN=128, BK=64, STAGES=3), GEMM_DTYPES)
    return hot_loops(compile_ptx(lowered).ptx), lowered.passes.text()


def tensor_core_ops(loop):
    """The wgmma issues, fences, commits and group waits of a hot loop (no barriers)."""
    return tuple(op for op in loop if not op.startswith(("mbarrier", "bar.")))


def test_flagship_hot_loops_are_the_overlapped_schedule():
    loops, log = attention_loops("flagship")
    assert len(loops) == 2, loops                    # one per consumer warpgroup
    for loop in loops:
        # S_n and PV_{n-1} issued back to back, S waited with PV still in flight
        assert loop.count("commit_group") == 2 and "wait_group 1" in loop and "wait_group 0" in loop, loop
        assert loop.index("wait_group 1") > max(i for i, op in enumerate(loop) if op == "commit_group")
    assert "pass overlap-softmax: applied" in log


@pytest.mark.parametrize("name", ["v_wait_first", "pv_first", "accumulate_form", "late_k_release",
                                  "kv_one_pipe"])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_variant_has_the_flagship_hot_loop(name, causal):
    loops, log = attention_loops(name, causal=causal)
    assert loops == attention_loops("flagship", causal=causal)[0], log


def test_merge_pipes_is_what_gives_k_and_v_in_two_pipes_one_ring():
    """Without the merge-pipes pass the flagship's two rings cost one more mbarrier wait and
    one more release per block than K and V written in one pipe (the same wgmma issues and
    group waits); with it the hot loops are identical (above)."""
    loops, log = attention_loops("kv_one_pipe")
    two_rings, two_log = attention_loops("flagship", merge=False)
    assert "pass merge-pipes: applied" in attention_loops("flagship")[1]
    assert "merge-pipes" not in two_log
    assert [tensor_core_ops(x) for x in loops] == [tensor_core_ops(x) for x in two_rings], log
    for one, two in zip(loops, two_rings):
        for op in ("mbarrier.try_wait.parity", "mbarrier.arrive"):
            assert one.count(op) == two.count(op) - 1, (op, one, two)
    assert "pass overlap-softmax: applied" in log


@pytest.mark.parametrize("name, reference", [
    ("gemm_split", "gemm"),                        # split form, one pipe
    ("gemm_two_pipes_split", "gemm_two_pipes"),    # split form, two pipes
    ("gemm_2wg_split", "gemm_2wg"),                # split form, two consumer warpgroups
])
def test_gemm_split_form_has_the_accumulate_form_hot_loop(name, reference):
    loops, log = gemm_loops(name)
    assert loops == gemm_loops(reference)[0], log
    assert "pass fuse-accumulating-mma: applied" in log and "pass defer-mma-wait: applied" in log


def test_gemm_hot_loops_keep_one_wgmma_in_flight():
    flagship, _ = gemm_loops("gemm")
    assert len(flagship) == 1 and "wait_group 1" in flagship[0] and "wait_group 0" not in flagship[0]
    # A and B in two pipes: merge-pipes gives them the flagship's one ring; without the pass,
    # the same tensor-core sequence with one more mbarrier wait and release per K step
    assert gemm_loops("gemm_two_pipes")[0] == flagship, gemm_loops("gemm_two_pipes")[1]
    (two,), _ = gemm_loops("gemm_two_pipes", merge=False)
    assert tensor_core_ops(two) == tensor_core_ops(flagship[0])
    for op in ("mbarrier.try_wait.parity", "mbarrier.arrive"):
        assert two.count(op) == flagship[0].count(op) + 1, (op, two, flagship[0])
    # two consumer warpgroups: each runs the flagship's tensor-core sequence, taking turns
    wg, log = gemm_loops("gemm_2wg")
    assert len(wg) == 2 and all(tensor_core_ops(x) == tensor_core_ops(flagship[0]) for x in wg), wg
    assert all(x.count("bar.sync") > flagship[0].count("bar.sync") for x in wg), wg
    assert "pass pingpong: applied" in log


def test_a_cast_mma_operand_is_cast_then_converted():
    """`xs.mma(p.to(q.dtype), v)` (the accumulate form): the renderer casts p where it is
    computed and converts the bf16 tile to the dot-operand layout, as the flagship's slot
    hand-off does, instead of converting the fp32 tile and casting after."""
    from xsync.backends.nvidia import render_source

    cx, dtypes = attention_fwd.specialization()
    cx.update(ops.block_sizes("nvidia"), D=128, CAUSAL=1)
    lowered = variants.VARIANTS["accumulate_form"].lower("nvidia", cx, dtypes)
    source = render_source(lowered.kernel, lowered.placement, lowered.allocation)
    assert "gl.convert_layout(p.to(gl.bfloat16), gl.DotOperandLayout(" in source
    assert ".to(gl.bfloat16), k_in_v_in_v" not in source
