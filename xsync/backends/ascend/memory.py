"""Ascend on-chip memory: what each core of an AI core must hold at once, from the lowered
kernel, checked against the 910B capacities before anything is rendered or compiled.

The HIVM compiler (bishengir-compile) places every tile of a device function in the core's
local memory (hivm-plan-memory) and fails with "ub overflow, requires N bits while 1572864
bits available" (or ``cbuf`` / ``cc``) when they do not fit. xsync estimates the peak from the
kernel's own statements, so ``xsync check --backend ascend`` and lowering refuse such a kernel
at the user's line with the numbers and a fix. The estimate is an upper bound of what
hivm-plan-memory places (calibrated on the library kernels and a corpus of row kernels,
reductions and elementwise chains; tests/ascend/test_ascend_memory.py).

Rules (a tile is a value with a shape; scalars cost nothing):

1. **Per core.** The kernel body is projected on each placed agent (the roles it runs, the
   shared control flow around them). An agent on a vector core plans the Unified Buffer (UB,
   192 KB); an agent on the cube plans L1 (``cbuf``, 512 KB) and L0C (``cc``, 128 KB). L0A/L0B
   (64 KB each) are not modelled: the compiler tiles the mmad operands into them itself.
2. **Sizes.** A tile costs ``prod(shape) * element bytes`` rounded up to 32 B (the UB block).
   Shapes come from the constexprs of the specialization; a load's dtype is its tensor's, a
   pipe slot field's its declaration's, arithmetic promotes to the wider type.
3. **Named tiles.** One buffer per name (a re-assignment, e.g. an accumulator, reuses it;
   its size is the largest definition). Liveness (first definition to last use, widened to
   the loops a name crosses or is carried around) only decides which names die where (4).
4. **Temporaries** of a statement: every tile node of the expression tree that is not a
   name. An arithmetic / exp2 / log2 / cast result reuses an operand temporary at least as
   large (in place), or a name whose last use this is (not one bound to a select's result:
   the compiler keeps those); else it is fresh. ``maximum`` /
   ``minimum`` / ``where`` are compare + select: a fresh result, a select buffer and a mask
   (1 B per element). A broadcast view (``x[:, None]``) and a transpose are fresh.
5. **Reductions** (``xs.max`` / ``xs.sum``) take a fresh result plus a work buffer of half
   their input (hivm-plan-memory's reduce temporary).
6. **Loads.** ``xs.load`` and a read of a pipe slot received through a GM workspace (a slot
   of a cross-core pipe read on a vector core) are fresh UB buffers. The compiler's
   ``--enable-auto-multi-buffer=True`` doubles loads inside loops only where the copies fit
   (plan-memory then fills UB / L0C up to exactly the capacity, never past it), so the
   estimate counts one copy: multi-buffering never turns a fit into an overflow.
7. **Cube.** Results of ``xs.mma`` and the accumulators passed to it (and ``xs.zeros`` /
   ``xs.full`` that become accumulators) live in L0C; every other tile of the cube's roles
   (loaded operands, slots of same-core pipes) lives in L1, counted once (6). A role whose
   replicas the cube runs in lockstep (``Agent.serial``) holds each named tile once per
   replica (the renderer unrolls them: ``dk_acc_r0``, ``dk_acc_r1``); dK/dV at BM = 64, d128
   needs its four 32 KB accumulators and four 32 KB Sᵀ/dPᵀ products at once: 256 KB of L0C,
   as plan-memory reports. L0C holds the tiles live at once: an accumulator around its loop,
   a product from its definition to its last read (the fixpipe moves it out), so the
   attention's S and PV products take turns (BM = 32, BN = 512, d128: 128 KB, as
   plan-memory places it). Sub-tile replicas (``passes/subtile_replicas.py``: more replicas than
   the two vector cores) store each product before the next replica's, so L0C holds one
   replica's (attention d128, 4 x 32 rows x 512 keys: 64 KB, as plan-memory places it). A
   transpose of an L1 tile feeding the cube is no copy (the L1 -> L0B load transposes). A
   same-core pipe between N replica pairs (N -> N) holds a slot per pair: each replica reads its
   own (``gemm_persistent_2wg``'s A tiles, two of them beside the one B tile); sub-tile replicas
   count one (calibrated on attention dQ d96/d128).
8. **Replicas and sub-block binding.** A vector agent with replicas runs them in lockstep in
   one device function. Without a cube (an ``aiv`` kernel) that function holds every
   replica's named tiles (x replicas); a statement's temporaries die before the next
   replica's copy of the statement, so they count once. In a mix kernel the compiler's sub-block binding gives each
   of the two vector cores half the rows of the vector loop nest; one core's share is taken as
   ``BINDING_SHARE`` (0.5) of one replica's estimate: its half of the rows. The share is
   checked, not derived: it gives the compiler's verdict on every mix kernel of the
   calibration set (attention d128 at BM=32 x 2 BN=512 and gemm_softmax 128 x 128 fit; attention
   d128 causal BM=64 BN=256, BM=128 BN=128, BM=64 BN=512 and gemm_softmax 128 x 512 /
   256 x 256 overflow; attention d128 non-causal BM=64 BN=256 is refused although the
   compiler places it). The compiler's peak of a fitting mix kernel is often above the
   scaled estimate (BM=32 x 2 BN=512 d128: 194016 B against 165 KB) because auto
   multi-buffering fills UB where the copies fit (rule 6); on overflowing ones its need
   was up to 1.4x the scaled estimate (attention d64 causal BM=64 BN=512), so a mix kernel
   within ~30% of UB may still overflow in bishengir-compile.
9. **The need** is every named tile plus every statement's temporaries, each counted once
   (hivm-plan-memory seldom gives a dead buffer to a later, different value; a loop body's
   temporaries are the same buffers each iteration), reductions sharing one work buffer (the
   largest), plus ``SCRATCH`` bytes of UB for the compiler's own small buffers. Above the capacity raises :class:`AllocationError` at the biggest tile's line,
   naming the core, the need vs. the capacity, the biggest tiles and a fix.

Calibration (bishengir-compile 1.2.0, tests/ascend/memory_cases.py): estimate / plan-memory
peak 1.00-1.05 on RMSNorm rows and elementwise chains, up to 2.3 on softmax rows and 1.5 on a
carried column loop (those are rejected early near the limit); never below 1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from xsync.dtypes import DType, float32, int1, int32
from xsync.errors import AllocationError, SourceLoc
from xsync.lowering import ir
from xsync.lowering.passes.subtile_replicas import subtiled
from xsync.lowering.placement import Unit

UB_BYTES = 192 * 1024        # a vector core's Unified Buffer (hivm: ub)
L1_BYTES = 512 * 1024        # the cube's L1 (hivm: cbuf)
L0C_BYTES = 128 * 1024       # the cube's accumulator buffer (hivm: cc)
BLOCK = 32                   # UB/L1 allocation granule (bytes)
SCRATCH = 1024               # the compiler's own small UB buffers (seen: 128 x f32, 8 x f32)
# --enable-auto-multi-buffer=True doubles loads inside loops only where the copies fit (seen:
# L0C and UB filled to exactly their capacity, never overflowed by it): not counted.
MULTI_BUFFER = 1

# Share of a mix kernel's vector tiles that one vector core holds after sub-block binding
# (half the rows each, plus the compiler's per-core temporaries): calibrated, see rule 8.
BINDING_SHARE = 0.5

ELEMENTWISE = (ir.TileOp.EXP2, ir.TileOp.LOG2, ir.TileOp.WHERE, ir.TileOp.MAXIMUM, ir.TileOp.MINIMUM,
               ir.TileOp.POW) + ir.UNARY_MATH
REDUCTIONS = (ir.TileOp.MAX, ir.TileOp.SUM)
SELECTS = ("maximum", "minimum", "where")    # compare + select: the result is a fresh buffer


class Memory:
    """A local memory of an AI core, by the name the HIVM compiler gives it."""

    UB = "ub"
    L1 = "cbuf"
    L0C = "cc"


CAPACITY = {Memory.UB: UB_BYTES, Memory.L1: L1_BYTES, Memory.L0C: L0C_BYTES}
LABEL = {Memory.UB: "unified buffer (UB)", Memory.L1: "L1", Memory.L0C: "L0C"}


@dataclass(frozen=True)
class Tile:
    """One buffer of the estimate: a named tile or a statement's temporary."""

    what: str                 # a name, or the temporary's spelling ("load", "sum", ...)
    bytes: int
    loc: SourceLoc | None = None


@dataclass(frozen=True)
class CoreMemory:
    """The peak need of one local memory of one placed agent."""

    agent: str
    unit: Unit
    memory: str               # Memory.UB / L1 / L0C
    need: int                 # bytes at the peak
    capacity: int
    tiles: tuple[Tile, ...]   # the peak's buffers, biggest first
    loc: SourceLoc | None = None

    @property
    def fits(self) -> bool:
        return self.need <= self.capacity

    def describe(self) -> str:
        big = ", ".join(f"{t.what} {t.bytes} B" for t in self.tiles[:4])
        return (f"{self.agent} ({self.unit.value} core) {LABEL[self.memory]}: {self.need} B of "
                f"{self.capacity} B" + (f" (peak: {big})" if big else ""))


@dataclass(frozen=True)
class MemoryPlan:
    cores: tuple[CoreMemory, ...] = ()

    def need(self, memory: str) -> int:
        return max((c.need for c in self.cores if c.memory == memory), default=0)

    def describe(self) -> str:
        return "\n".join(c.describe() for c in self.cores)


@dataclass
class _Value:
    shape: tuple[int, ...]
    dtype: DType
    named: str = ""           # the name it is read from ("" = a temporary)
    fresh: int = 0            # bytes of a buffer this node needs and nobody has booked yet
    what: str = ""            # how the buffer is named in messages
    acc: bool = False         # an mma result (L0C)
    select: bool = False      # the result of a compare + select
    copies: int = 1           # multi-buffered copies

    @property
    def bytes(self) -> int:
        if not self.shape:
            return 0
        return -(-math.prod(self.shape) * self.dtype.bytes // BLOCK) * BLOCK


@dataclass
class _Step:
    """One statement of a core's program, flattened: names read / defined and temporaries."""

    pos: int
    loc: SourceLoc | None
    reads: set = field(default_factory=set)
    defines: set = field(default_factory=set)
    temps: list = field(default_factory=list)       # (memory, Tile)
    loops: tuple = ()                                # enclosing loop ids
    maybe_reuse: list = field(default_factory=list) # (bytes, names): a result a dying name may hold


def plan(kernel: ir.KernelIR, placement) -> MemoryPlan:
    """The peak need of every local memory of every placed agent (rules 1-9)."""
    cores = []
    for agent in placement.agents:
        if agent.unit not in (Unit.CUBE, Unit.VECTOR):
            continue
        walker = _Walker(kernel, placement, agent)
        walker.block(kernel.body, ())
        cores.extend(walker.peaks())
    return MemoryPlan(tuple(cores))


# Lowering refuses what does not fit; tests that want the HIVM compiler's own overflow
# message on such a kernel turn this off (monkeypatch) to get past lowering.
ENFORCE = True


def check(kernel: ir.KernelIR, placement) -> MemoryPlan:
    """:func:`plan`, raising :class:`AllocationError` for the first memory that overflows
    (when :data:`ENFORCE`)."""
    result = plan(kernel, placement)
    for c in result.cores:
        if ENFORCE and not c.fits:
            raise _overflow(kernel, c)
    return result


def _overflow(kernel: ir.KernelIR, c: CoreMemory) -> AllocationError:
    big = "; ".join(f"{t.what} {t.bytes} B" + (f" (line {t.loc.line})" if t.loc else "")
                    for t in c.tiles[:4])
    dims = sorted({k for k, v in kernel.constexprs if isinstance(v, int) and k.upper().startswith("B")})
    shrink = f"smaller tiles ({', '.join(dims)})" if dims else "smaller tiles"
    return AllocationError(
        f"the {c.unit.value} core's {LABEL[c.memory]} cannot hold this specialization's tiles: "
        f"agent '{c.agent}' needs about {c.need} B at once, the Ascend 910B core has {c.capacity} B",
        loc=c.loc or kernel.loc, objects=(c.agent,),
        fix=(f"use {shrink}, fewer pipe stages, or split a row into column blocks in a loop; "
             f"the biggest tiles: {big}"),
        details="estimate: xsync.backends.ascend.memory (rules 1-9), calibrated against the HIVM "
                "compiler's plan-memory")


class _Walker:
    """Flattens the kernel body as one agent sees it and sizes every tile value."""

    def __init__(self, kernel: ir.KernelIR, placement, agent):
        self.kernel = kernel
        self.placement = placement
        self.agent = agent
        self.consts = dict(kernel.constexprs)
        self.tensors = {p.name: p.dtype for p in kernel.params if p.kind is ir.ParamKind.TENSOR}
        self.pipes = {p.name: p for p in kernel.pipes}
        self.mine = set(agent.roles)
        self.steps: list[_Step] = []
        self.loops: dict[int, list[int]] = {}       # loop id -> [first pos, last pos]
        self.sizes: dict[str, tuple[int, str]] = {} # name -> (bytes, memory)
        self.env: dict[str, _Value] = {}
        self.slots: dict[str, str] = {}             # slot variable -> pipe
        self.accumulators: set[str] = set()
        self.selected: set[str] = set()             # names bound to a select's result
        self.defined_at: dict[str, SourceLoc] = {}
        self.cube = agent.unit is Unit.CUBE
        self.mix = any(a.unit is Unit.CUBE for a in placement.agents)
        self._loop_ids = 0
        self.role: str | None = None                # the role block being walked
        self.copies: dict[str, int] = {}            # name -> replicas holding their own (rule 7)

    # ------------------------------------------------------------ statements
    def block(self, body, loops, inside=False):
        for s in body:
            self.stmt(s, loops, inside)

    def stmt(self, s, loops, inside):
        if isinstance(s, ir.RoleBlock):
            outer, self.role = self.role, s.role
            try:
                self.block(s.body, loops, s.role in self.mine)
            finally:
                self.role = outer
        elif isinstance(s, ir.For):
            self._loop_ids += 1
            lid = self._loop_ids
            self.loops[lid] = [len(self.steps), len(self.steps)]
            self.block(s.body, loops + (lid,), inside)
            self.loops[lid][1] = max(len(self.steps) - 1, self.loops[lid][0])
        elif isinstance(s, ir.If):
            step = self.new_step(s.loc, loops)
            self.expr(s.cond, step, loops)
            # an arm a constexpr turns off is never compiled (Triton folds it): it holds nothing
            self.block(ir.taken_arms(self.kernel, s), loops, inside)
        elif not inside:
            if isinstance(s, ir.Assign):      # shared scalar code runs on every core
                for t in s.targets:
                    self.env[t] = _Value((), int32)
        elif isinstance(s, ir.Assign):
            step = self.new_step(s.loc, loops)
            v = self.expr(s.value, step, loops, top=True)
            for t in s.targets:
                self.define(t, v, step)
        elif isinstance(s, ir.SlotWrite):
            step = self.new_step(s.loc, loops)
            self.expr(s.value, step, loops, top=not self.crosses(s.pipe))
        elif isinstance(s, ir.Store):
            step = self.new_step(s.loc, loops)
            self.expr(s.value, step, loops)
        elif isinstance(s, ir.SyncOp):
            if s.target and s.verb in (ir.Verb.ACQUIRE, ir.Verb.WAIT):
                self.slots[s.target] = s.obj
        elif isinstance(s, ir.MmaWait):
            step = self.new_step(s.loc, loops)
            step.reads.update(s.targets)

    def new_step(self, loc, loops) -> _Step:
        step = _Step(len(self.steps), loc, loops=loops)
        self.steps.append(step)
        return step

    def define(self, name, v: _Value, step: _Step):
        self.env[name] = _Value(v.shape, v.dtype)
        if not v.shape:
            return
        memory = self.memory_of(name, v)
        old = self.sizes.get(name, (0, memory))
        if old[1] == Memory.L0C:            # an accumulator stays one (mma_wait passes it on)
            memory = Memory.L0C
        size = v.bytes * v.copies
        self.sizes[name] = (max(old[0], size), memory)
        if self.cube and self.role in self.agent.serial:
            # sub-tile replicas (passes/subtile_replicas.py) store each product before the next
            one = memory == Memory.L0C and name not in self.accumulators and \
                subtiled(self.kernel, self.placement, self.role)
            self.copies[name] = 1 if one else self.kernel.role(self.role).replicas
        step.defines.add(name)
        self.defined_at.setdefault(name, step.loc)
        if v.select:
            self.selected.add(name)

    def memory_of(self, name, v) -> str:
        if not self.cube:
            return Memory.UB
        return Memory.L0C if name in self.accumulators or v.acc else Memory.L1

    def crosses(self, pipe: str) -> bool:
        return self.placement.crosses(self.pipes[pipe])

    # ------------------------------------------------------------ expressions
    def expr(self, e, step: _Step, loops, top=False) -> _Value:
        """The value of ``e``; its fresh tile buffers go to ``step.temps`` (rules 4-7). ``top``:
        the value becomes a name's buffer (not a temporary)."""
        v = self._expr(e, step, loops)
        fresh = v.fresh
        if fresh and not top:
            mem = Memory.L0C if v.acc else (Memory.L1 if self.cube else Memory.UB)
            step.temps.append((mem, Tile(v.what, fresh, step.loc)))
        return v

    def _expr(self, e, step, loops) -> _Value:
        if isinstance(e, ir.Name):
            step.reads.add(e.id)
            known = self.env.get(e.id)
            if known is None:
                return _Value((), int32)
            return _Value(known.shape, known.dtype, named=e.id)
        if isinstance(e, ir.Const):
            return _Value((), float32 if isinstance(e.value, float) else int32)
        if isinstance(e, ir.Attr):
            return self.attr(e, step, loops)
        if isinstance(e, ir.Cast):
            inner = self.expr(e.value, step, loops, top=True)
            return self.elementwise([inner], inner.shape, e.dtype, step, "cast")
        if isinstance(e, ir.BinOp):
            a, b = self.expr(e.left, step, loops, True), self.expr(e.right, step, loops, True)
            return self.elementwise([a, b], _broadcast(a.shape, b.shape), _promote(a.dtype, b.dtype),
                                    step, e.op)
        if isinstance(e, (ir.Compare, ir.BoolOp, ir.UnaryOp)):
            parts = ([e.left, e.right] if isinstance(e, ir.Compare) else
                     list(e.values) if isinstance(e, ir.BoolOp) else [e.operand])
            vals = [self.expr(p, step, loops, True) for p in parts]
            shape = ()
            for v in vals:
                shape = _broadcast(shape, v.shape)
            dtype = vals[0].dtype if isinstance(e, ir.UnaryOp) else int1
            return self.elementwise(vals, shape, dtype, step, "compare")
        if isinstance(e, ir.Subscript):
            inner = self.expr(e.value, step, loops, True)
            shape, dims = [], iter(inner.shape)
            for ix in e.index:
                shape.append(1 if ix is None else next(dims, 1))
            return self.fresh(tuple(shape), inner.dtype, step, "broadcast", dies=[inner])
        if isinstance(e, ir.TupleExpr):
            for it in e.items:
                self.book(self.expr(it, step, loops, True), step)
            return _Value((), int32)
        if isinstance(e, ir.Call):
            return self.call(e, step, loops)
        return _Value((), int32)

    def rings(self, pipe: ir.Pipe) -> int:
        """Rule 7: the rings of a same-core pipe the cube holds at once -- one per replica pair
        of an N -> N pipe (its replicas run in lockstep, each reading its own slot), else one.
        Sub-tile replicas are calibrated at one: the compiler places attention dQ's four 32-row
        Q/dO slots within what the rest of the estimate already over-counts."""
        n = self.kernel.role(pipe.src).replicas
        paired = n > 1 and n == self.kernel.role(pipe.dst).replicas and pipe.interleave == 1
        return n if paired and not subtiled(self.kernel, self.placement, pipe.dst) else 1

    def attr(self, e: ir.Attr, step, loops) -> _Value:
        if isinstance(e.value, ir.Name) and e.value.id in self.slots:
            pipe = self.pipes[self.slots[e.value.id]]
            spec = next((f for f in pipe.fields if f.name == e.attr), None)
            if spec is not None:
                shape = tuple(self.const(d) for d in spec.shape)
                if self.crosses(pipe.name) and not self.cube:     # rule 6: read from GM into UB
                    v = self.fresh(shape, spec.dtype, step, f"{pipe.name}.{e.attr}")
                    return self.multi(v, loops)
                if self.cube:       # a same-core slot: the L1 buffer of the pipe (per ring)
                    key = f"{pipe.name}.{e.attr}" + ("" if e.part is None else f"[{e.part}]")
                    size = _Value(shape, spec.dtype).bytes * (MULTI_BUFFER if loops else 1)
                    self.sizes[key] = (max(size, self.sizes.get(key, (0, ""))[0]), Memory.L1)
                    rings = self.rings(pipe)
                    if rings > 1:
                        self.copies[key] = rings
                    step.reads.add(key)
                    step.defines.add(key)
                    return _Value(shape, spec.dtype, named=key)
                return _Value(shape, spec.dtype)
        self.expr(e.value, step, loops, True)
        return _Value((), int32)

    def call(self, e: ir.Call, step, loops) -> _Value:
        op, args = e.op, e.args
        if op is ir.TileOp.LOAD:
            for a in args[1:2]:
                self.expr(a, step, loops, True)
            shape = self.shape(args[2]) if len(args) > 2 else ()
            dtype = self.tensors.get(args[0].id) if isinstance(args[0], ir.Name) else None
            v = self.fresh(shape, dtype or float32, step, "load")
            return self.multi(v, loops)
        if op in (ir.TileOp.ZEROS, ir.TileOp.FULL):
            shape = self.shape(args[0])
            dtype = next((a.value for a in args[1:] if isinstance(a, ir.Const) and isinstance(a.value, DType)),
                         float32)
            return self.fresh(shape, dtype, step, op.value)
        if op is ir.TileOp.ARANGE:
            lo, hi = (self.const(a) for a in args[:2])
            return self.fresh((max(hi - lo, 0),), int32, step, "arange")
        if op is ir.TileOp.MMA:
            vals = [self.expr(a, step, loops, True) for a in args]
            for v in vals:
                self.book(v, step)
            m = vals[0].shape[0] if vals[0].shape else 1
            n = vals[1].shape[-1] if len(vals) > 1 and vals[1].shape else 1
            if len(args) > 2 and isinstance(args[2], ir.Name):
                self.accumulators.add(args[2].id)
                self._retag(args[2].id, Memory.L0C)
            v = _Value((m, n), float32)
            if len(vals) > 2 and vals[2].named:
                v.named = vals[2].named          # accumulates in place
                return v
            v.fresh, v.acc, v.what = v.bytes, True, "mma"
            return v
        if op is ir.TileOp.MMA_WAIT:
            vals = [self.expr(a, step, loops, True) for a in args]
            return vals[0] if vals else _Value((), int32)      # passes its operand through
        if op is ir.TileOp.TRANS:
            v = self.expr(args[0], step, loops, True)
            if self.cube and v.named:    # rule 7: the L1 -> L0B load transposes, no L1 copy
                return _Value(tuple(reversed(v.shape)), v.dtype, named=v.named)
            return self.fresh(tuple(reversed(v.shape)), v.dtype, step, "trans", dies=[v])
        if op in REDUCTIONS:
            v = self.expr(args[0], step, loops, True)
            self.book(v, step)
            axis = self.const(args[1]) if len(args) > 1 else 0
            shape = tuple(d for i, d in enumerate(v.shape) if i != axis % max(len(v.shape), 1))
            work = -(-(v.bytes // 2) // BLOCK) * BLOCK
            if work:
                step.temps.append((Memory.UB if not self.cube else Memory.L1,
                                   Tile(f"{op.value} work", work, step.loc)))
            return self.fresh(shape, v.dtype, step, op.value)
        if op in ELEMENTWISE:
            vals = [self.expr(a, step, loops, True) for a in args]
            shape = ()
            for v in vals:
                shape = _broadcast(shape, v.shape)
            tile_dtypes = [v.dtype for v in vals if v.shape] or [float32]
            dtype = tile_dtypes[-1] if op is ir.TileOp.WHERE else max(tile_dtypes, key=lambda d: d.bits)
            dtype = float32 if op in ir.FLOAT_MATH else dtype
            return self.elementwise(vals, shape, dtype, step, op.value)
        for a in args:
            self.book(self.expr(a, step, loops, True), step)
        return _Value((), int32)

    # ------------------------------------------------------------ buffers
    def fresh(self, shape, dtype, step, what, dies=()) -> _Value:
        for d in dies:
            self.book(d, step)
        v = _Value(tuple(shape), dtype)
        v.fresh, v.what = v.bytes, what
        return v

    def book(self, v: _Value, step: _Step):
        """An operand temporary consumed by a node that does not reuse it: it stays booked."""
        f = v.fresh
        if f:
            mem = Memory.L0C if v.acc else (Memory.L1 if self.cube else Memory.UB)
            step.temps.append((mem, Tile(v.what, f, step.loc)))
            v.fresh = 0

    def multi(self, v: _Value, loops) -> _Value:
        if loops and v.fresh and MULTI_BUFFER > 1:
            v.fresh *= MULTI_BUFFER
            v.copies = MULTI_BUFFER
            v.what = f"{v.what} x{MULTI_BUFFER} (multi-buffered)"
        return v

    def elementwise(self, operands, shape, dtype, step, what) -> _Value:
        """Rule 4: the result takes over an operand temporary's buffer (in place), or a
        dying name's (credited once liveness is known), else a fresh one."""
        v = _Value(tuple(shape), dtype)
        need = v.bytes
        inplace = None
        cands = []
        for o in operands:
            f = o.fresh
            if f and inplace is None and f >= need and what not in SELECTS:
                inplace = o                  # carried on, booked by whoever ends the chain
            elif f:
                self.book(o, step)
            elif o.named and o.bytes >= need and o.named not in self.selected:
                cands.append(o.named)
        if need and what in SELECTS:
            # compare + select: a mask (1 byte per element, conservative) and a select buffer
            mask = -(-math.prod(shape) // BLOCK) * BLOCK
            mem = Memory.L1 if self.cube else Memory.UB
            step.temps.append((mem, Tile(f"{what} mask", mask, step.loc)))
            step.temps.append((mem, Tile(f"{what} select", need, step.loc)))
            v.select = True
        if inplace is not None:
            v.fresh, v.what = inplace.fresh, inplace.what
            v.select = inplace.select
        elif need:
            if cands:
                step.maybe_reuse.append((need, tuple(cands)))
            v.fresh, v.what = need, what
        return v

    def _retag(self, name, memory):
        if name in self.sizes:
            self.sizes[name] = (self.sizes[name][0], memory)

    def const(self, e) -> int:
        if isinstance(e, int):
            return e
        if isinstance(e, ir.Const) and isinstance(e.value, (int, float)):
            return int(e.value)
        if isinstance(e, ir.Name):
            v = self.consts.get(e.id)
            return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 1
        if isinstance(e, ir.BinOp):
            a, b = self.const(e.left), self.const(e.right)
            ops = {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 1,
                   "%": a % b if b else 0, "<<": a << b, ">>": a >> b}
            return ops.get(e.op, a)
        if isinstance(e, ir.UnaryOp) and e.op == "-":
            return -self.const(e.operand)
        return 1

    def shape(self, e) -> tuple[int, ...]:
        items = e.items if isinstance(e, ir.TupleExpr) else (e,)
        return tuple(max(self.const(i), 1) for i in items)

    # ------------------------------------------------------------ liveness and the peak
    def peaks(self) -> list[CoreMemory]:
        """Rule 9: every named tile and every statement's temporaries, each counted once (the
        compiler's plan-memory seldom reuses a dead buffer for a later, different value);
        a loop body's temporaries are the same buffers every iteration; reductions share one
        work buffer (the largest)."""
        live = self.intervals()
        memories = (Memory.L1, Memory.L0C) if self.cube else (Memory.UB,)
        out = []
        # rule 8: an aiv kernel keeps every replica's named tiles (temporaries die within a
        # statement, which the replicas run one after the other); a mix kernel one core's share
        names_share = (self.agent.replicas if not self.mix else BINDING_SHARE) if not self.cube else 1
        temps_share = (1 if not self.mix else BINDING_SHARE) if not self.cube else 1
        for mem in memories:
            named = [Tile(n if self.copies.get(n, 1) == 1 else f"{n} x {self.copies[n]} replicas",
                          b * self.copies.get(n, 1), self.defined_at.get(n))
                     for n, (b, m) in self.sizes.items() if m == mem]
            temps, work = [], []
            for step in self.steps:
                booked = self.credit_reuse(step, [t for m, t in step.temps if m == mem], live, mem)
                work += [t for t in booked if t.what.endswith(" work")]
                temps += [t for t in booked if not t.what.endswith(" work")]
            if work:
                temps.append(max(work, key=lambda t: t.bytes))
            tiles = named + temps
            held = sum(t.bytes for t in named)
            if mem == Memory.L0C:
                held = self.l0c_peak(live)
            total = (SCRATCH if mem == Memory.UB else 0) + math.ceil(names_share * held + temps_share * sum(t.bytes for t in temps))
            if total or mem != Memory.L0C:
                biggest = max(tiles, key=lambda t: t.bytes, default=None)
                out.append(CoreMemory(self.agent.name, self.agent.unit, mem, total, CAPACITY[mem],
                                      tuple(sorted(tiles, key=lambda t: -t.bytes)),
                                      biggest.loc if biggest and biggest.loc else None))
        return out

    def l0c_peak(self, live) -> int:
        """Rule 7: the L0C tiles live at once, at the worst statement (a product is dead once
        the fixpipe has moved it out; accumulators are carried around their loop)."""
        spans = []
        for n, (b, m) in self.sizes.items():
            if m != Memory.L0C:
                continue
            b *= self.copies.get(n, 1)
            if n in self.accumulators:
                spans.append((live.get(n, (0, len(self.steps))), b))
                continue
            start = None        # a product: from each definition to its last read before the next
            for step in self.steps:
                if n in step.defines:
                    start = step.pos
                    spans.append(((start, start), b))
                elif n in step.reads and start is not None:
                    spans[-1] = ((start, step.pos), b)
        return max((sum(b for (lo, hi), b in spans if lo <= pos <= hi) for pos in range(len(self.steps))),
                   default=0)

    def credit_reuse(self, step, tiles, live, mem):
        """Rule 4 for names: a fresh elementwise result takes the buffer of a name whose last
        use is this statement (and is not kept alive past it by a loop)."""
        for need, names in step.maybe_reuse:
            dying = [n for n in names if live.get(n, (0, -1))[1] == step.pos
                     and n not in step.defines and self.sizes.get(n, (0, ""))[1] == mem]
            if dying:
                for i, t in enumerate(tiles):
                    if t.bytes == need and t.what not in self.sizes:
                        tiles = tiles[:i] + tiles[i + 1:]
                        break
        return tiles

    def intervals(self) -> dict[str, tuple[int, int]]:
        """Rule 3: each name's [first, last] step, widened to every loop it crosses or is
        carried around."""
        span: dict[str, list[int]] = {}
        first_def: dict[tuple[str, int], int] = {}
        first_read: dict[tuple[str, int], int] = {}
        for step in self.steps:
            for n in step.reads | step.defines:
                if n not in self.sizes:
                    continue
                s = span.setdefault(n, [step.pos, step.pos])
                s[0], s[1] = min(s[0], step.pos), max(s[1], step.pos)
                for lid in step.loops:
                    if n in step.defines:
                        first_def.setdefault((n, lid), step.pos)
                    if n in step.reads:
                        first_read.setdefault((n, lid), step.pos)
        changed = True
        while changed:
            changed = False
            for n, s in span.items():
                for lid, (lo, hi) in self.loops.items():
                    if not (lo <= s[1] and s[0] <= hi):
                        continue
                    carried = (n, lid) in first_read and first_read[(n, lid)] <= first_def.get((n, lid), -1)
                    outside = s[0] < lo or s[1] > hi
                    if (carried or outside) and (s[0] > lo or s[1] < hi):
                        s[0], s[1] = min(s[0], lo), max(s[1], hi)
                        changed = True
        return {n: (s[0], s[1]) for n, s in span.items()}


def _broadcast(a: tuple, b: tuple) -> tuple:
    if not a:
        return tuple(b)
    if not b:
        return tuple(a)
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    return tuple(max(x, y) for x, y in zip(a, b))


def _promote(a: DType, b: DType) -> DType:
    return a if a.bits >= b.bits else b
