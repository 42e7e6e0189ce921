"""Ascend allocation: cross-core flags (event IDs), sync_block_all modes and the global-memory
workspace rings of the pipes that cross between the cube and the vector cores (and of the
pipes a vector-only kernel keeps in memory on one vector core, ``Link.in_memory``).

* one event ID per cross-core direction (a pipe's full and empty flags, an event's flag, a
  barrier's sync_block_all), from the top of the range the installed CANN documents
  (:func:`ascend_event_budget`), skipping the IDs the HIVM compiler keeps for itself;
* per cross-core pipe a GM workspace ring (:class:`WorkspaceRing`) of at least
  ``ASCEND_MIN_RING_SLOTS`` slots per replica pair, fields aligned to the DMA granule.

Computed from the sync skeleton (replica pairing: rings per pipe); the renderer and the
simulator read :class:`AscendAllocation`.
"""
from __future__ import annotations

from dataclasses import dataclass

from xsync.backends.ascend import memory
from xsync.errors import AllocationError
from xsync.lowering import holding
from xsync.lowering.alloc import Allocation, Row

ASCEND_EVENT_IDS = 16         # hardware flags per AI core (sync_block_* takes 0-15)
ASCEND_DOCUMENTED_IDS = 11    # CANN >= 8.0.RC3 documents IDs 0-10 on A2/A3 (older: 0-15)
# With sync_block_all present the HIVM compiler keeps 14 and 15 for itself (barrier
# lowering, sub-block binding locks); xsync never hands them out then.
ASCEND_COMPILER_IDS = (14, 15)
ASCEND_FLAG_MAX_PENDING = 15
ASCEND_WS_ALIGN = 32          # GM workspace fields start on 32-byte boundaries (DMA granule)
# GM slots per cross-core ring, at least: the HIVM cv-pipelining pass (bishengir-compile
# 1.2.0) never terminates on a cube result stored to a loop-invariant GM address inside a
# loop with a run-time trip count, which a 1-slot ring is. Two physical slots alternate the
# address; the protocol capacity (back-pressure) stays `stages`.
ASCEND_MIN_RING_SLOTS = 2


@dataclass(frozen=True)
class WorkspaceRing:
    """Ascend: where one cross-core pipe's slots live inside a program's GM workspace.

    Byte address of field f of slot s in ring r (rings > 1 only for N -> N pipes: one
    ring per replica pair) = offset + (r * slots + s) * slot_stride + field offset, with
    s = i % slots for the i-th slot (slots = max(stages, ASCEND_MIN_RING_SLOTS)).
    """

    pipe: str
    offset: int                                   # bytes from the program's workspace base
    rings: int
    stages: int                                   # protocol capacity (free slots at start)
    slot_stride: int                              # bytes, a multiple of ASCEND_WS_ALIGN
    fields: tuple[tuple[str, int], ...]           # (field name, byte offset inside a slot)
    slots: int = 0                                # GM slots per ring (>= stages); slot = i % slots
    interleave: int = 1                           # > 1: rings interleaved, slot s of ring r at s * rings + r

    @property
    def bytes(self) -> int:
        return self.rings * self.slots * self.slot_stride


@dataclass(frozen=True)
class BlockBarrier:
    """ascend: a user barrier's ``sync_block_all(mode, flag)``."""

    obj: str
    mode: str              # "all" | "all_cube" | "all_vector"
    flag: int


@dataclass(frozen=True)
class AscendAllocation(Allocation):
    """The Ascend resources: flags, barrier modes, workspace rings."""

    event_ids: tuple[tuple[str, int], ...] = ()       # "pipe:full" -> flag
    workspace_bytes: int = 0                          # per program
    workspace: tuple[WorkspaceRing, ...] = ()         # GM ring layout per pipe
    block_barriers: tuple[BlockBarrier, ...] = ()
    memory: memory.MemoryPlan | None = None           # UB / L1 / L0C need per core (memory.py)

    def block_barrier(self, obj: str) -> BlockBarrier:
        return next(b for b in self.block_barriers if b.obj == obj)


def ascend_event_budget(cap: int | None = None) -> int:
    """IDs 0 .. budget-1 are usable: ``cap`` (LowerOptions.event_ids, XSYNC_ASCEND_EVENT_IDS),
    else the range documented by the installed CANN (0-15 before 8.0.RC3, 0-10 from then on;
    without CANN: 0-10)."""
    if cap is not None:
        return cap
    return ASCEND_EVENT_IDS if _cann_documents_16_ids() else ASCEND_DOCUMENTED_IDS


def _cann_documents_16_ids() -> bool:
    """True only for an installed CANN older than 8.0.RC3 (which documents IDs 0-15)."""
    import glob
    import re

    for info in glob.glob("/usr/local/Ascend/ascend-toolkit/latest/*/ascend_toolkit_install.info"):
        try:
            text = open(info).read()
        except OSError:
            continue
        m = re.search(r"version=(\d+)\.(\d+)\.(?:RC(\d+)|(\d+))", text)
        if m:
            major, minor = int(m.group(1)), int(m.group(2))
            rc = int(m.group(3)) if m.group(3) else 99
            return (major, minor, rc) < (8, 0, 3)
    return False


def ascend_event_pool(has_barriers: bool, cap: int | None = None) -> list[int]:
    """Usable event IDs, highest first: the compiler's own allocation (when anything is
    injected) starts at 0, so xsync allocates from the top of the documented range."""
    budget = ascend_event_budget(cap)
    reserved = ASCEND_COMPILER_IDS if has_barriers else ()
    return [i for i in range(budget - 1, -1, -1) if i not in reserved]


def allocate(kernel, placement, skel, options=None) -> AscendAllocation:
    rows, ids, users, wanted = [], [], [], []
    cap = options.event_ids if options is not None else None
    pool = ascend_event_pool(bool(kernel.barriers), cap)

    def take(key, obj, direction):
        wanted.append((obj, direction))
        if len(ids) >= len(pool):
            return None
        ids.append((key, pool[len(ids)]))
        users.append((obj, direction))
        return ids[-1][1]

    def core(role):
        return placement.agent_of(role).unit

    workspace, rings = 0, []
    for a in placement.agents:
        rows.append(Row(a.name, "core", f"{a.replicas} x {a.hardware}", f"roles: {', '.join(a.roles)}"))
    held = holding.most_held(kernel)
    for p in kernel.pipes:
        link = skel.link(p.name)
        if not link.crosses and not link.in_memory:
            rows.append(Row(p.name, "same core", "no flag", "program order on one core"))
            continue
        if link.in_memory:
            rows.append(Row(p.name, "same core", "no flag", "a GM ring written and read in program order"))
            row = holding.counter_row(kernel, link, f"xs_{p.name}_acq (producer), xs_{p.name}_got "
                                      f"(consumer); program order on one core", held)
            rows += [row] if row else []
        else:
            if p.stages > ASCEND_FLAG_MAX_PENDING:
                raise AllocationError(
                    f"pipe '{p.name}' has stages={p.stages}: its producer could push {p.stages} pending "
                    f"sets on one flag, and an Ascend flag counts at most {ASCEND_FLAG_MAX_PENDING}",
                    loc=p.loc, objects=(p.name,), fix=f"use stages <= {ASCEND_FLAG_MAX_PENDING}")
            s, d = core(p.src), core(p.dst)
            full = take(f"{p.name}:full", p, f"{s}->{d}")
            empty = take(f"{p.name}:empty", p, f"{d}->{s}")
            rows.append(Row(p.name, "full flag", f"flag {full} ({s} -> {d})", "set after the slot is written"))
            rows.append(Row(p.name, "empty flag", f"flag {empty} ({d} -> {s})",
                            f"set after the slot is read; producer pre-counts {p.lane_stages} free slots"))
            row = holding.counter_row(kernel, link, f"xs_{p.name}_acq (producer), xs_{p.name}_got "
                                      f"(consumer); the flags count commits and releases", held)
            rows += [row] if row else []
        if p.fields:
            ring = _ascend_ring(p, skel.link(p.name), workspace)
            rings.append(ring)
            per = f"{ring.rings} ring(s) x " if ring.rings > 1 else ""
            per = f"{ring.rings} interleaved ring(s) x " if ring.interleave > 1 else per
            layout = ", ".join(f"{f.name}{list(f.shape)} {f.dtype.name} @+{off}"
                               for f, (_, off) in zip(p.fields, ring.fields))
            extra = (f" ({ring.slots} GM slots for stages={p.lane_stages}: the HIVM compiler needs an "
                     f"alternating address)" if ring.slots > p.lane_stages else "")
            where = (f"slot = i % {ring.slots}" if ring.interleave == 1 else
                     f"ring r's slot i at (i % {ring.slots}) * {ring.rings} + r")
            rows.append(Row(p.name, "GM workspace ring",
                            f"{per}{ring.slots} x {ring.slot_stride} B at offset {workspace} per program",
                            f"{where}; {layout}{extra}"))
            workspace += ring.bytes
    for e in kernel.events:
        if not placement.crosses(e):
            rows.append(Row(e.name, "same core", "no flag", "program order on one core"))
            continue
        s, d = core(e.src), core(e.dst)
        f = take(e.name, e, f"{s}->{d}")
        rows.append(Row(e.name, "event flag", f"flag {f} ({s} -> {d})", "k-th wait after k-th set"))
    blocks = []
    for m in skel.barriers:
        b = kernel.sync_object(m.obj)
        cores = {core(r) for r in m.member_roles}
        mode = "all" if len(cores) == 2 else f"all_{cores.pop()}"
        f = take(b.name, b, mode)
        blocks.append(BlockBarrier(b.name, mode, f))
        rows.append(Row(b.name, "sync_block_all", f"mode {mode}, flag {f}",
                        "needs every launched core resident (grid <= core count)"))
    if len(wanted) > len(pool):
        budget = ascend_event_budget(cap)
        listing = ", ".join(f"{o.name} ({d})" for o, d in wanted)
        reserved = (f"; IDs {ASCEND_COMPILER_IDS[0]} and {ASCEND_COMPILER_IDS[1]} belong to the "
                    f"compiler when sync_block_all is used") if kernel.barriers and budget > 14 else ""
        raise AllocationError(
            f"the kernel needs {len(wanted)} cross-core event IDs; the Ascend budget is "
            f"{len(pool)} (IDs 0-{budget - 1}{reserved})",
            loc=wanted[len(pool)][0].loc, objects=tuple(dict.fromkeys(o.name for o, _ in wanted)),
            fix=("merge pipes that travel together into one pipe with several fields, keep roles "
                 "that talk a lot on one core, or raise XSYNC_ASCEND_EVENT_IDS (at most 16, for "
                 "CANN versions that document IDs 0-15)"),
            details=f"directions in allocation order: {listing}")
    if workspace:
        rows.append(Row("workspace", "GM per program", f"{workspace} B",
                        "host allocates programs x this; base = workspace + program_index * size"))
    # local memories: not in the table (the table is part of the rendered source)
    local = memory.check(kernel, placement)
    return AscendAllocation("ascend", tuple(rows), event_ids=tuple(ids), workspace_bytes=workspace,
                            workspace=tuple(rings), block_barriers=tuple(blocks), memory=local)


def _ascend_ring(p, link, offset) -> WorkspaceRing:
    """Layout of one pipe's ring: fields packed in declaration order, each aligned; one ring
    per channel (N -> N pipes: one per replica pair)."""
    fields, at = [], 0
    for f in p.fields:
        fields.append((f.name, at))
        at += -(-f.bytes // ASCEND_WS_ALIGN) * ASCEND_WS_ALIGN
    return WorkspaceRing(p.name, offset, link.rings, p.lane_stages, at, tuple(fields),
                         slots=max(p.lane_stages, ASCEND_MIN_RING_SLOTS), interleave=link.interleave)
