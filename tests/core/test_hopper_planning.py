"""The Hopper renderer's decisions, planned before any text (xsync/backends/nvidia/planning.py):
TMA-store staging by its numbered rules (staging.py) and the tile loops whose table reads go
out ahead (prefetch.py). No triton needed: nothing is spelled."""
import xsync as xs
from xsync.backends.nvidia import planning, staging
from xsync.backends.nvidia.options import RenderOptions
from xsync.kernels.flash_attn import attention_fwd
from xsync.kernels.gemm import gemm_persistent_2wg
from xsync.kernels.gemm_softmax import gemm_softmax
from xsync.lowering import ir


def _plan(kernel, cx=None, dtypes=None, **options):
    low = kernel.lower("nvidia", cx, dtypes)
    return low, planning.plan(low.kernel, low.placement, low.allocation, RenderOptions(**options))


def _stores(low, plan):
    return [s for a in low.placement.agents for s in ir.walk(plan.bodies[a.name]) if isinstance(s, ir.Store)]


def test_two_warpgroup_gemm_stages_c_within_the_limit_and_not_below_it():
    cx = dict(BM=128, BN=128, BK=64, STAGES=3, GROUP_M=8)
    dtypes = dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.bfloat16)
    low, plan = _plan(gemm_persistent_2wg, cx, dtypes)
    (tile,) = plan.staging.tiles
    assert (tile.rows, tile.cols, tile.dtype.name, tile.replicas) == (128, 128, "bfloat16", 2)
    assert low.allocation.smem_bytes + tile.bytes <= staging.STAGING_SMEM_LIMIT
    decided = [plan.staging.of(s) for s in _stores(low, plan)]
    assert decided and all(d is not None and d.tile == tile and d.desc == "c_store_desc" for d in decided)
    assert dict(plan.staging.descs) == {("c", (128, 128)): "c_store_desc"}
    # rule 7: no room under 200 KB; rule 1: the option turns it off
    assert not _plan(gemm_persistent_2wg, cx, dtypes, staging_smem_limit=200 * 1024)[1].staging.tiles
    assert not _plan(gemm_persistent_2wg, cx, dtypes, tma_store=False)[1].staging.tiles


def test_a_store_inside_a_plain_loop_is_not_staged():
    low, plan = _plan(gemm_softmax)         # rule 5: the column blocks' loop is not a tile loop
    assert _stores(low, plan) and not plan.staging.tiles and not plan.staging.stores


def test_reads_ahead_are_planned_only_where_the_option_asks():
    cx = dict(attention_fwd.specialization()[0], STAGES=2)
    assert not _plan(attention_fwd, cx)[1].reads_ahead.loops
    low, plan = _plan(attention_fwd, cx, prefetch_tile_scalars=True)
    (ahead,) = plan.reads_ahead.loops.values()
    assert ahead.depth == 2 and ahead.loop.tile_loop
    consumer_loops = [s for a in low.placement.agents for s in ir.walk(plan.bodies[a.name])
                      if isinstance(s, ir.For) and plan.reads_ahead.of(s) is ahead]
    assert len(consumer_loops) == 1
