"""Hopper allocation: partitions, register budgets, mbarriers and named barriers.

* Partitions: one ``gl.warp_specialize`` partition per skeleton instance, consumers first
  (the first consumer warpgroup is the default partition); a producer is 1 warp, a consumer
  warpgroup 4 (by the agent's :class:`~xsync.lowering.placement.Unit`, never its name).
* Register budgets (``setmaxnreg`` per worker partition, the launch's ``maxnreg``): the
  ``nv_producer_regs`` / ``nv_consumer_regs`` / ``nv_maxnreg`` options where set; else two
  CTAs per SM when one consumer warpgroup, one producer warp and half the shared memory
  suffice (maxnreg 128: 24 producer / 232 consumer registers; H200, GEMM 8192^3, STAGES=3:
  0.67x -> 0.85x of torch.matmul in one run); else 40 per producer warpgroup and the rest of
  the 512 per thread-slot split evenly between consumer warpgroups, at most 232 -- or, where
  that leaves the consumers short of 232 (three or four consumer warpgroups), 32 per producer
  warpgroup, as FA3 gives its 3-warpgroup d64 kernel: three consumers get 160 instead of 152,
  which keeps attention d64's S, P and O (and the next S in flight) out of local memory
  (H200, d64 non-causal 8k: 485 vs 405 TFLOP/s at 152, benchmarks/results/runs/flash_attn_ab_20261203_r3.json).
* mbarriers: per cross-partition pipe a full and an empty group of rings x stages barriers
  (slot = i % stages, parity = (i // stages) & 1; a TMA pipe's full barrier expects the slot's
  bytes), per cross-partition event one barrier per ring; arrive counts from the skeleton's
  channels.
* Named barriers: every barrier of the kernel -- the user's, and those a schedule pass
  declared (ping-pong turns) -- gets an ID from 15 down, above the compiler's own (0, 1 and
  2 + i for worker partition i, padding partitions included); every member partition counts
  once in the thread count. A pass that does not fire declares nothing, so nothing is
  reserved for it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from xsync.errors import AllocationError
from xsync.lowering import holding, ir
from xsync.backends.nvidia import cluster_ctas
from xsync.lowering.alloc import Allocation, Row
from xsync.lowering.placement import Unit

HOPPER_SMEM_BYTES = 227 * 1024
# Gluon 3.6 warp_specialize uses named barrier 0 (default partition), 1 (CTA-wide at
# partition entry/exit) and 2 + i for worker partition i; hardware has 16.
HOPPER_NAMED_BARRIERS = 16
WARPS = {Unit.PRODUCER: 1, Unit.CONSUMER: 4}
TWO_CTA_SMEM_BYTES = 113 * 1024   # half an SM's 227 KB, less room for barriers
REGISTER_FILE = 512               # registers per thread slot a CTA's warpgroups share
MAX_CONSUMER_REGS = 232
DEFAULT_PRODUCER_REGS = 40
TIGHT_PRODUCER_REGS = 32          # where the consumers would fall short of MAX_CONSUMER_REGS
MAX_CTA_WARPS = 32                # 1024 threads per CTA


@dataclass(frozen=True)
class MBarrierGroup:
    """The mbarriers behind one side of a cross-partition pipe or event.

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
    """One warp-specialized partition = one skeleton instance."""

    index: int             # 0 = the default partition
    agent: str
    replica: int
    replicas: int
    warps: int
    instance: int          # skeleton instance index
    unit: Unit = Unit.CONSUMER
    regs: int = 0          # setmaxnreg of a worker partition (the default partition: informational)

    @property
    def label(self) -> str:
        return self.agent if self.replicas == 1 else f"{self.agent}[{self.replica}]"


@dataclass(frozen=True)
class NamedBarrier:
    """A barrier's named barrier; every member partition counts once."""

    obj: str
    id: int
    threads: int
    partitions: tuple[int, ...]
    made_by: str = ""      # the schedule pass that declared the barrier ("" = the kernel)


@dataclass(frozen=True)
class HopperAllocation(Allocation):
    partitions: tuple[Partition, ...] = ()            # default partition first
    mbarriers: tuple[MBarrierGroup, ...] = ()
    named_barriers: tuple[NamedBarrier, ...] = ()
    maxnreg: int | None = None                        # the launch option, when set
    smem_bytes: int = 0                               # the pipes' shared-memory rings
    # a cluster kernel as one program over the cluster's CTAs, or why not (cluster_ctas.py)
    cta_split: cluster_ctas.CtaSplit | None = None

    @property
    def barrier_ids(self) -> tuple[tuple[str, int], ...]:
        return tuple((b.obj, b.id) for b in self.named_barriers)

    def barrier_id(self, name: str) -> int:
        return self.named_barrier(name).id

    def mbarrier(self, obj: str, side: str) -> MBarrierGroup:
        return next(g for g in self.mbarriers if g.obj == obj and g.side == side)

    def named_barrier(self, obj: str) -> NamedBarrier:
        return next(b for b in self.named_barriers if b.obj == obj)

    def partitions_of(self, agent: str) -> tuple[Partition, ...]:
        return tuple(p for p in self.partitions if p.agent == agent)


def is_tma_pipe(kernel: ir.KernelIR, pipe: ir.Pipe) -> bool:
    """A pipe whose producer fills every field straight from global memory (xs.load):
    on Hopper the copy engine completes the slot (expect-tx) instead of an arrive."""
    writes = [s for s in ir.walk(kernel.all_statements()) if isinstance(s, ir.SlotWrite) and s.pipe == pipe.name]
    return bool(writes) and all(isinstance(w.value, ir.Call) and w.value.op is ir.TileOp.LOAD
                                and _two_dims(w.value) for w in writes)


def _two_dims(load: ir.Call) -> bool:
    """An xs.load of a 2-D tile from a 2-D tensor: what a TMA copy into a slot takes (a tensor
    of another rank fills its slot with a masked pointer load and an arrive)."""
    offsets, shape = load.args[1], load.args[2]
    return (isinstance(offsets, ir.TupleExpr) and len(offsets.items) == 2
            and isinstance(shape, ir.TupleExpr) and len(shape.items) == 2)


def allocate(kernel, placement, skel, options=None) -> HopperAllocation:
    rows, partitions = [], []
    # Consumers first: the first consumer warpgroup is the default partition.
    ordered = sorted(skel.instances, key=lambda i: i.unit == Unit.PRODUCER)
    for inst in ordered:
        partitions.append(Partition(len(partitions), inst.agent, inst.replica, inst.replicas,
                                    WARPS[inst.unit], inst.index, inst.unit))
    warps = sum(p.warps for p in partitions) + (-sum(p.warps for p in partitions[1:]) % 4)
    if warps > MAX_CTA_WARPS:
        raise AllocationError(
            f"the kernel's partitions need {warps} warps ({32 * warps} threads); a Hopper CTA runs "
            f"at most {MAX_CTA_WARPS} ({32 * MAX_CTA_WARPS} threads)", loc=kernel.loc,
            objects=tuple(f"{p.label} ({p.warps} warp(s))" for p in partitions),
            fix="use fewer role replicas" + _own_hint(kernel, "(it would share a warpgroup)"))
    smem, groups = 0, []
    pipe_rows = []
    held = holding.most_held(kernel)
    for link in skel.links:
        if link.kind != "pipe":
            continue
        p = kernel.sync_object(link.obj)
        if not link.crosses:
            pipe_rows.append(Row(p.name, "register hand-off", "no barrier",
                                 f"'{p.src}' and '{p.dst}' share {placement.agent_of(p.src).name}"))
            continue
        tma_bytes = p.slot_bytes if is_tma_pipe(kernel, p) else 0
        slots = ring_slots(link)
        full = MBarrierGroup(p.name, "full", slots, 1, link.rings, tma_bytes)
        empty = MBarrierGroup(p.name, "empty", slots, link.consumer_arrivals, link.rings)
        groups += [full, empty]
        tma = f", expect {p.slot_bytes} B (TMA)" if tma_bytes else ""
        pairs = f" ({link.rings} rings: {link.pairing})" if link.rings > 1 else ""
        if link.interleave > 1:
            pairs = f" (one ring: {link.rings} pairs interleaved, stride {link.interleave})"
        pipe_rows.append(Row(p.name, "full barriers", f"mbarrier[{full.barriers}] count=1{tma}",
                             f"slot = i % stages; consumer waits parity (i // stages) & 1{pairs}"))
        pipe_rows.append(Row(p.name, "empty barriers", f"mbarrier[{empty.barriers}] count={empty.arrive_count}",
                             "producer waits parity ((i // stages) & 1) ^ 1 (fresh barrier passes)"))
        if p.fields:
            pipe_rows.append(Row(p.name, "shared-memory ring",
                                 f"{slots} x {p.slot_bytes} B = "
                                 f"{slots * p.slot_bytes} B",
                                 ", ".join(f"{f.name}{list(f.shape)} {f.dtype.name}" for f in p.fields)))
        row = holding.counter_row(kernel, link, f"{p.name}_acquired, {p.name}_committed (producer); "
                                  f"{p.name}_waited, {p.name}_released (consumer)", held)
        pipe_rows += [row] if row else []
        smem += slots * p.slot_bytes
    if smem > HOPPER_SMEM_BYTES:
        big = [kernel.sync_object(x.obj) for x in skel.links if x.kind == "pipe" and x.crosses]
        raise AllocationError(
            f"pipes need {smem} B of shared memory; a Hopper SM has {HOPPER_SMEM_BYTES} B",
            loc=big[0].loc if big else kernel.loc,
            objects=tuple(f"{p.name} (stages={p.stages}, {p.slot_bytes} B/slot)" for p in big),
            fix="lower stages or tile sizes" + _own_hint(kernel))
    partitions, maxnreg, budget = _registers(partitions, smem, options)
    for part in partitions:
        kind = "default partition" if part.index == 0 else f"worker partition {part.index}"
        roles = ", ".join(skel.instances[part.instance].roles)
        rows.append(Row(part.label, kind, f"{part.warps} warp(s)", f"roles: {roles}"))
    rows.append(Row("registers", "register budget", budget,
                    "setmaxnreg per worker partition" + (f"; launch maxnreg={maxnreg}" if maxnreg else "")))
    rows += pipe_rows
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
    named = []
    # IDs 0, 1 and 2 + i (worker partition i, padding partitions included) belong to the
    # compiler; allocate the kernel's barriers from the top (15) down so they never meet.
    reserved = 2 + _padded_workers(partitions)
    for k, b in enumerate(skel.barriers):
        bid = HOPPER_NAMED_BARRIERS - 1 - k
        decl = kernel.sync_object(b.obj)
        if bid < reserved:
            raise AllocationError(
                f"barrier '{b.obj}' needs named barrier {bid}, but IDs 0..{reserved - 1} belong to "
                f"the compiler ({len(partitions)} partitions) and Hopper has {HOPPER_NAMED_BARRIERS}",
                loc=decl.loc, objects=(b.obj,),
                fix=("use fewer group barriers (merge groups with the same members)" if not decl.made_by
                     else f"turn the pass off (the {decl.made_by} option) or use fewer group barriers"))
        # every member partition counts once, whatever member roles it runs
        members = tuple(p.index for p in partitions if p.instance in b.members)
        threads = 32 * sum(partitions[i].warps for i in members)
        named.append(NamedBarrier(b.obj, bid, threads, members, decl.made_by))
        rule = "sync = bar.sync; arrive = bar.arrive"
        if decl.made_by:
            rule += f" (declared by the {decl.made_by} pass)"
        rows.append(Row(b.obj, "named barrier", f"bar id {bid}, {threads} threads", rule))
    decision = cluster_ctas.plan(kernel, placement, is_tma_pipe)
    return HopperAllocation("nvidia", tuple(rows), partitions=tuple(partitions),
                            mbarriers=tuple(groups), named_barriers=tuple(named), maxnreg=maxnreg,
                            smem_bytes=smem, cta_split=decision and decision.split,
                            multicast_rows=decision and decision.rows(kernel, placement.target))


def _own_hint(kernel, why: str = "(merged, its hand-off needs no ring)") -> str:
    """The fix's addition where the author placed a vector role on its own warpgroup (its
    ring or its warps are what no longer fit)."""
    own = [r.name for r in kernel.roles if r.placement is ir.RolePlacement.OWN]
    return (f', or drop placement="own" from {", ".join(repr(n) for n in own)} {why}'
            if own else "")


def _registers(partitions, smem, options=None):
    """(partitions with their budgets, launch maxnreg, display text); see the module docstring.
    ``options``: the nvidia ``LowerOptions`` (producer_regs, consumer_regs, maxnreg)."""
    prod, cons, maxnreg = ((options.producer_regs, options.consumer_regs, options.maxnreg)
                           if options is not None else (None, None, None))
    explicit = any(x is not None for x in (prod, cons, maxnreg))
    if not explicit and two_ctas_fit(partitions, smem):
        prod, cons, maxnreg = 24, MAX_CONSUMER_REGS, 128
    consumers = sum(1 for p in partitions if p.unit != Unit.PRODUCER)
    prod_groups = math.ceil(sum(p.warps for p in partitions if p.unit == Unit.PRODUCER) / 4)
    if prod is None:
        prod = DEFAULT_PRODUCER_REGS
        if cons is None and prod_groups * prod + consumers * MAX_CONSUMER_REGS > REGISTER_FILE:
            prod = TIGHT_PRODUCER_REGS
    if cons is None:
        cons = min(MAX_CONSUMER_REGS, int((REGISTER_FILE - prod_groups * prod) / max(1, consumers)) // 8 * 8)
    out = tuple(Partition(p.index, p.agent, p.replica, p.replicas, p.warps, p.instance, p.unit,
                          prod if p.unit == Unit.PRODUCER else cons) for p in partitions)
    return out, maxnreg, f"producer {prod}, consumer {cons} registers per thread"


def two_ctas_fit(partitions, smem: int) -> bool:
    """Two CTAs share an SM: one consumer warpgroup and the producer warp, and at most half
    the shared memory (the register budget then halves too; see _registers)."""
    warps = sorted(p.warps for p in partitions)
    return warps == [WARPS[Unit.PRODUCER], WARPS[Unit.CONSUMER]] and smem <= TWO_CTA_SMEM_BYTES


def _padded_workers(partitions) -> int:
    """Worker partitions after Gluon pads worker warps up to a multiple of 4."""
    workers = [p.warps for p in partitions[1:]]
    return len(workers) + (-sum(workers) % 4)


def ring_slots(link) -> int:
    """Slots (and full/empty mbarriers) of a pipe's shared-memory ring: one ring per replica pair,
    or one ring the pairs share when it is interleaved."""
    return link.stages if link.interleave > 1 else link.stages * link.rings
