"""How the Hopper renderer spells synchronization: pipe rings and their counters, events,
named barriers, pass-made guarded releases, and the hang-debug polls (one :class:`SyncSpeller`
per agent program, owned by the renderer's agent speller; the module's helper functions)."""
from __future__ import annotations

from dataclasses import dataclass

from xsync.backends.nvidia.alloc import HopperAllocation, is_tma_pipe
from xsync.backends.nvidia.layouts import SCALAR
from xsync.backends.nvidia.values import ValueSpeller
from xsync.backends.source import Emitter
from xsync.lowering import ir
from xsync.lowering.placement import Placement
from xsync.lowering.protocol import acting_role, evaluated


@dataclass
class WaitSite:
    """One rendered mbarrier wait (hang debug mode maps ids back to these)."""

    id: int
    agent: str
    role: str
    verb: ir.Verb    # ACQUIRE (a pipe slot) | WAIT (a full slot, an event)
    obj: str
    line: int
    what: str


# the counter a pipe verb advances: <pipe>_acquired, ...
COUNTED = {ir.Verb.ACQUIRE: "acquired", ir.Verb.COMMIT: "committed", ir.Verb.WAIT: "waited", ir.Verb.RELEASE: "released"}


def paired(allocation: HopperAllocation, obj) -> int:
    """Replica count when obj links replica i to replica i (each pair has its own ring), or
    gathers N replicas into one consumer (each producer replica has its own ring)."""
    link = allocation.skeleton.link(obj.name)
    return link.rings if link.paired or link.gather_pipe else 0


def gather_rings(allocation: HopperAllocation, pipe, role: str) -> int:
    """Rings the consumer ``role`` of an N -> 1 pipe waits and releases together (0: not one)."""
    link = allocation.skeleton.link(pipe.name)
    return link.rings if link.gather_pipe and role == pipe.dst else 0


@dataclass(frozen=True)
class HangDebug:
    """Hang debug mode (``debug_hang``): a bounded poll before every mbarrier wait."""

    timeout_ms: int
    bars_smem: int                # byte offset of xs_bars in shared memory


class SyncSpeller:
    """Sync operations of one agent program, written to ``out``. It owns the role the agent acts
    for (``role``; ``role_block``: the role block it is in) and appends the waits it spells to
    the module's ``wait_sites`` (hang debug mode); values (guards, slot variables) go through
    ``values``."""

    def __init__(self, *, kernel: ir.KernelIR, placement: Placement, allocation: HopperAllocation, agent,
                 values: ValueSpeller, out: Emitter, wait_sites: list, debug: HangDebug | None):
        self.kernel = kernel
        self.placement = placement
        self.allocation = allocation
        self.agent = agent
        self.values = values
        self.out = out
        self.wait_sites = wait_sites
        self.debug = debug
        self.role = agent.roles[0]
        self.role_block = None

    # ------------------------------------------------------------ sync
    def ring_slot(self, pipe, counter: str) -> str:
        if pipe.interleave > 1:   # the pairs share one ring: pair r takes r, r + N, r + 2N, ...
            return f"REPLICA + {pipe.interleave} * ({counter} % {pipe.lane_stages})"
        # a gather consumer's slot is its index in every ring (ring r starts at r * stages)
        own = paired(self.allocation, pipe) and not gather_rings(self.allocation, pipe, self.role)
        base = f"REPLICA * {pipe.stages} + " if own else ""
        return f"{base}{counter} % {pipe.stages}"

    def rings_of(self, pipe) -> list[str]:
        """Offsets of the rings a pipe verb of this role touches: its own, or every producer
        replica's for the consumer of an N -> 1 pipe."""
        n = gather_rings(self.allocation, pipe, self.role)
        return [f"{r * pipe.stages} + " for r in range(n)] if n else [""]

    def bar_index(self, obj, side, slot: str) -> str:
        return f"xs_bars.index({obj.name.upper()}_{side.upper()} + {slot})"

    def bar_wait(self, obj, side: str, index_expr: str, parity: str, verb: ir.Verb, counter: str, line: int, what: str):
        bar = f"xs_bars.index({obj.name.upper()}_{side.upper()} + {index_expr})"
        if self.debug is not None:
            site = len(self.wait_sites)
            self.wait_sites.append(WaitSite(site, self.agent.name, self.role, verb, obj.name, line, what))
            self.out.line(f"xs_debug_wait({obj.name.upper()}_{side.upper()} + {index_expr}, {parity}, "
                          f"xs_dbg, AGENT_ID, {site}, {counter})  # bounded poll first (XSYNC_DEBUG_HANG)")
        self.out.line(f"mbarrier.wait({bar}, {parity})  # line {line}: {what}")

    def sync(self, s: ir.SyncOp):
        o, line = self.out, s.loc.line
        obj = self.kernel.sync_object(s.obj)
        role = self.role
        if self.role_block is None:
            # a pass-made operation outside any role block acts for its object's role
            self.role = acting_role(self.kernel, s, self.agent.roles) or self.role
        if s.guard is not None and not (isinstance(obj, ir.Pipe) and s.verb is ir.Verb.RELEASE
                                         and self.placement.crosses(obj)):
            o.line(f"if {self.values.tx(s.guard)[0]}:  # line {line}")
            o.indent()
            self.sync(ir.SyncOp(s.verb, s.obj, s.target, s.loc, note=s.note))
            o.dedent()
        elif isinstance(obj, ir.Pipe):
            self.pipe_op(s, obj)
        elif isinstance(obj, ir.Event):
            if not self.placement.crosses(obj):
                o.line(f"# line {line}: xs.{'signal' if s.verb is ir.Verb.SIGNAL else 'wait'}({obj.name}) -- "
                       f"same partition: program order")
                return
            idx = "REPLICA" if paired(self.allocation, obj) else "0"
            if s.verb is ir.Verb.SIGNAL:
                o.line(f"mbarrier.arrive(xs_bars.index({obj.name.upper()}_EVENT + {idx}), count=1)"
                       f"  # line {line}: xs.signal({obj.name})")
            else:
                cnt = f"{obj.name}_waited"
                self.bar_wait(obj, "event", idx, f"{cnt} & 1", ir.Verb.WAIT, cnt, line, f"xs.wait({obj.name})")
                o.line(f"{cnt} += 1")
        else:
            # member roles sharing this partition meet once per meeting (skeleton.points)
            point = self.allocation.skeleton.renders(self.agent.name, s)
            if point is None:
                at = self.allocation.skeleton.point(self.agent.name, s).at.loc.line
                o.line(f"# line {line}: {obj.name}.{s.verb}() -- met once for this partition at line {at}")
                return
            bid = self.allocation.barrier_id(obj.name)
            n = self.allocation.named_barrier(obj.name).threads
            fn = "xs_named_barrier_sync" if point.waits else "xs_named_barrier_arrive"
            verb = ir.Verb.SYNC if point.waits else ir.Verb.ARRIVE
            why = f" -- {s.note}" if s.note else ""
            o.line(f"{fn}({bid}, {n})  # line {line}: {obj.name}.{verb}() -- named barrier {bid}, "
                   f"{n} threads{why}")
        self.role = role

    def pipe_op(self, s: ir.SyncOp, pipe: ir.Pipe):
        o, line, name, st = self.out, s.loc.line, pipe.name, pipe.lane_stages
        values = self.values
        if s.target:
            values.slot_pipe[s.target] = pipe
        if not self.placement.crosses(pipe):
            o.line(f"# line {line}: {name}.{s.verb}() -- '{pipe.src}' and '{pipe.dst}' share this "
                   f"partition: the slot is a register value")
            return
        if s.verb is ir.Verb.ACQUIRE:
            key = s.target or values.fresh("slot")
            slot = values.names(key)
            o.line(f"{slot} = {self.ring_slot(pipe, f'{name}_acquired')}")
            self.bar_wait(pipe, "empty", slot, f"(({name}_acquired // {st}) & 1) ^ 1", ir.Verb.ACQUIRE,
                          f"{name}_acquired", line, f"{s.target or ''}{' = ' if s.target else ''}{name}.acquire()")
            if self.multicast(pipe):
                o.line(f"mbarrier.wait(xs_bars_mc.index({name.upper()}_EMPTY_MC + {slot}), "
                       f"(({name}_acquired // {st}) & 1) ^ 1)  # the lead CTA waits: every CTA released "
                       f"the multicast slot")
            o.line(f"{name}_acquired += 1")
            if is_tma_pipe(self.kernel, pipe):
                nbytes = self.allocation.mbarrier(name, "full").tma_bytes or pipe.slot_bytes
                per = " per CTA (its share of the split fields, the whole multicast ones)" \
                    if self.allocation.cta_split is not None else ""
                o.line(f"mbarrier.expect({self.bar_index(pipe, 'full', slot)}, {nbytes})"
                       f"  # TMA completes the slot: {nbytes} bytes{per}")
            values.env[key] = SCALAR
        elif s.verb is ir.Verb.COMMIT:
            if is_tma_pipe(self.kernel, pipe):
                o.line(f"# line {line}: {name}.commit() -- the TMA engine completes the full barrier")
                return
            o.line("fence_async_shared()")
            o.line(f"mbarrier.arrive({self.bar_index(pipe, 'full', self.ring_slot(pipe, f'{name}_committed'))}, "
                   f"count=1)  # line {line}: {name}.commit()")
            o.line(f"{name}_committed += 1")
        elif s.verb is ir.Verb.WAIT:
            key = s.target or values.fresh("slot")
            slot = values.names(key)
            o.line(f"{slot} = {self.ring_slot(pipe, f'{name}_waited')}")
            rings = self.rings_of(pipe)
            for k, base in enumerate(rings):
                of = f" (replica {k}'s ring)" if len(rings) > 1 else ""
                self.bar_wait(pipe, "full", f"{base}{slot}", f"({name}_waited // {st}) & 1", ir.Verb.WAIT,
                              f"{name}_waited", line,
                              f"{s.target or ''}{' = ' if s.target else ''}{name}.wait(){of}")
            o.line(f"{name}_waited += 1")
            values.env[key] = SCALAR
        else:
            slot = self.ring_slot(pipe, f'{name}_released')
            bars = [self.bar_index(pipe, 'empty', f"{base}{slot}") for base in self.rings_of(pipe)]
            why = f" {s.note}" if s.note else ""
            guard = self.static_guard(s.guard)
            if guard is False:
                o.line(f"# line {line}: {name}.release(){why} -- never (its guard is false here)")
            elif guard is None:
                # a guarded release is a predicated arrive, not a branch around the mbarrier op
                cond = values.tx(s.guard)[0]
                for bar in bars + self.lead_bars(pipe, slot):
                    o.line(f"mbarrier.arrive({bar}, count=1, pred={cond})  # line {line}: {name}.release(){why}")
                o.line(f"{name}_released += ({cond}).to(gl.int32)")
            else:
                for bar in bars + self.lead_bars(pipe, slot):
                    o.line(f"mbarrier.arrive({bar}, count=1)  # line {line}: {name}.release(){why}")
                o.line(f"{name}_released += 1")

    def multicast(self, pipe) -> bool:
        """A multicast pipe of a kernel spread over a cluster's CTAs (cluster_ctas.py)."""
        split = self.allocation.cta_split
        return split is not None and pipe.multicast

    def lead_bars(self, pipe, slot: str) -> list[str]:
        """The lead CTA's empty barrier a release also arrives on (routed there by Gluon)."""
        return [f"xs_bars_mc.index({pipe.name.upper()}_EMPTY_MC + {slot})"] if self.multicast(pipe) else []

    def static_guard(self, guard):
        """True (no guard, or one that holds at compile time), False, or None (run time)."""
        if guard is None:
            return True
        v = evaluated(guard, self.values.consts)
        return None if v is None else bool(v)


def counters(kernel: ir.KernelIR, placement: Placement, stmts) -> list[tuple[str, str]]:
    """(counter, what it counts) of the pipe/event counters an agent program needs."""
    names = []
    for s in ir.walk(stmts):
        if isinstance(s, ir.SyncOp):
            obj = kernel.sync_object(s.obj)
            if isinstance(obj, ir.Barrier) or not placement.crosses(obj):
                continue
            if isinstance(obj, ir.Pipe):
                if s.verb is ir.Verb.COMMIT and is_tma_pipe(kernel, obj):
                    continue
                n = COUNTED[s.verb]
                names.append((f"{obj.name}_{n}", f"pipe '{obj.name}': slots {n}"))
            elif s.verb is ir.Verb.WAIT:
                names.append((f"{obj.name}_waited", f"event '{obj.name}': signals waited"))
    return list(dict.fromkeys(names))


def emit_helpers(o: Emitter, debug: HangDebug | None):
    """The module's helper functions: named barriers, and the bounded wait of hang debug mode."""
    o.line()
    o.line("@gluon.jit")
    o.line("def xs_named_barrier_sync(BAR_ID: gl.constexpr, NTHREADS: gl.constexpr):")
    o.line('    """bar.sync: wait until NTHREADS threads (this partition included) reached BAR_ID."""')
    o.line('    gl.inline_asm_elementwise("bar.sync $1, $2; mov.b32 $0, 0;", "=r,n,n,~{memory}", '
           '[BAR_ID, NTHREADS], dtype=gl.int32, is_pure=False, pack=1)')
    o.line()
    o.line()
    o.line("@gluon.jit")
    o.line("def xs_named_barrier_arrive(BAR_ID: gl.constexpr, NTHREADS: gl.constexpr):")
    o.line('    """bar.arrive: count this partition at BAR_ID without waiting."""')
    o.line('    gl.inline_asm_elementwise("bar.arrive $1, $2; mov.b32 $0, 0;", "=r,n,n,~{memory}", '
           '[BAR_ID, NTHREADS], dtype=gl.int32, is_pure=False, pack=1)')
    if debug is None:
        return
    timeout_ns = debug.timeout_ms * 1_000_000
    grace_ns = min(timeout_ns // 4, 300_000_000)
    asm = (
        "{ .reg .pred p, q; .reg .u32 a, c, n, v, old; .reg .u64 t0, t1, dt, rec; "
        "mov.u32 a, global_smem; add.u32 a, a, $1; mov.u64 t0, %globaltimer; "
        "XS_POLL: mbarrier.try_wait.parity.shared::cta.b64 p, [a], $2; @p bra.uni XS_DONE; "
        "mov.u64 t1, %globaltimer; sub.u64 dt, t1, t0; "
        f"setp.lt.u64 p, dt, {timeout_ns}; @p bra.uni XS_POLL; "
        # timed out: the first CTA to time out reports; each of its stuck agents writes a record
        "mov.u32 c, %ctaid.z; mov.u32 n, %nctaid.y; mov.u32 v, %ctaid.y; mad.lo.u32 c, c, n, v; "
        "mov.u32 n, %nctaid.x; mov.u32 v, %ctaid.x; mad.lo.u32 c, c, n, v; add.u32 c, c, 1; "
        "atom.global.cas.b32 old, [$3], 0, c; setp.eq.u32 p, old, 0; setp.eq.or.u32 p, old, c, p; "
        "mov.u32 v, $4; mul.wide.u32 rec, v, 16; add.u64 rec, rec, $3; add.u64 rec, rec, 16; "
        "mov.u32 v, $5; @p st.global.b32 [rec+4], v; @p st.global.b32 [rec+8], $6; "
        "mov.u32 v, 1; @p st.global.b32 [rec], v; membar.sys; "
        "mov.u64 t0, %globaltimer; "
        f"XS_GRACE: mov.u64 t1, %globaltimer; sub.u64 dt, t1, t0; setp.lt.u64 q, dt, {grace_ns}; "
        "@q bra.uni XS_GRACE; trap; "
        "XS_DONE: mov.b32 $0, 0; }"
    )
    o.line()
    o.line()
    o.line("@gluon.jit")
    o.line("def xs_debug_wait(index, phase, dbg, AGENT: gl.constexpr, SITE: gl.constexpr, count):")
    o.line('    """Bounded mbarrier.try_wait.parity poll (hang debug mode).')
    o.line()
    o.line(f"    Polls xs_bars[index] for {debug.timeout_ms} ms (%globaltimer). On timeout the first CTA to")
    o.line("    time out writes {1, SITE, count} at dbg[4 + 4 * AGENT] (dbg[0] = that CTA + 1),")
    o.line("    waits a grace period so other stuck agents can report too, and traps.")
    o.line('    """')
    o.line(f"    gl.inline_asm_elementwise(\"{asm}\",")
    o.line('                              "=r,r,r,l,n,n,r,~{memory}", '
           "[XS_BARS_SMEM + index * 8, phase, dbg, AGENT, SITE, count],")
    o.line("                              dtype=gl.int32, is_pure=False, pack=1)")
