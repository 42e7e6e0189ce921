"""TMA-store staging: which ``xs.store`` calls leave through a shared-memory staging tile and a
TMA store (a bulk copy shared -> global) instead of a masked ``gl.store``, decided before
spelling.

A staged store writes its tile into the staging tile of its agent replica, fences, and hands
it to the copy engine (``xs_tma_store``), so the partition moves on while the tile is written;
the renderer spells it with a masked ``gl.store`` fallback for the tiles a boundary cuts and for
tensors that do not suit TMA (the ``<tensor>_tma_ok`` argument).

Applicability, for every ``xs.store`` of every agent program (agents in placement order,
statements in program order; a staging tile is granted to the first store that needs it):

1. The renderer option ``tma_store`` is not ``False``.
2. The agent's partition is a consumer warpgroup (``Unit.CONSUMER``).
3. The store writes a whole 2-D tile into a 2-D tensor (a one-row ``v[None, :]`` store or a
   1-D tile stays a masked store in its value's layout; a tensor of 1, 3 or 4 dimensions takes
   masked stores).
4. The kernel never reads the tensor with ``xs.load`` (bulk copies are not ordered with the
   kernel's own loads of it).
5. Every loop around the store is a tile loop (``xs.tile_range``): the bulk copies of one
   location from two iterations of another loop would not be ordered.
6. The tile has ``TMA_STORE_MIN_ROWS`` to 256 rows, at most 256 columns, and rows of a
   multiple of 16 bytes (a TMA box).
7. Shared memory has room: the pipes' rings (``HopperAllocation.smem_bytes``), the staging
   tiles granted so far and this one (one tile per agent replica) within the limit --
   ``TWO_CTA_SMEM_BYTES`` when two CTAs per SM fit, else the option ``staging_smem_limit``
   (default :data:`STAGING_SMEM_LIMIT`).

A reduce-add (``xs.store(..., reduce="add")``) stages by the same rules and leaves as a TMA bulk
reduce-add (``xs_tma_reduce_add``), its fallback a masked ``gl.atomic_add``. Stores of one agent
with the same tile shape and dtype share one staging tile (rule 7 counts it
once); each (tensor, block shape) gets one store descriptor parameter.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from xsync.dtypes import DType
from xsync.backends.nvidia.alloc import TWO_CTA_SMEM_BYTES, HopperAllocation, two_ctas_fit
from xsync.backends.nvidia.layouts import ModuleLayouts
from xsync.lowering import ir
from xsync.lowering.placement import Placement, Unit

# Shared memory the pipes and the TMA-store staging tiles may use together (of an SM's 227 KB).
# Hand-patched attention kernels on the H200 (benchmarks/results/runs/
# handpatched_20261202_q_ring_tma_store.json): staging that brought d128 to 224 KB slowed s 2k / 4k
# by 3% / 6%; beside d64's 128 KB of K/V and Q rings it gave -0.5% to +9%. At 216 KB the
# two-warpgroup persistent GEMM with bf16 C stages its 256x128 tiles beside three 48 KB ring
# slots (208 KB) and beats the masked stores it had at 200: 4096^3 713 / 703 vs 642, 8192^3 692
# vs 668 TFLOP/s (runs/gemm_*_20261204-2037*.json); no attention kernel the tables launch
# renders differently between 200 and 216 KB.
STAGING_SMEM_LIMIT = 216 * 1024
TMA_STORE_MIN_ROWS = 8
TMA_BOX_MAX = 256                 # rows and columns of one TMA box


@dataclass(frozen=True)
class StagingTile:
    """One shared-memory staging buffer: a [rows, cols] tile per replica of ``agent``."""

    agent: str
    rows: int
    cols: int
    dtype: DType
    replicas: int

    @property
    def name(self) -> str:
        return f"xs_stage_{self.agent}_{self.rows}x{self.cols}_{self.dtype.name}"

    @property
    def bytes(self) -> int:
        return self.replicas * self.rows * self.cols * self.dtype.bytes


@dataclass(frozen=True)
class StagedStore:
    """The decision for one staged ``xs.store``: its staging tile and store descriptor."""

    tensor: str
    tile: StagingTile
    desc: str                     # the store descriptor parameter
    reduce: bool = False          # a TMA bulk reduce-add, not a TMA store


@dataclass(frozen=True)
class StagingPlan:
    tiles: tuple[StagingTile, ...]                          # in the order they were granted
    descs: Mapping[tuple[str, tuple[int, int]], str]        # (tensor, block shape) -> descriptor
    stores: Mapping[int, StagedStore]                       # id of an ir.Store -> its decision

    def of(self, store: ir.Store) -> StagedStore | None:
        """The decision for ``store`` (a statement of the planned programs), None: a masked store."""
        return self.stores.get(id(store))

    def reduces(self) -> bool:
        """Whether some staged store is a reduce-add (``xs_tma_reduce_add``)."""
        return any(d.reduce for d in self.stores.values())

    def stages(self, agent: str) -> bool:
        """Whether ``agent`` issues TMA stores (it waits for them before it ends)."""
        return any(d.tile.agent == agent for d in self.stores.values())

    def descs_of(self, tensor: str) -> list[tuple[tuple[int, int], str]]:
        return [(shape, d) for (tn, shape), d in self.descs.items() if tn == tensor]


class _Planner:
    def __init__(self, placement: Placement, allocation: HopperAllocation, layouts: ModuleLayouts,
                 tensors: dict, read_tensors: frozenset[str], limit: int):
        self.placement = placement
        self.allocation = allocation
        self.layouts = layouts
        self.tensors = tensors
        self.read_tensors = read_tensors
        self.limit = TWO_CTA_SMEM_BYTES if two_ctas_fit(allocation.partitions, allocation.smem_bytes) else limit
        self.tiles: dict[tuple, StagingTile] = {}
        self.descs: dict[tuple, str] = {}
        self.stores: dict[int, StagedStore] = {}
        self.staging_bytes = 0

    def agent(self, agent, stmts):
        consumer = self.allocation.partitions_of(agent.name)[0].unit == Unit.CONSUMER      # rule 2
        if consumer:
            self.walk(agent, self.layouts.agents[agent.name].stores, stmts, ())

    def walk(self, agent, store_types, stmts, loops: tuple[bool, ...]):
        for s in stmts:
            if isinstance(s, ir.Store) and id(s) in store_types:                          # rule 3
                decision = self.store(agent, s, store_types[id(s)].shape, loops)
                if decision is not None:
                    self.stores[id(s)] = decision
            elif isinstance(s, ir.RoleBlock):
                self.walk(agent, store_types, s.body, loops)
            elif isinstance(s, ir.For):
                self.walk(agent, store_types, s.body, loops + (s.tile_loop,))
            elif isinstance(s, ir.If):
                self.walk(agent, store_types, s.body, loops)
                self.walk(agent, store_types, s.orelse or (), loops)

    def store(self, agent, s: ir.Store, shape, loops) -> StagedStore | None:
        tensor = s.tensor
        if self.tensors[tensor].rank != 2:                                          # rule 3
            return None
        dt = self.tensors[tensor].dtype
        rows, cols = shape
        row_bytes = cols * dt.bytes
        # a kernel over a cluster's CTAs (cluster_ctas.py): each CTA stages and stores its rows
        ctas = self.allocation.cta_split.ctas if self.allocation.cta_split is not None else 1
        if (tensor in self.read_tensors or not all(loops)                                   # rules 4, 5
                or rows < TMA_STORE_MIN_ROWS or rows // ctas > TMA_BOX_MAX or cols > TMA_BOX_MAX    # rule 6
                or row_bytes < 16 or row_bytes % 16):
            return None
        key = (agent.name, rows, cols, dt)
        tile = self.tiles.get(key)
        if tile is None:
            tile = StagingTile(agent.name, rows, cols, dt, agent.replicas)
            if self.allocation.smem_bytes + self.staging_bytes + tile.bytes // ctas > self.limit:   # rule 7
                return None
            self.tiles[key] = tile
            self.staging_bytes += tile.bytes // ctas
        desc = self.descs.get((tensor, (rows, cols)))
        if desc is None:
            many = any(tn == tensor for tn, _ in self.descs)
            desc = f"{tensor}_store_desc" + (f"_{rows}x{cols}" if many else "")
            self.descs[(tensor, (rows, cols))] = desc
        return StagedStore(tensor, tile, desc, s.reduce is not None)


def plan(placement: Placement, allocation: HopperAllocation, layouts: ModuleLayouts, tensors: dict,
         read_tensors: frozenset[str], bodies: Mapping[str, tuple], *, enabled: bool = True,
         limit: int = STAGING_SMEM_LIMIT) -> StagingPlan:
    """The staged stores of the agent programs ``bodies`` (the statements ``layouts`` typed).
    ``enabled``: the option ``tma_store`` (rule 1); ``limit``: ``staging_smem_limit`` (rule 7)."""
    planner = _Planner(placement, allocation, layouts, tensors, read_tensors, limit)
    if enabled:
        for agent in placement.agents:
            planner.agent(agent, bodies[agent.name])
    return StagingPlan(tuple(planner.tiles.values()), MappingProxyType(dict(planner.descs)),
                       MappingProxyType(dict(planner.stores)))
