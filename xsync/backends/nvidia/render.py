"""Hopper renderer: protocol IR + placement + allocation -> Gluon (Triton 3.6-3.9) source.

The generated module is plain Gluon a user could have written:

* every agent instance of the allocation's partition list becomes one
  ``gl.warp_specialize`` partition; the first is the default partition (4 warps);
* a pipe between two agents becomes a shared-memory ring per field plus full/empty
  mbarriers (all mbarriers live in one array ``xs_bars``; ``<PIPE>_FULL`` /
  ``<PIPE>_EMPTY`` are its index bases). Each agent keeps its own counters
  (``tiles_acquired``, ``tiles_waited`` ...): slot = i % stages, parity =
  (i // stages) & 1, the producer's empty wait uses parity ^ 1;
* a pipe whose fields are all ``xs.load`` is filled by TMA (``mbarrier.expect`` at
  acquire, one TMA load per field: ``xs_tma_load``, :data:`TMA_LOAD_ALIAS`); other pipes are
  filled from registers (``smem.store`` + ``fence_async_shared`` + ``mbarrier.arrive`` at commit);
* an ``xs.store`` the staging plan stages (:mod:`.staging`: a consumer's whole tile to a tensor
  the kernel never reads, outside any loop but a tile loop, where shared memory has room beside
  the pipes) goes through a staging tile per consumer replica and a TMA store (``xs_tma_store``,
  :data:`TMA_STORE_ALIAS`) when the tile lies inside its bounds and the tensor suits TMA (the
  ``<tensor>_tma_ok`` argument), so the partition moves on while the copy engine writes it;
  otherwise, and for the tiles a boundary cuts, the masked ``gl.store``;
* with the option ``exp2_fma`` (1/4, 1/2), that share of an accumulator tile's ``xs.exp2`` is
  computed by a polynomial on the FMA pipe instead of the special-function unit (:mod:`.exp2`);
* a tile loop the plan rewrites (option ``prefetch_tile_scalars``) issues its table reads
  (``xs.load_scalar``) tiles ahead of their tile, in the stages :mod:`.prefetch` builds;
* a pipe or event inside one agent is a register variable / program order;
* an event between agents is an mbarrier (k-th wait on parity k & 1);
* a group barrier is a named barrier (``bar.sync`` / ``bar.arrive`` inline asm) with
  the allocated ID and thread count;
* ``xs.mma`` -> ``warpgroup_mma(is_async=True)``, ``xs.mma_wait`` ->
  ``warpgroup_mma_wait(n, deps=...)``; a register A operand held in a variable (Q in
  attention) gets the wgmma operand layout at its definition, so a loop does not
  convert it on every iteration.

The schedule (PV fused into the accumulating wgmma, deferred waits, softmax overlap,
ping-pong) is decided before rendering, by the passes of ``xsync.backends.nvidia.passes``,
and verified; tensor uses, types and layouts, staging and reads ahead are decided by
:func:`xsync.backends.nvidia.planning.plan`. The renderer spells the agent programs it is given
(``KernelIR.programs``) -- pass-made waits (``ir.MmaWait``), guarded releases (a predicated
``mbarrier.arrive``) and the passes' barriers (named barriers like any other).

Hang debug mode (``debug_hang=True``, ``XSYNC_DEBUG_HANG=1``): every mbarrier wait is
preceded by a bounded ``mbarrier.try_wait.parity`` poll (inline PTX, %globaltimer
budget); on timeout the thread writes (agent, wait site, iteration) into a host-mapped
int32 buffer and traps. The poll addresses the barrier as ``global_smem + offset``; the
offset of ``xs_bars`` is only known after a first compile (see ``__init__``), so it is a
module constant ``XS_BARS_SMEM``.

Structure: :class:`NvidiaRenderer` spells the module (header, agent functions, entry function)
in named steps; one :class:`AgentSpeller` per agent program spells its statements, with a
:class:`ValueSpeller` (expressions) and a :class:`SyncSpeller` (synchronization) that write to
the agent's :class:`Emitter`.
"""
from __future__ import annotations

from dataclasses import dataclass

from xsync.dtypes import DType
from xsync.backends.spelling import Spelling
from xsync.backends.source import Emitter, label
from xsync.errors import BackendError
from xsync.lowering import ir
from xsync.backends.nvidia.alloc import HopperAllocation, is_tma_pipe
from xsync.backends.nvidia import exp2, planning
from xsync.backends.nvidia.abi import ArgKind, KernelArg
from xsync.backends.nvidia.options import RenderOptions
from xsync.backends.nvidia.layouts import ModuleLayouts, ValueKind, nvmma_shared_repr, smem_name
from xsync.backends.nvidia.planning import RenderPlan
from xsync.backends.nvidia.sync_ops import HangDebug, SyncSpeller, WaitSite, counters, emit_helpers, paired
from xsync.backends.nvidia.values import SCALAR, GL_DTYPES, ValueSpeller
from xsync.backends.nvidia.tensors import leading
from xsync.lowering.placement import Placement

# The TMA global->shared load is spelled differently across the supported Triton versions:
# 3.6/3.7 only have tma.async_copy_global_to_shared, 3.8 adds tma.async_load (same
# positional arguments) and keeps the old name, 3.9 makes the old name raise. The
# generated module feature-detects it once, in its header.
TMA_LOAD_ALIAS = ('xs_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared'
                  '  # Triton >= 3.8 / 3.6-3.7 spelling')
TMA_STORE_ALIAS = ('xs_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global'
                   '  # Triton >= 3.9 / 3.6-3.8 spelling')
# The TMA bulk reduce-add (cp.reduce.async.bulk.tensor .add): tma.async_atomic_add in newer Gluon;
# Triton 3.6 has the op but no Gluon wrapper (xsync/backends/nvidia/gluon_compat.py spells it).
TMA_REDUCE_ADD_ALIAS = ('from xsync.backends.nvidia.gluon_compat import tma_reduce_add as xs_tma_reduce_add'
                        '  # tma.async_atomic_add where Gluon has it')


@dataclass
class RenderResult:
    source: str
    kernel_name: str                 # the @gluon.jit entry point
    params: list                     # [KernelArg] in kernel-argument order
    tensors: dict                    # name -> TensorUse
    partitions: list                 # [(label, agent, replica, warps, regs)]
    num_warps: int
    wait_sites: list[WaitSite]
    agent_ids: dict                  # partition label -> debug agent id
    num_bars: int
    debug_hang: bool
    descriptor_layouts: dict         # desc param -> (tensor, [rows, cols], element DType)
    layouts: ModuleLayouts           # types and layouts of every agent (layouts.infer)
    num_ctas: int = 1                # > 1: one program over a cluster's CTAs (cluster_ctas.py)
    descriptor_cga: dict | None = None   # desc param -> its CGA bases (num_ctas > 1)


class AgentSpeller:
    """The statements of one agent program, written to ``out``: it owns the agent's value and
    sync spellers and the wgmma operand reads its waits keep alive (``mma_reads``)."""

    def __init__(self, *, kernel: ir.KernelIR, placement: Placement, allocation: HopperAllocation,
                 plan: RenderPlan, agent, out: Emitter, wait_sites: list, debug: HangDebug | None,
                 exp2_share: str | None, names: Spelling):
        self.kernel = kernel
        self.placement = placement
        self.plan = plan
        self.agent = agent
        self.out = out
        self.typed = plan.layouts.agents[agent.name]
        self.values = ValueSpeller(kernel=kernel, placement=placement, consts=dict(plan.consts),
                                   tensors=plan.tensors.uses,
                                   layouts={c.name: c for c in plan.layouts.constants}, typed=self.typed,
                                   warps=allocation.partitions_of(agent.name)[0].warps, out=out,
                                   exp2_share=exp2_share, names=names)
        self.values.split = allocation.cta_split     # the layouts' CTA split (layouts.infer's)
        self.names = names
        self.sync = SyncSpeller(kernel=kernel, placement=placement, allocation=allocation, agent=agent,
                                values=self.values, out=out, wait_sites=wait_sites, debug=debug)
        self.mma_reads: dict[str, list] = {}

    def fail(self, what, loc=None, objects=(), fix=""):
        raise BackendError(what, loc=loc or self.kernel.loc, objects=tuple(objects), fix=fix)

    def spell(self, stmts):
        self.block(stmts)
        if self.plan.staging.stages(self.agent.name):
            self.out.line("tma.store_wait(0)  # the TMA stores have read their staging tiles before the partition ends")
        # the types come from LayoutRules, but the renderer's walk (values, sync_ops) keeps its
        # own variables: they must end as the inference's walk ended
        inferred = self.typed.variables
        drift = sorted(n for n, t in self.values.env.items() if inferred.get(n, t if t.kind is ValueKind.SCALAR else None) != t)
        if drift:
            self.fail(f"internal: the rendered types of {drift} in agent '{self.agent.name}' differ from the inferred ones",
                      fix="report this kernel")

    # ------------------------------------------------------------ statements
    def block(self, stmts):
        if not stmts:
            self.out.line("pass")
        for s in stmts:
            self.values.loc = getattr(s, "loc", self.values.loc)
            self.stmt(s)

    def stmt(self, s):
        o = self.out
        if isinstance(s, ir.Assign):
            self.assign(s)
        elif isinstance(s, ir.SlotWrite):
            self.slot_write(s)
        elif isinstance(s, ir.Store):
            self.store(s)
        elif isinstance(s, ir.RoleBlock):
            o.line(f"# role '{label(s.role)}' (line {s.loc.line})")
            sync = self.sync
            sync.role, outer = s.role, sync.role_block
            sync.role_block = s.role
            self.block(s.body)
            sync.role_block = outer
        elif isinstance(s, ir.For):
            self.loop(s)
        elif isinstance(s, ir.If):
            o.line(f"if {self.values.tx(s.cond)[0]}:  # line {s.loc.line}")
            off = self.values.constant_truth(s.cond)     # a constexpr test: one branch is dead
            o.indent()
            self.values.dead += off is False
            self.block(s.body)
            self.values.dead -= off is False
            o.dedent()
            if s.orelse:
                o.line("else:")
                o.indent()
                self.values.dead += off is True
                self.block(s.orelse)
                self.values.dead -= off is True
                o.dedent()
        elif isinstance(s, ir.SyncOp):
            self.sync.sync(s)
        elif isinstance(s, ir.MmaWait):
            targets = ", ".join(map(self.names, s.targets))
            o.line(f"{targets} = warpgroup_mma_wait({s.pending}, deps=[{targets}])  # line {s.loc.line}: {s.note}")
        else:
            raise TypeError(f"cannot render {s!r}")

    def loop(self, s: ir.For):
        o, tx = self.out, self.values.tx
        var = self.names(s.var)
        ahead = self.plan.reads_ahead.of(s)
        if s.single_tile:    # one program per tile: no loop state to carry
            o.line(f"{var} = {tx(s.start)[0]}  # line {s.loc.line}: one tile per program")
            o.line(f"if {var} < {tx(s.stop)[0]}:")
        else:
            if ahead is not None:
                o.line(f"# line {s.loc.line}: the tile loop's table reads go out ahead of their tiles "
                       f"(prefetch.py: chains of {ahead.depth})")
                self.groups(ahead.warmup)
            o.line(f"for {var} in range({tx(s.start)[0]}, {tx(s.stop)[0]}, "
                   f"{tx(s.step)[0]}):  # line {s.loc.line}")
        self.values.env[s.var] = SCALAR
        o.indent()
        if ahead is not None:
            self.groups(ahead.head)
            if ahead.rest:
                self.block(ahead.rest)
        else:
            self.block(s.body)
        o.dedent()

    def groups(self, groups):
        for what, stmts in groups:
            self.out.line(f"# {what}")
            self.block(stmts)

    def assign(self, s: ir.Assign):
        o, v, values = self.out, s.value, self.values
        if len(s.targets) > 1:
            if not isinstance(v, ir.TupleExpr):
                self.fail("tuple assignment needs a tuple", loc=s.loc)
            parts = [values.tx(x) for x in v.items]
            o.line(f"{', '.join(map(self.names, s.targets))} = {', '.join(c for c, _ in parts)}")
            for n, (_, t) in zip(s.targets, parts):
                values.env[n] = t
            return
        target = s.targets[0]
        if isinstance(v, ir.Name) and v.id in values.slot_pipe:
            # a slot kept under another name (overlap-softmax: the previous block's K/V slot)
            values.slot_pipe[target] = values.slot_pipe[v.id]
            values.env[target] = SCALAR
            o.line(f"{self.names(target)} = {self.names(v.id)}  # line {s.loc.line}: the slot of '{values.slot_pipe[v.id].name}' kept")
            return
        prev, want = values.assigned_type(target, v)   # a loop-carried value keeps one layout
        if isinstance(v, ir.Call) and v.op is ir.TileOp.MMA_WAIT:
            c, t = values.tx(v.args[0], want)
            n = int(values.cval(v.kwarg("pending", ir.Const(0)), "mma_wait pending", s.loc))
            reads = self.mma_reads.get(v.args[0].id, []) if isinstance(v.args[0], ir.Name) else []
            deps = [c] + reads
            lhs = self.names(target) + (", " + ", ".join("_" for _ in reads) if reads else "")
            o.line(f"{lhs} = warpgroup_mma_wait({n}, deps=[{', '.join(deps)}])"
                   f"  # line {s.loc.line}: wait until <= {n} wgmma in flight")
            values.env[target] = t
            return
        values.last_mma_reads = []
        asked, natural, t = values.definition(target, v, prev, want)
        code = values.view(values.spell(v, natural, asked, 0), natural, t)
        note = f"  # line {s.loc.line}: async wgmma" if isinstance(v, ir.Call) and v.op is ir.TileOp.MMA else ""
        o.line(f"{self.names(target)} = {code}{note}")
        if values.last_mma_reads:
            self.mma_reads[target] = list(values.last_mma_reads)
        values.define(target, t)

    def store(self, s: ir.Store):
        values = self.values
        if values.row_vector(s.value):
            return self.row_store(s)
        o = self.out
        c, t = values.tx(s.value)
        if t.kind is not ValueKind.TILE or len(t.shape) not in (1, 2):
            self.fail("xs.store writes 1-D or 2-D tiles", loc=s.loc)
        if len(t.shape) == 1:
            return self.row_store(s, (c, t))
        lay = t.layout
        tn = s.tensor
        val = values.fresh("val")
        r, cc = values.fresh("rows"), values.fresh("cols")
        dtype = values.dtype(values.tensors[tn].dtype)
        staged = self.plan.staging.of(s)
        offs = [values.tx(x)[0] for x in s.offsets]
        r0, c0 = offs[-2:]
        bounds = [values.tx(x)[0] for x in s.bounds] if s.bounds else []
        lead = leading(values.tensors[tn], offs, 2, bounds)
        adds = s.reduce is ir.StoreReduce.ADD
        what = f'xs.store({tn}, ..., reduce="add")' if adds else f"xs.store({tn}, ...)"
        if staged is None:
            o.line(f"# line {s.loc.line}: {what} -- out-of-bounds parts are masked off"
                   + (" (red.global.add per element)" if adds else ""))
            o.line(f"{val} = {c}")
        else:
            stage_buf = staged.tile.name
            inside = [f"{tn}_tma_ok != 0"]
            if bounds:
                inside += [f"{r0} + {t.shape[0]} <= {bounds[0]}", f"{c0} + {t.shape[1]} <= {bounds[1]}"]
            bulk = "TMA bulk reduce-add" if adds else "TMA store"
            o.line(f"# line {s.loc.line}: {what} -- a tile inside its bounds: {bulk} from "
                   f"shared memory (the copy engine clips at the tensor's edges); else masked off")
            o.line(f"{val} = {c}")
            o.line(f"if {' & '.join(f'({x})' for x in inside)}:")
            o.indent()
            o.line("tma.store_wait(0)  # this partition's previous TMA store has read the staging tile")
            o.line(f"{stage_buf}.index(REPLICA).store({val}.to({dtype}))")
            o.line("fence_async_shared()")
            o.line(f"{'xs_tma_reduce_add' if adds else 'xs_tma_store'}({staged.desc}, [{r0}, {c0}], "
                   f"{stage_buf}.index(REPLICA))")
            o.dedent()
            o.line("else:")
            o.indent()
        o.line(f"{r} = {r0} + gl.arange(0, {t.shape[0]}, layout=gl.SliceLayout(1, {lay}))")
        o.line(f"{cc} = {c0} + gl.arange(0, {t.shape[1]}, layout=gl.SliceLayout(0, {lay}))")
        self.masked_store(tn, f"{r}[:, None]", f"{cc}[None, :]", val, bounds[-2:], adds, lead)
        if staged is not None:
            o.dedent()

    def masked_store(self, tn: str, rows: str | None, cols: str, val: str, bounds: list, adds: bool = False,
                     lead: tuple[str, list[str]] = ("", [])):
        """gl.store of ``val`` at (``rows``, ``cols``) of ``tn`` (``cols`` only: a 1-D tile), masked to
        the tensor and ``bounds`` (of the tile's dimensions); ``lead``: the leading offsets' address
        term and masks (tensors of more dimensions than the tile). ``adds``: a relaxed gl.atomic_add
        whose result is unused (PTX red.global.add): the sum is read after the launch, nothing in
        the kernel orders on it."""
        sizes, strides = self.values.tensors[tn].dims()
        masks = ([f"({rows} < {sizes[-2]})"] if rows else []) + [f"({cols} < {sizes[-1]})"]
        if bounds:
            masks += ([f"({rows} < {bounds[-2]})"] if rows else []) + [f"({cols} < {bounds[-1]})"]
        mask = " & ".join(masks + lead[1])
        ptr = f"{self.names(tn)}{lead[0]} + " + (f"{rows}.to(gl.int64) * {strides[-2]} + " if rows else "") + cols
        value = f"{val}.to({self.values.dtype(self.values.tensors[tn].dtype)})"
        if adds:
            self.out.line(f'gl.atomic_add({ptr}, {value}, mask={mask}, sem="relaxed")')
        else:
            self.out.line(f"gl.store({ptr}, {value}, mask={mask})")

    def row_store(self, s: ir.Store, value=None):
        """``xs.store(t, [.., r, c], v[None, :])`` of a 1-D tile ``v``, or ``xs.store(t, [.., c], v)``
        (``value``: v spelled): a masked store in ``v``'s own layout (the softmax's per-row
        statistics live in a slice of the accumulator layout; a [1, n] tile would take them to
        its column slice first)."""
        o, values = self.out, self.values
        c, t = value or values.tx(s.value.value)
        tn = s.tensor
        val, r, cc = values.fresh("val"), None if value else values.fresh("row"), values.fresh("cols")
        offs = [values.tx(x)[0] for x in s.offsets]
        bounds = [values.tx(x)[0] for x in s.bounds] if s.bounds else []
        adds = s.reduce is ir.StoreReduce.ADD
        what = f'xs.store({tn}, ..., reduce="add")' if adds else f"xs.store({tn}, ...)"
        o.line(f"# line {s.loc.line}: {what} -- {'a 1-D tile' if value else 'one row'}, in the layout its "
               f"values live in; out-of-bounds parts are masked off")
        if value is not None:
            o.line(f"{val} = {c}")
            o.line(f"{cc} = {offs[-1]} + gl.arange(0, {t.shape[0]}, layout={t.layout})")
            self.masked_store(tn, None, cc, val, bounds[-1:], adds, leading(values.tensors[tn], offs, 1, bounds))
            return
        r0, c0 = offs[-2:]
        o.line(f"{val} = {c}")
        o.line(f"{r} = {r0} + gl.zeros([{t.shape[0]}], gl.int32, layout={t.layout})")
        o.line(f"{cc} = {c0} + gl.arange(0, {t.shape[0]}, layout={t.layout})")
        self.masked_store(tn, r, cc, val, bounds[-2:], adds, leading(values.tensors[tn], offs, 2, bounds))

    def slot_write(self, s: ir.SlotWrite):
        o, values = self.out, self.values
        pipe = self.kernel.sync_object(s.pipe)
        spec = pipe.field(s.field)
        if not self.placement.crosses(pipe):
            c, t = values.tx(s.value)
            o.line(f"{pipe.name}_{s.field} = {c}  # line {s.loc.line}: {s.slot}.{s.field} (same partition: registers)")
            values.env[f"{pipe.name}_{s.field}"] = t
            return
        slot = self.names(s.slot)
        full = self.sync.bar_index(pipe, "full", slot)
        if is_tma_pipe(self.kernel, pipe):
            call = s.value
            t = call.args[0].id
            desc = values.tensors[t].descs[tuple(spec.shape)]
            offs = ", ".join(values.tx(x)[0] for x in call.args[1].items)
            split = self.sync.allocation.cta_split
            mc = ", multicast=True" if split is not None and (pipe.name, s.field) in split.multicast else ""
            o.line(f"xs_tma_load({desc}, [{offs}], {full}, {pipe.name}_{s.field}.index({slot}){mc})"
                   f"  # line {s.loc.line}: {s.slot}.{s.field} = xs.load(...)"
                   + ("; the lead CTA multicasts it to the cluster's CTAs" if mc else ""))
            return
        c, t = values.tx(s.value)
        if t.kind is ValueKind.TILE and t.dtype is not None and t.dtype != spec.dtype:
            c = f"({c}).to({values.dtype(spec.dtype)})"
        o.line(f"{pipe.name}_{s.field}.index({slot}).store({c})  # line {s.loc.line}: {s.slot}.{s.field} = ...")


def _const(v) -> str:
    """A constexpr value in the module header."""
    return GL_DTYPES[v.name] if isinstance(v, DType) else repr(v)


class NvidiaRenderer:
    """The Gluon module of one kernel, spelled from its :class:`RenderPlan` in named steps:
    the agent programs, the kernel's parameters, the header, the agent functions, the entry
    function."""

    def __init__(self, kernel: ir.KernelIR, placement: Placement, allocation: HopperAllocation,
                 plan: RenderPlan, options: RenderOptions | None = None, names: Spelling | None = None):
        self.kernel = kernel
        self.names = names if names is not None else Spelling(kernel)
        self.placement = placement
        self.allocation = allocation
        self.plan = plan
        self.options = options if options is not None else RenderOptions()
        self.debug = HangDebug(int(self.options.hang_timeout_ms), int(self.options.bars_smem)) \
            if self.options.debug_hang else None
        self.wait_sites: list[WaitSite] = []
        self.tensors = plan.tensors.uses
        self.layouts = {c.name: c for c in plan.layouts.constants}
        # mbarrier groups as the allocation sized them (rings x stages, from the skeleton):
        # "tiles:full" -> index base in xs_bars, and the group's size
        self.bar_base: dict[str, int] = {}
        self.bar_count: dict[str, int] = {}
        k = 0
        for g in allocation.mbarriers:
            self.bar_base[f"{g.obj}:{g.side}"] = k
            self.bar_count[f"{g.obj}:{g.side}"] = g.barriers
            k += g.barriers
        self.num_bars = k
        # a kernel over a cluster's CTAs: its multicast pipes' empty barriers on the lead CTA
        self.mc_base: dict[str, int] = {}
        split = allocation.cta_split
        k = 0
        for p in (kernel.pipes if split is not None else ()):
            if p.multicast and placement.crosses(p):
                self.mc_base[p.name] = k
                k += p.stages
        self.num_mc_bars = k

    def render(self) -> RenderResult:
        k = self.kernel
        parts = [(p.label, self.placement.agent(p.agent), p.replica, p.warps, p.regs)
                 for p in self.allocation.partitions]
        agent_ids = {p[0]: i for i, p in enumerate(parts)}
        agent_src, exp2_used = self.spell_agents()
        params = self.kernel_params()
        pnames = [n for n, _, _ in params]
        smem_args = [f"{p.name}_{f.name}" for p in k.pipes if self.placement.crosses(p) for f in p.fields]
        smem_args += [tile.name for tile in self.plan.staging.tiles]
        ws_args = pnames + smem_args + ["xs_bars"] + (["xs_bars_mc"] if self.mc_base else [])

        o = Emitter()
        self.header(o, exp2_used)
        self.agent_functions(o, agent_src, ws_args)
        self.entry_function(o, pnames, ws_args, parts, agent_ids)
        desc_layouts, desc_cga = {}, {}
        split = self.allocation.cta_split
        for n, kind, extra in params:
            if kind.descriptor:
                t, shape = extra
                desc_layouts[n] = (t, list(shape), self.tensors[t].dtype)
                if split is not None:
                    desc_cga[n] = split.bases(2, (t, tuple(shape)) not in split.broadcast_descs)
        return RenderResult(o.source(), self.names(k.name), params, self.tensors,
                            [(lb, a.name, r, w, g) for lb, a, r, w, g in parts], 4,
                            self.wait_sites, agent_ids, self.num_bars, self.debug is not None, desc_layouts,
                            self.plan.layouts, split.ctas if split is not None else 1,
                            desc_cga if split is not None else None)

    # ------------------------------------------------------------ steps
    def spell_agents(self) -> tuple[dict[str, Emitter], bool]:
        """Each agent program spelled once, with the layouts inferred for it: agent -> its
        lines; whether any spelled a share of exp2 on the FMA pipe."""
        agent_src = {}
        exp2_used = False
        for agent in self.placement.agents:
            out = Emitter()
            out.depth = 1
            speller = AgentSpeller(kernel=self.kernel, placement=self.placement, allocation=self.allocation,
                                   plan=self.plan, agent=agent, out=out, wait_sites=self.wait_sites,
                                   debug=self.debug, exp2_share=self.options.exp2_fma, names=self.names)
            speller.spell(self.plan.bodies[agent.name])
            exp2_used = exp2_used or speller.values.exp2_used
            agent_src[agent.name] = out
        return agent_src, exp2_used

    def kernel_params(self) -> list[KernelArg]:
        """The kernel's parameters (its ABI), in order."""
        params: list[KernelArg] = []
        for p in self.kernel.params:
            if p.kind is ir.ParamKind.CONSTEXPR:
                continue
            if p.kind is ir.ParamKind.TENSOR:
                use = self.tensors[p.name]
                for shape, dname in use.descs.items():
                    params.append(KernelArg(dname, ArgKind.DESC, (p.name, shape)))
                if use.table and not use.pointer:
                    params.append(KernelArg(self.names(p.name), ArgKind.TABLE, p.name))
                store_shapes = self.plan.staging.descs_of(p.name)
                for shape, dname in store_shapes:
                    params.append(KernelArg(dname, ArgKind.STORE_DESC, (p.name, shape)))
                if store_shapes:
                    params.append(KernelArg(f"{p.name}_tma_ok", ArgKind.STORE_OK, p.name))
                if use.pointer:
                    params.append(KernelArg(self.names(p.name), ArgKind.PTR, p.name))
                    if use.rank == 2:
                        params.append(KernelArg(f"{p.name}_rows", ArgKind.ROWS, p.name))
                        params.append(KernelArg(f"{p.name}_cols", ArgKind.COLS, p.name))
                        params.append(KernelArg(f"{p.name}_stride", ArgKind.STRIDE, p.name))
                    else:
                        sizes, strides = use.dims()
                        params += [KernelArg(x, ArgKind.SIZE, (p.name, i)) for i, x in enumerate(sizes)]
                        params += [KernelArg(x, ArgKind.STRIDE_I, (p.name, i)) for i, x in enumerate(strides[:-1])]
            else:
                params.append(KernelArg(self.names(p.name), ArgKind.SCALAR, p.name))
        if self.debug is not None:
            params.append(KernelArg("xs_dbg", ArgKind.DBG, None))
        return params

    def header(self, o: Emitter, exp2_used: bool):
        """Provenance, imports, constexprs, layout and mbarrier constants, helper functions."""
        k = self.kernel
        o.line(f"# Generated by xsync from kernel '{k.name}' ({k.file}:{k.loc.line}) for NVIDIA Hopper "
               f"(Triton 3.6-3.9 Gluon, sm_90a).")
        o.line("# Do not edit: change the kernel and regenerate (XSYNC_DUMP=<dir> writes this file).")
        if self.debug is not None:
            o.line(f"# Hang debug mode (XSYNC_DEBUG_HANG=1): every mbarrier wait first polls for at most "
                   f"{self.debug.timeout_ms} ms, then reports and traps.")
        o.line("from triton.experimental import gluon")
        o.line("from triton.experimental.gluon import language as gl")
        o.line("from triton.experimental.gluon.language.nvidia.hopper import (")
        o.line("    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)")
        o.line()
        o.line(TMA_LOAD_ALIAS)
        if self.plan.staging.tiles:
            o.line(TMA_STORE_ALIAS)
        if self.plan.staging.reduces():
            o.line(TMA_REDUCE_ADD_ALIAS)
        o.line()
        if k.constexprs:
            o.line("# constexprs of this specialization")
            for name, value in k.constexprs:
                o.line(f"{self.names(name)} = gl.constexpr({_const(value)})")
            o.line()
        o.line("# layouts")
        for c in self.plan.layouts.constants:
            o.line(f"{c.name} = gl.constexpr({c.ctor})  # {c.note}")
        o.line()
        o.line(f"# mbarriers: one array xs_bars[{max(1, self.num_bars)}]; index bases per sync object "
               f"(from the allocation table)")
        for key, base in self.bar_base.items():
            obj, side = key.split(":")
            n = self.bar_count[key]
            cnt = self.allocation.mbarrier(obj, side).arrive_count
            o.line(f"{obj.upper()}_{side.upper()} = gl.constexpr({base})  # {obj} {side}: "
                   f"xs_bars[{base}:{base + n}], arrive count {cnt}")
        o.line(f"XS_NUM_BARS = gl.constexpr({max(1, self.num_bars)})")
        if self.mc_base:
            o.line(f"# one program over a cluster of {self.allocation.cta_split.ctas} CTAs: xs_bars has one "
                   f"mbarrier per CTA; xs_bars_mc[{self.num_mc_bars}] lives on the lead CTA (multicast slots free)")
            for name, base in self.mc_base.items():
                per = self.allocation.mbarrier(name, "empty").arrive_count
                o.line(f"{name.upper()}_EMPTY_MC = gl.constexpr({base})  # {name} empty (multicast): "
                       f"xs_bars_mc[{base}:{base + self.kernel.sync_object(name).stages}], "
                       + ("1 arrive per CTA" if per == 1 else f"{per} arrives per CTA (1 per consumer replica)"))
            o.line(f"XS_NUM_MC_BARS = gl.constexpr({self.num_mc_bars})")
        if self.debug is not None:
            o.line(f"XS_BARS_SMEM = gl.constexpr({self.debug.bars_smem})  # byte offset of xs_bars in shared "
                   f"memory (read back from a first compile)")
        o.line()
        emit_helpers(o, self.debug)
        if exp2_used:
            o.line()
            o.line()
            for line in exp2.helper_lines(self.options.exp2_fma):
                o.line(line)

    def agent_functions(self, o: Emitter, agent_src: dict[str, Emitter], ws_args: list[str]):
        """One ``@gluon.jit`` function per agent: its counters, then its spelled program."""
        k = self.kernel
        for agent in self.placement.agents:
            o.line()
            o.line()
            o.line("@gluon.jit")
            o.line(f"def {k.name}_{agent.name}({', '.join(ws_args)}, REPLICA: gl.constexpr, AGENT_ID: gl.constexpr):")
            o.indent()
            o.line(f'"""{agent.hardware}: roles {", ".join(label(r) for r in agent.roles)}'
                   + (f" ({agent.replicas} replicas)" if agent.replicas > 1 else "") + '."""')
            for cname, note in counters(k, self.placement, self.plan.bodies[agent.name]):
                o.line(f"{cname} = 0  # {note}")
            o.dedent()
            o.lines += agent_src[agent.name].lines

    def entry_function(self, o: Emitter, pnames: list[str], ws_args: list[str], parts, agent_ids):
        """The kernel: shared memory (rings, staging tiles, mbarriers), then the partitions."""
        k = self.kernel
        o.line()
        o.line()
        o.line("@gluon.jit")
        o.line(f"def {self.names(k.name)}({', '.join(pnames)}):")
        o.indent()
        for p in k.pipes:
            if not self.placement.crosses(p):
                continue
            pairs = paired(self.allocation, p)
            ring = p.stages * (pairs or 1) if p.interleave == 1 else p.stages
            o.line(f"# pipe '{p.name}' (line {p.loc.line}): {p.src} -> {p.dst}, {p.stages} stage(s)"
                   + (f" x {pairs} replica pairs" if pairs and p.interleave == 1 else "")
                   + (f" shared by {pairs} replica pairs, stride {p.interleave}" if p.interleave > 1 else ""))
            for f in p.fields:
                lay = smem_name(f.shape, f.dtype, f.multicast and bool(self.mc_base))   # layouts.infer named it
                if lay not in self.layouts:
                    raise BackendError(f"internal: layout {lay} was not inferred before rendering", loc=k.loc)
                o.line(f"{p.name}_{f.name} = gl.allocate_shared_memory({GL_DTYPES[f.dtype.name]}, "
                       f"[{ring}, {f.shape[0]}, {f.shape[1]}], {lay})")
        split = self.allocation.cta_split
        for tile in self.plan.staging.tiles:
            rows, cols, dtype = tile.rows, tile.cols, tile.dtype
            lay = smem_name((rows, cols), dtype)      # a pipe's constant, where one has this shape
            lay = lay if lay in self.layouts else nvmma_shared_repr(
                (rows, cols), dtype, split.bases(2, True) if split is not None else None)
            o.line(f"# TMA-store staging: one [{rows}, {cols}] {dtype.name} tile per '{tile.agent}' replica")
            o.line(f"{tile.name} = gl.allocate_shared_memory({GL_DTYPES[dtype.name]}, "
                   f"[{tile.replicas}, {rows}, {cols}], {lay})")
        if split is None:
            o.line("xs_bars = gl.allocate_shared_memory(gl.int64, [XS_NUM_BARS, 1], mbarrier.MBarrierLayout())")
        else:
            n = split.ctas
            o.line(f"xs_bars = gl.allocate_shared_memory(gl.int64, [XS_NUM_BARS, {n}], "
                   f"mbarrier.MBarrierLayout({split.bases(1, True)}))  # one per CTA")
        if self.mc_base:
            o.line(f"xs_bars_mc = gl.allocate_shared_memory(gl.int64, [XS_NUM_MC_BARS, 1], "
                   f"mbarrier.MBarrierLayout({split.bases(1, False)}))  # on the lead CTA, count x {split.ctas}")
            for name, base in self.mc_base.items():
                cnt = self.allocation.mbarrier(name, "empty").arrive_count
                for i in range(self.kernel.sync_object(name).stages):
                    o.line(f"mbarrier.init(xs_bars_mc.index({name.upper()}_EMPTY_MC + {i}), count={cnt})")
        for key, base in self.bar_base.items():
            obj, side = key.split(":")
            cnt = self.allocation.mbarrier(obj, side).arrive_count
            for i in range(self.bar_count[key]):
                o.line(f"mbarrier.init(xs_bars.index({obj.upper()}_{side.upper()} + {i}), count={cnt})")
        if not self.bar_base:
            o.line("mbarrier.init(xs_bars.index(0), count=1)  # unused")
        o.line("fence_async_shared()")
        calls = [(f"({k.name}_{agent.name}, ({', '.join(ws_args)}, {replica}, {agent_ids[label]}))", label, warps, regs)
                 for label, agent, replica, warps, regs in parts]
        if len(calls) == 1:
            o.line(f"{k.name}_{parts[0][1].name}({', '.join(ws_args)}, 0, 0)")
        else:
            o.line("gl.warp_specialize([")
            for i, (c, label, warps, regs) in enumerate(calls):
                kind = "default partition" if i == 0 else f"worker {i}"
                o.line(f"    {c},  # {label}: {kind}, {warps} warp(s)" + (f", {regs} registers" if i else ""))
            o.line(f"], {[w for _, _, w, _ in calls[1:]]}, {[r for _, _, _, r in calls[1:]]})")
        o.dedent()


def render(kernel: ir.KernelIR, placement: Placement, allocation: HopperAllocation,
           options: RenderOptions | None = None):
    """The Gluon module of ``kernel``: its decisions planned (:func:`planning.plan`), then spelled."""
    if allocation.cta_split is not None:     # one program over the cluster's CTAs (cluster_ctas.py)
        if options is not None and options.debug_hang:
            raise BackendError("hang debug mode does not poll the barriers of a kernel spread over a "
                               "cluster's CTAs (its mbarriers are per CTA and on the lead CTA)",
                               loc=kernel.loc, fix="run it without XSYNC_DEBUG_HANG; a hang there shows "
                                                   "in the CPU emulator and the verifier too")
        kernel = allocation.cta_split.kernel
    plan = planning.plan(kernel, placement, allocation, options)
    # the kernel's names spelled apart from the generator's (xsync/backends/spelling.py): a probe
    # render tells which names the generator writes
    probe = Spelling.probe(kernel)
    names = probe.settle(NvidiaRenderer(kernel, placement, allocation, plan, options, probe).render().source)
    return NvidiaRenderer(kernel, placement, allocation, plan, options, names).render()
