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
* a consumer's ``xs.store`` of a whole tile (at least 8 rows of at least 16 bytes) to a
  tensor the kernel never reads, outside any loop but a tile loop (``xs.tile_range``: the
  bulk copies of one location would not be ordered), where shared memory has room beside the
  pipes (:data:`STAGING_SMEM_LIMIT`, or the renderer option ``staging_smem_limit``; half that for two CTAs per SM), goes through a staging tile per consumer replica and a TMA store
  (``xs_tma_store``, :data:`TMA_STORE_ALIAS`) when the tile lies inside its bounds and the
  tensor suits TMA (the ``<tensor>_tma_ok`` argument), so the partition moves on while the copy
  engine writes it; otherwise, and for the tiles a boundary cuts, the masked ``gl.store``;
* with the option ``exp2_fma`` (1/4, 1/2), that share of an accumulator tile's ``xs.exp2`` is
  computed by a polynomial on the FMA pipe instead of the special-function unit (:mod:`.exp2`);
* with the option ``prefetch_tile_scalars``, a consumer's persistent tile loop issues its table
  reads (``xs.load_scalar``) tiles ahead of their tile, in the stages :mod:`.prefetch` builds;
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
and verified: the renderer spells the agent programs it is given
(``KernelIR.programs``) -- pass-made waits (``ir.MmaWait``), guarded releases (a predicated
``mbarrier.arrive``) and the passes' barriers (named barriers like any other).

Hang debug mode (``debug_hang=True``, ``XSYNC_DEBUG_HANG=1``): every mbarrier wait is
preceded by a bounded ``mbarrier.try_wait.parity`` poll (inline PTX, %globaltimer
budget); on timeout the thread writes (agent, wait site, iteration) into a host-mapped
int32 buffer and traps. The poll addresses the barrier as ``global_smem + offset``; the
offset of ``xs_bars`` is only known after a first compile (see ``__init__``), so it is a
module constant ``XS_BARS_SMEM``.
"""
from __future__ import annotations

from dataclasses import dataclass

from xsync.dtypes import DType
from xsync.backends.source import Emitter, PythonRenderer
from xsync.errors import BackendError
from xsync.lowering import ir
from xsync.backends.nvidia.alloc import TWO_CTA_SMEM_BYTES, HopperAllocation, is_tma_pipe, two_ctas_fit
from xsync.backends.nvidia import exp2, prefetch
from xsync.backends.nvidia.abi import ArgKind, KernelArg
from xsync.backends.nvidia.options import RenderOptions
from xsync.backends.nvidia.layouts import ModuleLayouts, infer, nvmma_shared_repr
from xsync.backends.nvidia.sync_ops import SyncSpeller, WaitSite  # noqa: F401 - WaitSite: part of RenderResult
from xsync.backends.nvidia.values import SCALAR, T, TensorUse, ValueSpeller
from xsync.lowering.passes.dataflow import names_in
from xsync.lowering.placement import Placement, Unit
from xsync.lowering.slicing import agent_body

# The TMA global->shared load is spelled differently across the supported Triton versions:
# 3.6/3.7 only have tma.async_copy_global_to_shared, 3.8 adds tma.async_load (same
# positional arguments) and keeps the old name, 3.9 makes the old name raise. The
# generated module feature-detects it once, in its header.
TMA_LOAD_ALIAS = ('xs_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared'
                  '  # Triton >= 3.8 / 3.6-3.7 spelling')
TMA_STORE_ALIAS = ('xs_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global'
                   '  # Triton >= 3.9 / 3.6-3.8 spelling')
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


@dataclass
class RenderResult:
    source: str
    kernel_name: str                 # the @gluon.jit entry point
    params: list                     # [(name, kind, extra)] in kernel-argument order
    tensors: dict                    # name -> TensorUse
    partitions: list                 # [(label, agent, replica, warps, regs)]
    num_warps: int
    wait_sites: list
    agent_ids: dict                  # partition label -> debug agent id
    num_bars: int
    debug_hang: bool
    descriptor_layouts: dict         # desc param -> (tensor, [rows, cols], element DType)
    layouts: ModuleLayouts           # types and layouts of every agent (layouts.infer)


class NvidiaRenderer(ValueSpeller, SyncSpeller, PythonRenderer):
    def __init__(self, kernel: ir.KernelIR, placement: Placement, allocation: HopperAllocation,
                 options: RenderOptions | None = None):
        self.kernel = kernel
        self.placement = placement
        self.allocation = allocation
        self.options = options if options is not None else RenderOptions()
        self.debug_hang = bool(self.options.debug_hang)
        self.bars_smem = int(self.options.bars_smem)
        self.timeout_ms = int(self.options.hang_timeout_ms)
        self.consts = dict(kernel.constexpr_values)
        self.wait_sites: list[WaitSite] = []
        self.tensors: dict[str, TensorUse] = {}
        self.bar_base: dict[str, int] = {}       # "tiles:full" -> index base in xs_bars
        self.bar_count: dict[str, int] = {}
        self.num_bars = 0
        self.tmp = 0
        # TMA stores: (agent, rows, cols, DType) -> staging buffer name; (tensor, shape) -> descriptor
        self.staging: dict[tuple, str] = {}
        self.read_tensors: set[str] = set()      # read by xs.load somewhere (_collect_tensors)
        self.loops: list[bool] = []              # enclosing loops while rendering: tile loop?
        self.store_descs: dict[tuple, str] = {}
        self.staging_bytes = 0
        self.tma_store = self.options.tma_store is not False
        self.exp2_fma_used = False               # a share of a tile's exp2 on the FMA pipe (exp2.py)
        self._check_supported()
        self._collect_tensors()
        self._assign_barriers()
        # types and layouts of every agent, once, before any text (layouts.py)
        self.module_layouts: ModuleLayouts = infer(kernel, placement, allocation, self.consts, self.tensors)
        self.layouts = {c.name: c for c in self.module_layouts.constants}

    # ------------------------------------------------------------ errors
    def fail(self, what, loc=None, objects=(), fix=""):
        raise BackendError(what, loc=loc or self.kernel.loc, objects=tuple(objects), fix=fix)

    def _check_supported(self):
        for p in self.kernel.pipes:
            if self.placement.crosses(p):
                for f in p.fields:
                    if len(f.shape) != 2:
                        self.fail(f"pipe '{p.name}' field '{f.name}' has shape {list(f.shape)}; the Hopper "
                                  f"lowering keeps 2-D tiles in shared memory", loc=p.loc, objects=(p.name,),
                                  fix="use 2-D tiles for pipe fields")

    # ------------------------------------------------------------ analysis
    def _collect_tensors(self):
        for p in self.kernel.params:
            if p.kind == "tensor":
                self.tensors[p.name] = TensorUse(p.name, p.dtype)
        tma_pipes = {p.name for p in self.kernel.pipes if self.placement.crosses(p) and is_tma_pipe(self.kernel, p)}
        tma_loads = set()
        live = tuple(x for a in self.placement.agents for x in agent_body(self.kernel, a))
        for s in ir.walk(live):
            if isinstance(s, ir.SlotWrite) and s.pipe in tma_pipes:
                call = s.value
                t = call.args[0].id
                shape = self.shape_of(call.args[2], s.loc)
                spec = self.kernel.sync_object(s.pipe).field(s.field)
                if tuple(spec.shape) != shape:
                    self.fail(f"xs.load of {list(shape)} into field '{s.field}' {list(spec.shape)} of pipe "
                              f"'{s.pipe}'", loc=s.loc, objects=(s.pipe,), fix="load the field's shape")
                use = self.tensors[t]
                if spec.dtype != use.dtype:
                    self.fail(f"TMA copy of `{t}` ({use.dtype.name}) into field '{s.field}' "
                              f"({spec.dtype.name}) of pipe '{s.pipe}'", loc=s.loc, objects=(s.pipe,),
                              fix="declare the field with the tensor's dtype (a.dtype)")
                use.descs.setdefault(shape, None)
                tma_loads.add(id(call))
        for s in ir.walk(live):
            exprs = []
            if isinstance(s, ir.Store):
                self.tensors[s.tensor].pointer = True
                exprs = [s.value, *s.offsets, *(s.bounds or ())]
            elif isinstance(s, (ir.Assign, ir.SlotWrite)):
                exprs = [s.value]
            elif isinstance(s, ir.For):
                exprs = [s.start, s.stop, s.step]
            elif isinstance(s, ir.If):
                exprs = [s.cond]
            for e in exprs:
                for c in ir.expr_calls(e):
                    if c.op == "load":
                        self.read_tensors.add(c.args[0].id)
                    if c.op == "load" and id(c) not in tma_loads:
                        self.tensors[c.args[0].id].pointer = True
                    elif c.op == "load_scalar":
                        self.tensors[c.args[0].id].table = True
        for use in self.tensors.values():
            many = len(use.descs) > 1
            for shape in list(use.descs):
                use.descs[shape] = f"{use.name}_desc" + (f"_{shape[0]}x{shape[1]}" if many else "")

    def _assign_barriers(self):
        # mbarrier groups as the allocation sized them (rings x stages, from the skeleton)
        k = 0
        for g in self.allocation.mbarriers:
            self.bar_base[f"{g.obj}:{g.side}"] = k
            self.bar_count[f"{g.obj}:{g.side}"] = g.barriers
            k += g.barriers
        self.num_bars = k

    def _paired(self, obj) -> int:
        """Replica count when obj links replica i to replica i (each pair has its own ring)."""
        link = self.allocation.skeleton.link(obj.name)
        return link.rings if link.paired else 0

    def barrier_threads(self, b: ir.Barrier) -> int:
        return self.allocation.named_barrier(b.name).threads

    # ------------------------------------------------------------ statements
    def render_agent_body(self, agent, replica_count, stmts):
        self.env: dict[str, T] = {}
        self.slot_pipe: dict[str, ir.Pipe] = {}
        self.tmp = 0
        self.mma_reads: dict[str, list] = {}
        self.last_mma_reads = []
        self.loc = self.kernel.loc
        self.agent = agent
        self.usual_cols = None
        self.role = agent.roles[0]
        self.role_block = None
        self.agent_tma_stores = False
        inferred = self.module_layouts.agents[agent.name]
        self.wants = inferred.wants
        self.block(stmts)
        if self.agent_tma_stores:
            self.out.line("tma.store_wait(0)  # the TMA stores have read their staging tiles before the partition ends")
        # the types come from LayoutRules, but the renderer's walk (this module, sync_ops)
        # keeps its own variables: they must end as the inference's walk ended
        drift = sorted(n for n, t in self.env.items() if inferred.variables.get(n, t if t.kind == "scalar" else None) != t)
        if drift:
            self.fail(f"internal: the rendered types of {drift} in agent '{agent.name}' differ from the inferred ones",
                      fix="report this kernel: the renderer and xsync/backends/nvidia/layouts.py disagree")

    def block(self, stmts):
        if not stmts:
            self.out.line("pass")
        for s in stmts:
            self.loc = getattr(s, "loc", self.loc)
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
            o.line(f"# role '{s.role}' (line {s.loc.line})")
            self.role, outer = s.role, self.role_block
            self.role_block = s.role
            self.block(s.body)
            self.role_block = outer
        elif isinstance(s, ir.For):
            ahead = self.reads_ahead(s)
            if s.single_tile:    # one program per tile: no loop state to carry
                o.line(f"{s.var} = {self.tx(s.start)[0]}  # line {s.loc.line}: one tile per program")
                o.line(f"if {s.var} < {self.tx(s.stop)[0]}:")
            else:
                if ahead is not None:
                    o.line(f"# line {s.loc.line}: the tile loop's table reads go out ahead of their tiles "
                           f"(prefetch.py: chains of {ahead.depth})")
                    self.groups(ahead.warmup)
                o.line(f"for {s.var} in range({self.tx(s.start)[0]}, {self.tx(s.stop)[0]}, "
                       f"{self.tx(s.step)[0]}):  # line {s.loc.line}")
            self.env[s.var] = SCALAR
            self.loops.append(s.tile_loop)
            o.indent()
            if ahead is not None:
                self.groups(ahead.head)
                if ahead.rest:
                    self.block(ahead.rest)
            else:
                self.block(s.body)
            o.dedent()
            self.loops.pop()
        elif isinstance(s, ir.If):
            o.line(f"if {self.tx(s.cond)[0]}:  # line {s.loc.line}")
            o.indent()
            self.block(s.body)
            o.dedent()
            if s.orelse:
                o.line("else:")
                o.indent()
                self.block(s.orelse)
                o.dedent()
        elif isinstance(s, ir.SyncOp):
            self.sync(s)
        elif isinstance(s, ir.MmaWait):
            targets = ", ".join(s.targets)
            o.line(f"{targets} = warpgroup_mma_wait({s.pending}, deps=[{targets}])  # line {s.loc.line}: {s.note}")
        else:
            raise TypeError(f"cannot render {s!r}")

    def reads_ahead(self, loop: ir.For):
        """The tile loop's table reads issued ahead of their tiles (prefetch.py), where the
        option asks for it and the loop is a consumer warpgroup's; else None."""
        if not self.options.prefetch_tile_scalars or not loop.tile_loop or loop.single_tile:
            return None
        if self.allocation.partitions_of(self.agent.name)[0].unit != Unit.CONSUMER:
            return None
        taken = names_in(self.kernel) | set(self.env)
        got = prefetch.plan(loop, lambda e: self.type_of(e).kind == "scalar", taken)
        return None if isinstance(got, str) else got

    def groups(self, groups):
        for what, stmts in groups:
            self.out.line(f"# {what}")
            self.block(stmts)

    def assign(self, s: ir.Assign):
        o = self.out
        v = s.value
        if len(s.targets) > 1:
            if not isinstance(v, ir.TupleExpr):
                self.fail("tuple assignment needs a tuple", loc=s.loc)
            parts = [self.tx(x) for x in v.items]
            o.line(f"{', '.join(s.targets)} = {', '.join(c for c, _ in parts)}")
            for n, (_, t) in zip(s.targets, parts):
                self.env[n] = t
            return
        target = s.targets[0]
        if isinstance(v, ir.Name) and v.id in self.slot_pipe:
            # a slot kept under another name (overlap-softmax: the previous block's K/V slot)
            self.slot_pipe[target] = self.slot_pipe[v.id]
            self.env[target] = SCALAR
            o.line(f"{target} = {v.id}  # line {s.loc.line}: the slot of '{self.slot_pipe[v.id].name}' kept")
            return
        prev, want = self.assigned_type(target, v)   # a loop-carried value keeps one layout
        if isinstance(v, ir.Call) and v.op == "mma_wait":
            c, t = self.tx(v.args[0], want)
            n = int(self.cval(v.kwarg("pending", ir.Const(0)), "mma_wait pending", s.loc))
            reads = self.mma_reads.get(v.args[0].id, []) if isinstance(v.args[0], ir.Name) else []
            deps = [c] + reads
            lhs = target + (", " + ", ".join("_" for _ in reads) if reads else "")
            o.line(f"{lhs} = warpgroup_mma_wait({n}, deps=[{', '.join(deps)}])"
                   f"  # line {s.loc.line}: wait until <= {n} wgmma in flight")
            self.env[target] = t
            return
        self.last_mma_reads = []
        asked, natural, t = self.definition(target, v, prev, want)
        code = self.view(self.spell(v, natural, asked, 0), natural, t)
        note = f"  # line {s.loc.line}: async wgmma" if isinstance(v, ir.Call) and v.op == "mma" else ""
        o.line(f"{target} = {code}{note}")
        if self.last_mma_reads:
            self.mma_reads[target] = list(self.last_mma_reads)
        self.define(target, t)

    def store(self, s: ir.Store):
        if self.row_vector(s.value):
            return self.row_store(s)
        o = self.out
        c, t = self.tx(s.value)
        if t.kind != "tile" or len(t.shape) != 2:
            self.fail("xs.store writes 2-D tiles", loc=s.loc)
        lay = t.layout
        tn = s.tensor
        val = self.fresh("val")
        r, cc = self.fresh("rows"), self.fresh("cols")
        dtype = self.dtype(self.tensors[tn].dtype)
        stage = self.staging_tile(tn, t)
        r0, c0 = (self.tx(x)[0] for x in s.offsets)
        bounds = [self.tx(x)[0] for x in s.bounds] if s.bounds else []
        if stage is None:
            o.line(f"# line {s.loc.line}: xs.store({tn}, ...) -- out-of-bounds parts are masked off")
            o.line(f"{val} = {c}")
        else:
            stage_buf, desc = stage
            inside = [f"{tn}_tma_ok != 0"]
            if bounds:
                inside += [f"{r0} + {t.shape[0]} <= {bounds[0]}", f"{c0} + {t.shape[1]} <= {bounds[1]}"]
            o.line(f"# line {s.loc.line}: xs.store({tn}, ...) -- a tile inside its bounds: TMA store from "
                   f"shared memory (the copy engine clips at the tensor's edges); else masked off")
            o.line(f"{val} = {c}")
            o.line(f"if {' & '.join(f'({x})' for x in inside)}:")
            o.indent()
            o.line("tma.store_wait(0)  # this partition's previous TMA store has read the staging tile")
            o.line(f"{stage_buf}.index(REPLICA).store({val}.to({dtype}))")
            o.line("fence_async_shared()")
            o.line(f"xs_tma_store({desc}, [{r0}, {c0}], {stage_buf}.index(REPLICA))")
            o.dedent()
            o.line("else:")
            o.indent()
        o.line(f"{r} = {r0} + gl.arange(0, {t.shape[0]}, layout=gl.SliceLayout(1, {lay}))")
        o.line(f"{cc} = {c0} + gl.arange(0, {t.shape[1]}, layout=gl.SliceLayout(0, {lay}))")
        self.masked_store(tn, f"{r}[:, None]", f"{cc}[None, :]", val, bounds)
        if stage is not None:
            o.dedent()

    def masked_store(self, tn: str, rows: str, cols: str, val: str, bounds: list):
        """gl.store of ``val`` at (``rows``, ``cols``) of ``tn``, masked to the tensor and ``bounds``."""
        mask = f"({rows} < {tn}_rows) & ({cols} < {tn}_cols)"
        if bounds:
            mask += f" & ({rows} < {bounds[0]}) & ({cols} < {bounds[1]})"
        self.out.line(f"gl.store({tn} + {rows}.to(gl.int64) * {tn}_stride + {cols}, "
                      f"{val}.to({self.dtype(self.tensors[tn].dtype)}), mask={mask})")

    def row_store(self, s: ir.Store):
        """``xs.store(t, [r, c], v[None, :])`` of a 1-D tile ``v``: a masked store in ``v``'s
        own layout (the softmax's per-row statistics live in a slice of the accumulator layout;
        a [1, n] tile would take them to its column slice first)."""
        o = self.out
        c, t = self.tx(s.value.value)
        tn = s.tensor
        val, r, cc = self.fresh("val"), self.fresh("row"), self.fresh("cols")
        r0, c0 = (self.tx(x)[0] for x in s.offsets)
        bounds = [self.tx(x)[0] for x in s.bounds] if s.bounds else []
        o.line(f"# line {s.loc.line}: xs.store({tn}, ...) -- one row, in the layout its values live in; "
               f"out-of-bounds parts are masked off")
        o.line(f"{val} = {c}")
        o.line(f"{r} = {r0} + gl.zeros([{t.shape[0]}], gl.int32, layout={t.layout})")
        o.line(f"{cc} = {c0} + gl.arange(0, {t.shape[0]}, layout={t.layout})")
        self.masked_store(tn, r, cc, val, bounds)

    def staging_tile(self, tensor: str, t: T):
        """(staging buffer, descriptor parameter) for a TMA store of tile ``t`` into ``tensor``
        from this agent, or None where the store stays a masked gl.store: not a consumer
        warpgroup, a tensor the kernel reads, a loop around it that is not a tile loop, a tile
        under TMA_STORE_MIN_ROWS rows or 16 bytes a row, or no room."""
        part = self.allocation.partitions_of(self.agent.name)[0]
        dt = self.tensors[tensor].dtype
        rows, cols = t.shape
        row_bytes = cols * dt.bytes
        if (not self.tma_store or part.unit != Unit.CONSUMER or tensor in self.read_tensors
                or not all(self.loops) or rows < TMA_STORE_MIN_ROWS or rows > 256 or cols > 256
                or row_bytes < 16 or row_bytes % 16):
            return None
        key = (self.agent.name, rows, cols, dt)
        buf = self.staging.get(key)
        if buf is None:
            need = self.agent.replicas * rows * row_bytes
            smem = self.allocation.smem_bytes + self.staging_bytes + need
            limit = TWO_CTA_SMEM_BYTES if two_ctas_fit(self.allocation.partitions, self.allocation.smem_bytes) \
                else int(STAGING_SMEM_LIMIT if self.options.staging_smem_limit is None
                        else self.options.staging_smem_limit)
            if smem > limit:
                return None
            buf = self.staging[key] = f"xs_stage_{self.agent.name}_{rows}x{cols}_{dt.name}"
            self.staging_bytes += need
        desc = self.store_descs.get((tensor, (rows, cols)))
        if desc is None:
            many = any(tn == tensor for tn, _ in self.store_descs)
            desc = f"{tensor}_store_desc" + (f"_{rows}x{cols}" if many else "")
            self.store_descs[(tensor, (rows, cols))] = desc
        self.agent_tma_stores = True
        return buf, desc

    def slot_write(self, s: ir.SlotWrite):
        o = self.out
        pipe = self.kernel.sync_object(s.pipe)
        spec = pipe.field(s.field)
        if not self.placement.crosses(pipe):
            c, t = self.tx(s.value)
            o.line(f"{pipe.name}_{s.field} = {c}  # line {s.loc.line}: {s.slot}.{s.field} (same partition: registers)")
            self.env[f"{pipe.name}_{s.field}"] = t
            return
        full = self.bar_index(pipe, "full", s.slot)
        if is_tma_pipe(self.kernel, pipe):
            call = s.value
            t = call.args[0].id
            desc = self.tensors[t].descs[tuple(spec.shape)]
            offs = ", ".join(self.tx(x)[0] for x in call.args[1].items)
            o.line(f"xs_tma_load({desc}, [{offs}], {full}, {pipe.name}_{s.field}.index({s.slot}))"
                   f"  # line {s.loc.line}: {s.slot}.{s.field} = xs.load(...)")
            return
        c, t = self.tx(s.value)
        if t.kind == "tile" and t.dtype is not None and t.dtype != spec.dtype:
            c = f"({c}).to({self.dtype(spec.dtype)})"
        o.line(f"{pipe.name}_{s.field}.index({s.slot}).store({c})  # line {s.loc.line}: {s.slot}.{s.field} = ...")

    # ------------------------------------------------------------ module
    def render(self) -> RenderResult:
        k = self.kernel
        self.out = body_out = Emitter()
        parts = []
        for part in self.allocation.partitions:
            parts.append((part.label, self.placement.agent(part.agent), part.replica, part.warps, part.regs))
        if self.allocation.partitions[0].unit != Unit.CONSUMER:
            self.fail("the default partition must be a 4-warp consumer warpgroup",
                      fix="give the kernel at least one matrix or vector role")
        agent_ids = {p[0]: i for i, p in enumerate(parts)}

        # agent functions, each spelled once with the layouts inferred for it
        agent_src = {}
        for agent in self.placement.agents:
            self.warps = self.allocation.partitions_of(agent.name)[0].warps
            stmts = agent_body(k, agent)
            self.out = Emitter()
            self.out.depth = 1
            self.render_agent_body(agent, agent.replicas, stmts)
            agent_src[agent.name] = (self.out, stmts)

        # kernel parameters
        params: list[KernelArg] = []
        for p in k.params:
            if p.kind is ir.ParamKind.CONSTEXPR:
                continue
            if p.kind is ir.ParamKind.TENSOR:
                use = self.tensors[p.name]
                for shape, dname in use.descs.items():
                    params.append(KernelArg(dname, ArgKind.DESC, (p.name, shape)))
                if use.table and not use.pointer:
                    params.append(KernelArg(p.name, ArgKind.TABLE, p.name))
                store_shapes = [(shape, d) for (tn, shape), d in self.store_descs.items() if tn == p.name]
                for shape, dname in store_shapes:
                    params.append(KernelArg(dname, ArgKind.STORE_DESC, (p.name, shape)))
                if store_shapes:
                    params.append(KernelArg(f"{p.name}_tma_ok", ArgKind.STORE_OK, p.name))
                if use.pointer:
                    params.append(KernelArg(p.name, ArgKind.PTR, p.name))
                    params.append(KernelArg(f"{p.name}_rows", ArgKind.ROWS, p.name))
                    params.append(KernelArg(f"{p.name}_cols", ArgKind.COLS, p.name))
                    params.append(KernelArg(f"{p.name}_stride", ArgKind.STRIDE, p.name))
            else:
                params.append(KernelArg(p.name, ArgKind.SCALAR, p.name))
        if self.debug_hang:
            params.append(KernelArg("xs_dbg", ArgKind.DBG, None))
        pnames = [n for n, _, _ in params]

        smem_args = []
        for p in k.pipes:
            if self.placement.crosses(p):
                smem_args += [f"{p.name}_{f.name}" for f in p.fields]
        smem_args += list(self.staging.values())
        ws_args = pnames + smem_args + ["xs_bars"]

        o = body_out
        o.line(f"# Generated by xsync from kernel '{k.name}' ({k.file}:{k.loc.line}) for NVIDIA Hopper "
               f"(Triton 3.6-3.9 Gluon, sm_90a).")
        o.line("# Do not edit: change the kernel and regenerate (XSYNC_DUMP=<dir> writes this file).")
        if self.debug_hang:
            o.line(f"# Hang debug mode (XSYNC_DEBUG_HANG=1): every mbarrier wait first polls for at most "
                   f"{self.timeout_ms} ms, then reports and traps.")
        o.line("from triton.experimental import gluon")
        o.line("from triton.experimental.gluon import language as gl")
        o.line("from triton.experimental.gluon.language.nvidia.hopper import (")
        o.line("    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)")
        o.line()
        o.line(TMA_LOAD_ALIAS)
        if self.staging:
            o.line(TMA_STORE_ALIAS)
        o.line()
        if k.constexprs:
            o.line("# constexprs of this specialization")
            for name, value in k.constexprs:
                o.line(f"{name} = gl.constexpr({self.const(value) if isinstance(value, DType) else repr(value)})")
            o.line()
        o.line("# layouts")
        for c in self.module_layouts.constants:
            o.line(f"{c.name} = gl.constexpr({c.ctor})  # {c.note}")
        o.line()
        o.line(f"# mbarriers: one array xs_bars[{max(1, self.num_bars)}]; index bases per sync object "
               f"(from the allocation table)")
        for key, base in self.bar_base.items():
            obj, side = key.split(":")
            n = self.bar_count[key]
            cnt = self._init_count(obj, side)
            o.line(f"{obj.upper()}_{side.upper()} = gl.constexpr({base})  # {obj} {side}: "
                   f"xs_bars[{base}:{base + n}], arrive count {cnt}")
        o.line(f"XS_NUM_BARS = gl.constexpr({max(1, self.num_bars)})")
        if self.debug_hang:
            o.line(f"XS_BARS_SMEM = gl.constexpr({self.bars_smem})  # byte offset of xs_bars in shared "
                   f"memory (read back from a first compile)")
        o.line()
        self.helpers(o)
        if self.exp2_fma_used:
            o.line()
            o.line()
            for line in exp2.helper_lines(self.options.exp2_fma):
                o.line(line)

        for agent in self.placement.agents:
            out, stmts = agent_src[agent.name]
            o.line()
            o.line()
            o.line("@gluon.jit")
            o.line(f"def {k.name}_{agent.name}({', '.join(ws_args)}, REPLICA: gl.constexpr, AGENT_ID: gl.constexpr):")
            o.indent()
            o.line(f'"""{agent.hardware}: roles {", ".join(agent.roles)}'
                   + (f" ({agent.replicas} replicas)" if agent.replicas > 1 else "") + '."""')
            for cname, note in self.counters(stmts):
                o.line(f"{cname} = 0  # {note}")
            o.dedent()
            o.lines += out.lines

        o.line()
        o.line()
        o.line("@gluon.jit")
        o.line(f"def {k.name}({', '.join(pnames)}):")
        o.indent()
        for p in k.pipes:
            if not self.placement.crosses(p):
                continue
            ring = p.stages * (self._paired(p) or 1)
            o.line(f"# pipe '{p.name}' (line {p.loc.line}): {p.src} -> {p.dst}, {p.stages} stage(s)"
                   + (f" x {self._paired(p)} replica pairs" if self._paired(p) else ""))
            for f in p.fields:
                lay = self.smem_layout(f.shape, f.dtype)
                o.line(f"{p.name}_{f.name} = gl.allocate_shared_memory({self.dtype(f.dtype)}, "
                       f"[{ring}, {f.shape[0]}, {f.shape[1]}], {lay})")
        for (agent_name, rows, cols, dtype), buf in self.staging.items():
            reps = self.placement.agent(agent_name).replicas
            lay = f"SMEM_{dtype.name.upper()}_{rows}x{cols}"      # a pipe's constant, where one has this shape
            lay = lay if lay in self.layouts else nvmma_shared_repr((rows, cols), dtype)
            o.line(f"# TMA-store staging: one [{rows}, {cols}] {dtype.name} tile per '{agent_name}' replica")
            o.line(f"{buf} = gl.allocate_shared_memory({self.dtype(dtype)}, [{reps}, {rows}, {cols}], {lay})")
        o.line("xs_bars = gl.allocate_shared_memory(gl.int64, [XS_NUM_BARS, 1], mbarrier.MBarrierLayout())")
        for key, base in self.bar_base.items():
            obj, side = key.split(":")
            cnt = self._init_count(obj, side)
            for i in range(self.bar_count[key]):
                o.line(f"mbarrier.init(xs_bars.index({obj.upper()}_{side.upper()} + {i}), count={cnt})")
        if not self.bar_base:
            o.line("mbarrier.init(xs_bars.index(0), count=1)  # unused")
        o.line("fence_async_shared()")
        calls = []
        for label, agent, replica, warps, regs in parts:
            calls.append((f"({k.name}_{agent.name}, ({', '.join(ws_args)}, {replica}, {agent_ids[label]}))",
                          label, warps, regs))
        if len(calls) == 1:
            o.line(f"{k.name}_{parts[0][1].name}({', '.join(ws_args)}, 0, 0)")
        else:
            o.line("gl.warp_specialize([")
            for i, (c, label, warps, regs) in enumerate(calls):
                kind = "default partition" if i == 0 else f"worker {i}"
                o.line(f"    {c},  # {label}: {kind}, {warps} warp(s)" + (f", {regs} registers" if i else ""))
            o.line(f"], {[w for _, _, w, _ in calls[1:]]}, {[r for _, _, _, r in calls[1:]]})")
        o.dedent()

        src = o.source()
        desc_layouts = {}
        for n, kind, extra in params:
            if kind.descriptor:
                t, shape = extra
                desc_layouts[n] = (t, list(shape), self.tensors[t].dtype)
        return RenderResult(src, k.name, params, self.tensors,
                            [(lb, a.name, r, w, g) for lb, a, r, w, g in parts], 4,
                            self.wait_sites, agent_ids, self.num_bars, self.debug_hang, desc_layouts,
                            self.module_layouts)


def render(kernel: ir.KernelIR, placement: Placement, allocation: HopperAllocation,
           options: RenderOptions | None = None):
    return NvidiaRenderer(kernel, placement, allocation, options).render()
