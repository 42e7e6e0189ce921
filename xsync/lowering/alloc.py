"""Allocation: the hardware resources behind each sync object, computed by the target.

Every target has its own allocation module (``xsync.backends.<b>.alloc``; the target's
``Target.allocate``) returning a typed record, a subclass of :class:`Allocation`:

* nvidia (:class:`xsync.backends.nvidia.alloc.HopperAllocation`): partitions with their
  warps and register budgets, mbarrier groups (slot = i % stages, parity =
  (i // stages) & 1) with arrive counts, named-barrier IDs above the compiler's own.
* ascend (:class:`xsync.backends.ascend.alloc.AscendAllocation`): one event ID (flag) per
  cross-core direction from the documented budget, the sync_block_all mode, and the
  global-memory workspace ring of each pipe.
* cpu: semaphores and slot buffers (display rows only).

The user never writes any of these; ``python -m xsync check`` prints the table.

Everything is computed from the sync skeleton (``xsync.lowering.protocol``): the replica
pairing of each pipe and event (how many rings, how many arrivals complete a phase) and
the instances that meet at each barrier. Renderers read the typed records; ``rows`` are
for display only.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from xsync.lowering import ir
from xsync.lowering.placement import Placement
from xsync.lowering.protocol import Skeleton, derive


@dataclass(frozen=True)
class Row:
    obj: str          # pipe / event / barrier / partition name
    what: str         # "full barriers", "event ID", ...
    resource: str     # the concrete resource ("mbarrier[3] count=1", "flag 4")
    rule: str = ""    # how it is used at run time (phase / slot formula)


@dataclass(frozen=True)
class Allocation:
    """What every target's allocation has: the display rows and the skeleton it was
    computed from (the targets' subclasses add their typed resources)."""

    backend: str
    rows: tuple[Row, ...]
    skeleton: Skeleton | None = field(default=None, compare=False)
    # the rows of a cluster's multicast fields where the target decides per kernel (None: the
    # Target's multicast / multicast_missing text)
    multicast_rows: tuple[Row, ...] | None = None

    def table(self) -> str:
        head = ("object", "what", "resource", "rule")
        rows = [head] + [(r.obj, r.what, r.resource, r.rule) for r in self.rows]
        widths = [max(len(r[c]) for r in rows) for c in range(3)]
        lines = [f"allocation for {self.backend}:"]
        for k, r in enumerate(rows):
            lines.append("  " + "  ".join(r[c].ljust(widths[c]) for c in range(3)) + "  " + r[3])
            if k == 0:
                lines.append("  " + "  ".join("-" * w for w in widths) + "  " + "-" * 4)
        return "\n".join(lines)


def allocate(kernel: ir.KernelIR, placement: Placement, skeleton: Skeleton | None = None,
             options=None) -> Allocation:
    """The target's allocation of ``kernel`` (``placement.target.allocate``), carrying the
    skeleton it read; ``options``: the backend's ``LowerOptions`` (register budgets, event-ID
    cap), their defaults when None."""
    skel = skeleton or derive(kernel, placement)
    alloc = placement.target.allocate(kernel, placement, skel, options)
    notes = tuple(Row(n.role, "placement", n.placement, n.text) for n in placement.notes)
    return dataclasses.replace(alloc, skeleton=skel, rows=alloc.rows + notes + cluster_rows(kernel, placement.target,
                                                                                         alloc.multicast_rows))


OWN_COPY = "each program loads its own copy"     # a multicast field where the target has no multicast


def cluster_rows(kernel: ir.KernelIR, target, decided: tuple[Row, ...] | None = None) -> tuple[Row, ...]:
    """What the target does with the kernel's cluster and its multicast fields (``decided``: the
    target's own rows for them)."""
    if kernel.cluster == 1:
        return ()
    rows = [Row("cluster", "programs", f"{kernel.cluster} consecutive programs of axis 0",
                "cluster_id = program_id(0) // n, cluster_rank = program_id(0) % n; tiles dealt to clusters")]
    if decided is not None:
        return tuple(rows) + decided
    return tuple(rows) + multicast_field_rows(kernel, target.multicast or OWN_COPY,
                                              target.multicast or target.multicast_missing)


def multicast_field_rows(kernel: ir.KernelIR, how: str, why: str) -> tuple[Row, ...]:
    """One row per multicast field of the kernel: what the target does with it, and why."""
    return tuple(Row(p.name, f"multicast {f.name}", how, why) for p in kernel.pipes for f in p.fields if f.multicast)
