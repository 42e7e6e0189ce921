"""Allocation: the hardware resources behind each sync object, per backend.

* nvidia: mbarrier arrays (slot = i % stages, parity = (i // stages) & 1), arrive
  counts, named-barrier IDs above the compiler's own, partitions and warps.
* ascend: one event ID (flag) per cross-core direction from a budget of 16 (or a lower
  cap), the sync_block_all mode, and the global-memory workspace ring of each pipe.
* cpu: semaphores and slot buffers.

The user never writes any of these; ``python -m xsync check`` prints the table.

Everything here is computed from the sync skeleton (``xsync.lowering.protocol``): the
replica pairing of each pipe and event (how many rings, how many arrivals complete a
phase) and the instances that meet at each barrier. Renderers read the typed records
(:class:`MBarrierGroup`, :class:`Partition`, :class:`NamedBarrier`, :class:`BlockBarrier`,
:class:`WorkspaceRing`); ``rows`` are for display only.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from xsync import config
from xsync.errors import AllocationError
from xsync.lowering import ir
from xsync.lowering.placement import Placement
from xsync.lowering.protocol import Skeleton, derive

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
HOPPER_SMEM_BYTES = 227 * 1024
# Gluon 3.6 warp_specialize uses named barrier 0 (default partition), 1 (CTA-wide at
# partition entry/exit) and 2 + i for worker partition i; hardware has 16.
HOPPER_NAMED_BARRIERS = 16
WARPS = {"producer": 1, "consumer": 4}


@dataclass(frozen=True)
class Row:
    obj: str          # pipe / event / barrier / partition name
    what: str         # "full barriers", "event ID", ...
    resource: str     # the concrete resource ("mbarrier[3] count=1", "flag 4")
    rule: str = ""    # how it is used at run time (phase / slot formula)


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

    @property
    def bytes(self) -> int:
        return self.rings * self.slots * self.slot_stride


@dataclass(frozen=True)
class MBarrierGroup:
    """nvidia: the mbarriers behind one side of a cross-partition pipe or event.

    ``barriers`` = rings x stages (pipes) or rings (events); ``arrive_count`` arrivals
    complete a phase (1 producer per full barrier; every consumer of a broadcast per empty
    barrier; every source of a gather per event barrier)."""

    obj: str
    side: str              # "full" | "empty" | "event"
    barriers: int
    arrive_count: int
    rings: int
    tma_bytes: int = 0     # full barriers of a TMA pipe: expect-tx bytes


@dataclass(frozen=True)
class Partition:
    """nvidia: one warp-specialized partition = one skeleton instance."""

    index: int             # 0 = the default partition
    agent: str
    replica: int
    replicas: int
    warps: int
    instance: int          # skeleton instance index

    @property
    def label(self) -> str:
        return self.agent if self.replicas == 1 else f"{self.agent}[{self.replica}]"


@dataclass(frozen=True)
class NamedBarrier:
    """nvidia: a user barrier's named barrier; every member partition counts once."""

    obj: str
    id: int
    threads: int
    partitions: tuple[int, ...]


@dataclass(frozen=True)
class BlockBarrier:
    """ascend: a user barrier's ``sync_block_all(mode, flag)``."""

    obj: str
    mode: str              # "all" | "all_cube" | "all_vector"
    flag: int


@dataclass(frozen=True)
class Allocation:
    backend: str
    rows: tuple[Row, ...]
    # machine-readable pieces renderers use
    event_ids: tuple[tuple[str, int], ...] = ()       # ascend: "pipe:full" -> flag
    barrier_ids: tuple[tuple[str, int], ...] = ()     # nvidia: barrier -> named barrier id
    partitions: tuple[Partition, ...] = ()            # nvidia: default partition first
    workspace_bytes: int = 0                          # ascend: per program
    workspace: tuple["WorkspaceRing", ...] = ()       # ascend: GM ring layout per pipe
    mbarriers: tuple[MBarrierGroup, ...] = ()         # nvidia
    named_barriers: tuple[NamedBarrier, ...] = ()     # nvidia
    block_barriers: tuple[BlockBarrier, ...] = ()     # ascend
    skeleton: Skeleton | None = field(default=None, compare=False)

    def barrier_id(self, name: str) -> int:
        return dict(self.barrier_ids)[name]

    def mbarrier(self, obj: str, side: str) -> MBarrierGroup:
        return next(g for g in self.mbarriers if g.obj == obj and g.side == side)

    def named_barrier(self, obj: str) -> NamedBarrier:
        return next(b for b in self.named_barriers if b.obj == obj)

    def block_barrier(self, obj: str) -> BlockBarrier:
        return next(b for b in self.block_barriers if b.obj == obj)

    def partitions_of(self, agent: str) -> tuple[Partition, ...]:
        return tuple(p for p in self.partitions if p.agent == agent)

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


def allocate(kernel: ir.KernelIR, placement: Placement, skeleton: Skeleton | None = None) -> Allocation:
    skel = skeleton or derive(kernel, placement)
    alloc = {"cpu": _cpu, "nvidia": _nvidia, "ascend": _ascend}[placement.backend](kernel, placement, skel)
    return Allocation(**{**{f: getattr(alloc, f) for f in alloc.__dataclass_fields__}, "skeleton": skel})


# ---------------------------------------------------------------- cpu
def _cpu(kernel, placement, skel):
    rows = []
    for a in placement.agents:
        rows.append(Row(a.name, "thread(s)", f"{a.replicas} x {a.hardware}", f"roles: {', '.join(a.roles)}"))
    for link in skel.links:
        rings = f"{link.rings} rings x " if link.rings > 1 else ""
        if link.kind == "pipe":
            rows.append(Row(link.obj, "pipe", f"{rings}{link.stages} slot(s), 2 counting semaphores",
                            f"slot = i % stages; {link.pairing}"))
        else:
            rows.append(Row(link.obj, "event", f"{rings}counting semaphore",
                            f"k-th wait after k-th signal; {link.pairing}"))
    for b in skel.barriers:
        rows.append(Row(b.obj, "barrier", f"barrier over {b.arrivals} thread(s)",
                        f"members: {', '.join(b.member_roles)}"))
    return Allocation("cpu", tuple(rows))


# ---------------------------------------------------------------- nvidia
def _nvidia(kernel, placement, skel):
    rows, partitions = [], []
    # Consumers first: the first consumer warpgroup is the default partition.
    ordered = sorted(skel.instances, key=lambda i: i.unit == "producer")
    for inst in ordered:
        warps = WARPS.get(inst.unit, WARPS["consumer"])
        partitions.append(Partition(len(partitions), inst.agent, inst.replica, inst.replicas,
                                    warps, inst.index))
    for part in partitions:
        kind = "default partition" if part.index == 0 else f"worker partition {part.index}"
        roles = ", ".join(skel.instances[part.instance].roles)
        rows.append(Row(part.label, kind, f"{part.warps} warp(s)", f"roles: {roles}"))
    smem, groups = 0, []
    for link in skel.links:
        if link.kind != "pipe":
            continue
        p = kernel.sync_object(link.obj)
        if not link.crosses:
            rows.append(Row(p.name, "register hand-off", "no barrier",
                            f"'{p.src}' and '{p.dst}' share {placement.agent_of(p.src).name}"))
            continue
        tma_bytes = p.slot_bytes if is_tma_pipe(kernel, p) else 0
        full = MBarrierGroup(p.name, "full", p.stages * link.rings, 1, link.rings, tma_bytes)
        empty = MBarrierGroup(p.name, "empty", p.stages * link.rings, link.consumer_arrivals, link.rings)
        groups += [full, empty]
        tma = f", expect {p.slot_bytes} B (TMA)" if tma_bytes else ""
        pairs = f" ({link.rings} rings: {link.pairing})" if link.rings > 1 else ""
        rows.append(Row(p.name, "full barriers", f"mbarrier[{full.barriers}] count=1{tma}",
                        f"slot = i % stages; consumer waits parity (i // stages) & 1{pairs}"))
        rows.append(Row(p.name, "empty barriers", f"mbarrier[{empty.barriers}] count={empty.arrive_count}",
                        "producer waits parity ((i // stages) & 1) ^ 1 (fresh barrier passes)"))
        if p.fields:
            rows.append(Row(p.name, "shared-memory ring",
                            f"{link.rings * p.stages} x {p.slot_bytes} B = "
                            f"{link.rings * p.stages * p.slot_bytes} B",
                            ", ".join(f"{f.name}{list(f.shape)} {f.dtype.name}" for f in p.fields)))
        smem += link.rings * p.stages * p.slot_bytes
    if smem > HOPPER_SMEM_BYTES:
        big = [kernel.sync_object(x.obj) for x in skel.links if x.kind == "pipe" and x.crosses]
        raise AllocationError(
            f"pipes need {smem} B of shared memory; a Hopper SM has {HOPPER_SMEM_BYTES} B",
            loc=big[0].loc if big else kernel.loc,
            objects=tuple(f"{p.name} (stages={p.stages}, {p.slot_bytes} B/slot)" for p in big),
            fix="lower stages or tile sizes")
    for link in skel.links:
        if link.kind != "event":
            continue
        if not link.crosses:
            rows.append(Row(link.obj, "MMA/program order", "no barrier",
                            "same partition: program order (warpgroup_mma_wait orders async MMAs)"))
            continue
        g = MBarrierGroup(link.obj, "event", link.rings, link.producer_arrivals, link.rings)
        groups.append(g)
        pairs = f" ({link.rings} rings: {link.pairing})" if link.rings > 1 else ""
        rows.append(Row(link.obj, "event barrier", f"mbarrier count={g.arrive_count}",
                        f"k-th wait waits parity k & 1{pairs}"))
    barrier_ids, named = [], []
    # IDs 0, 1 and 2 + i (worker partition i, padding partitions included) belong to the
    # compiler; allocate user barriers from the top (15) down so they never meet.
    reserved = 2 + _padded_workers(partitions)
    for k, b in enumerate(skel.barriers):
        bid = HOPPER_NAMED_BARRIERS - 1 - k
        loc = kernel.sync_object(b.obj).loc
        if bid < reserved:
            raise AllocationError(
                f"barrier '{b.obj}' needs named barrier {bid}, but IDs 0..{reserved - 1} belong to "
                f"the compiler ({len(partitions)} partitions) and Hopper has {HOPPER_NAMED_BARRIERS}",
                loc=loc, objects=(b.obj,),
                fix="use fewer group barriers (merge groups with the same members)")
        # every member partition counts once, whatever member roles it runs
        members = tuple(p.index for p in partitions if p.instance in b.members)
        threads = 32 * sum(partitions[i].warps for i in members)
        barrier_ids.append((b.obj, bid))
        named.append(NamedBarrier(b.obj, bid, threads, members))
        rows.append(Row(b.obj, "named barrier", f"bar id {bid}, {threads} threads",
                        "sync = bar.sync; arrive = bar.arrive"))
    # Scheduler barriers of the renderer's pingpong rewrite (render.pingpong_schedule): a
    # consecutive pair per agent with two consumer-warpgroup replicas and a loop with an
    # mma, taken below the user barriers; skipped when XSYNC_NV_PINGPONG=0 or no pair is free.
    top = HOPPER_NAMED_BARRIERS - 1 - len(kernel.barriers)
    for a in sorted(placement.agents, key=lambda a: a.unit == "producer"):
        if not _pingpong_candidate(kernel, a) or config.current().nv_pingpong == "0":
            continue
        lo = top - 1
        if lo < reserved:
            continue
        top -= 2
        barrier_ids.append((f"{a.name}:pingpong", lo))
        threads = 32 * sum(p.warps for p in partitions if p.agent == a.name)
        rows.append(Row(a.name, "scheduler barriers", f"bar ids {lo}, {lo + 1}, {threads} threads",
                        f"pingpong (renderer option): replica r bar.sync {lo} + r before its wgmma, "
                        f"bar.arrive {lo} + 1 - r after"))
    return Allocation("nvidia", tuple(rows), barrier_ids=tuple(barrier_ids),
                      partitions=tuple(partitions), mbarriers=tuple(groups),
                      named_barriers=tuple(named))


def _pingpong_candidate(kernel, agent) -> bool:
    """Two consumer-warpgroup replicas of one agent and a loop whose body has an mma of
    one of its roles (the renderer checks the rest: replica-uniform trip counts)."""
    if agent.replicas != 2 or agent.unit == "producer":
        return False

    def has_mma(stmts, mine, in_loop):
        for s in stmts:
            if isinstance(s, ir.RoleBlock):
                if has_mma(s.body, s.role in agent.roles, in_loop):
                    return True
            elif isinstance(s, ir.For):
                if has_mma(s.body, mine, True):
                    return True
            elif isinstance(s, ir.If):
                if has_mma(s.body, mine, in_loop) or has_mma(s.orelse, mine, in_loop):
                    return True
            elif mine and in_loop and isinstance(s, (ir.Assign, ir.SlotWrite)) \
                    and any(c.op == "mma" for c in ir.expr_calls(s.value)):
                return True
        return False

    return has_mma(kernel.body, False, False)


def is_tma_pipe(kernel: ir.KernelIR, pipe: ir.Pipe) -> bool:
    """A pipe whose producer fills every field straight from global memory (xs.load):
    on Hopper the copy engine completes the slot (expect-tx) instead of an arrive."""
    writes = [s for s in ir.walk(kernel.body) if isinstance(s, ir.SlotWrite) and s.pipe == pipe.name]
    return bool(writes) and all(isinstance(w.value, ir.Call) and w.value.op == "load" for w in writes)


def _padded_workers(partitions) -> int:
    """Worker partitions after Gluon pads worker warps up to a multiple of 4."""
    workers = [p.warps for p in partitions[1:]]
    return len(workers) + (-sum(workers) % 4)


# ---------------------------------------------------------------- ascend
def ascend_event_budget() -> int:
    """IDs 0 .. budget-1 are usable: XSYNC_ASCEND_EVENT_IDS, else the range documented by
    the installed CANN (0-15 before 8.0.RC3, 0-10 from then on; without CANN: 0-10)."""
    cap = config.current().ascend_event_ids
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


def ascend_event_pool(has_barriers: bool) -> list[int]:
    """Usable event IDs, highest first: the compiler's own allocation (when anything is
    injected) starts at 0, so xsync allocates from the top of the documented range."""
    budget = ascend_event_budget()
    reserved = ASCEND_COMPILER_IDS if has_barriers else ()
    return [i for i in range(budget - 1, -1, -1) if i not in reserved]


def _ascend(kernel, placement, skel):
    rows, ids, users, wanted = [], [], [], []
    pool = ascend_event_pool(bool(kernel.barriers))

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
    for p in kernel.pipes:
        if not skel.link(p.name).crosses:
            rows.append(Row(p.name, "same core", "no flag", "program order on one core"))
            continue
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
                        f"set after the slot is read; producer pre-counts {p.stages} free slots"))
        if p.fields:
            ring = _ascend_ring(p, skel.link(p.name), workspace)
            rings.append(ring)
            per = f"{ring.rings} ring(s) x " if ring.rings > 1 else ""
            layout = ", ".join(f"{f.name}{list(f.shape)} {f.dtype.name} @+{off}"
                               for f, (_, off) in zip(p.fields, ring.fields))
            extra = (f" ({ring.slots} GM slots for stages={p.stages}: the HIVM compiler needs an "
                     f"alternating address)" if ring.slots > p.stages else "")
            rows.append(Row(p.name, "GM workspace ring",
                            f"{per}{ring.slots} x {ring.slot_stride} B at offset {workspace} per program",
                            f"slot = i % {ring.slots}; {layout}{extra}"))
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
        budget = ascend_event_budget()
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
    return Allocation("ascend", tuple(rows), event_ids=tuple(ids), workspace_bytes=workspace,
                      workspace=tuple(rings), block_barriers=tuple(blocks))


def _ascend_ring(p, link, offset) -> WorkspaceRing:
    """Layout of one pipe's ring: fields packed in declaration order, each aligned; one ring
    per channel (N -> N pipes: one per replica pair)."""
    fields, at = [], 0
    for f in p.fields:
        fields.append((f.name, at))
        at += -(-f.bytes // ASCEND_WS_ALIGN) * ASCEND_WS_ALIGN
    return WorkspaceRing(p.name, offset, link.rings, p.stages, at, tuple(fields),
                         slots=max(p.stages, ASCEND_MIN_RING_SLOTS))
