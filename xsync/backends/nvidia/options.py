"""The nvidia backend's options: what its lowering and its renderer read.

Each field names the ``xsync.config`` option that feeds it; None means "the pass's or the
allocator's default" (the passes are on unless switched off; register budgets follow the
occupancy rule of :mod:`xsync.backends.nvidia.alloc`).
"""
from __future__ import annotations

from dataclasses import dataclass

from xsync.backends.base import StageOptions, option_field


@dataclass(frozen=True)
class LowerOptions(StageOptions):
    """Read by the Hopper schedule passes (:mod:`xsync.backends.nvidia.passes`) and the
    allocator's register budgets when the kernel is lowered (the verifier checks what the
    passes emit)."""

    STAGE = "lowering"

    merge_pipes: bool | None = option_field("nv_merge_pipes")
    fuse_mma: bool | None = option_field("nv_fuse_mma")
    defer_mma_wait: bool | None = option_field("nv_defer_mma_wait")
    overlap_softmax: bool | None = option_field("nv_overlap")
    pingpong: str | None = option_field("nv_pingpong")      # "0" "1" "each" "first" "wrap"
    producer_regs: int | None = option_field("nv_producer_regs")
    consumer_regs: int | None = option_field("nv_consumer_regs")
    maxnreg: int | None = option_field("nv_maxnreg")


@dataclass(frozen=True)
class RenderOptions(StageOptions):
    """Read by the Gluon renderer (:mod:`xsync.backends.nvidia.render`) and the launch."""

    STAGE = "rendering"

    debug_hang: bool = option_field("debug_hang", False)
    hang_timeout_ms: int = option_field("hang_timeout_ms", 2000)
    tma_store: bool | None = option_field("nv_tma_store")
    prefetch_tile_scalars: bool | None = option_field("nv_prefetch_tile_scalars")
    exp2_fma: str = option_field("nv_exp2_fma", "0")
    # set by keyword only: a benchmark's shared-memory limit for TMA-store staging (None:
    # the renderer's STAGING_SMEM_LIMIT), and the hang debug mode's xs_bars offset
    staging_smem_limit: int | None = option_field(None)
    bars_smem: int = option_field(None, 0)
