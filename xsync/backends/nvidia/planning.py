"""Everything the Hopper renderer is told before it spells a kernel, decided in one step after
allocation (:func:`plan`):

1. the agent programs, each taken once (``bodies``; the decisions below name their statements);
2. the checks the Hopper lowering needs (pipe fields crossing partitions are 2-D tiles; the
   default partition is a consumer warpgroup);
3. how each tensor parameter reaches the kernel (:mod:`.tensors`);
4. the types and layouts of every agent program (:mod:`.layouts`);
5. which stores leave through a staging tile and a TMA store (:mod:`.staging`);
6. which tile loops issue their table reads ahead (:mod:`.prefetch`).

The renderer (:mod:`.render`) spells the :class:`RenderPlan`; it decides nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from xsync.backends.nvidia import prefetch, staging, tensors
from xsync.backends.nvidia.alloc import HopperAllocation
from xsync.backends.nvidia.layouts import ModuleLayouts, infer
from xsync.backends.nvidia.options import RenderOptions
from xsync.errors import BackendError
from xsync.lowering import ir, shapes
from xsync.lowering.placement import Placement, Unit
from xsync.lowering.slicing import agent_body


@dataclass(frozen=True)
class RenderPlan:
    bodies: Mapping[str, tuple]              # agent -> its program (the statements planned for)
    consts: Mapping[str, object]             # the specialization's constexpr values
    tensors: tensors.TensorUses
    layouts: ModuleLayouts
    staging: staging.StagingPlan
    reads_ahead: prefetch.ReadsAheadPlan


def _check_supported(kernel: ir.KernelIR, placement: Placement):
    for shape, what, loc in shapes.written_tiles(kernel):
        if any(not isinstance(d, int) or d <= 0 or d & (d - 1) for d in shape):
            raise BackendError(f"{what} has shape {list(shape)}; Gluon tiles have power-of-two "
                               f"dimensions", loc=loc or kernel.loc,
                               fix="use powers of two (16, 32, 64, 128) and mask the edges: xs.load "
                                   "reads 0 beyond the tensor, xs.store(..., bounds=...) drops them")
    for p in kernel.pipes:
        if placement.crosses(p):
            for f in p.fields:
                if len(f.shape) != 2:
                    raise BackendError(f"pipe '{p.name}' field '{f.name}' has shape {list(f.shape)}; the Hopper "
                                       f"lowering keeps 2-D tiles in shared memory", loc=p.loc or kernel.loc,
                                       objects=(p.name,), fix="use 2-D tiles for pipe fields")


def plan(kernel: ir.KernelIR, placement: Placement, allocation: HopperAllocation,
         options: RenderOptions | None = None) -> RenderPlan:
    """The decisions for rendering ``kernel`` under renderer ``options`` (``tma_store``,
    ``staging_smem_limit``, ``prefetch_tile_scalars``)."""
    options = options if options is not None else RenderOptions()
    _check_supported(kernel, placement)
    bodies = MappingProxyType({a.name: agent_body(kernel, a) for a in placement.agents})
    consts = dict(kernel.constexpr_values)
    uses = tensors.collect(kernel, placement, consts, bodies)
    layouts = infer(kernel, placement, allocation, consts, uses.uses, bodies)
    if allocation.partitions[0].unit != Unit.CONSUMER:
        raise BackendError("the default partition must be a 4-warp consumer warpgroup", loc=kernel.loc,
                           objects=(), fix="give the kernel at least one matrix or vector role")
    stores = staging.plan(placement, allocation, layouts, uses.uses, uses.read, bodies,
                          enabled=options.tma_store is not False,
                          limit=int(staging.STAGING_SMEM_LIMIT if options.staging_smem_limit is None
                                    else options.staging_smem_limit))
    ahead = prefetch.plan_kernel(kernel, placement, allocation, layouts, consts, uses.uses, bodies,
                                 enabled=bool(options.prefetch_tile_scalars))
    return RenderPlan(bodies, MappingProxyType(consts), uses, layouts, stores, ahead)
