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

import math
import re
from dataclasses import dataclass, field

from xsync.api import DType
from xsync.backends.source import float_literal, _PRECEDENCE, Emitter, PythonRenderer
from xsync.errors import BackendError
from xsync.lowering import ir
from xsync.backends.nvidia.alloc import HopperAllocation, is_tma_pipe
from xsync.lowering.placement import Placement, Unit
from xsync.lowering.protocol import NotConstant, acting_role, evaluate
from xsync.lowering.slicing import agent_body

# The TMA global->shared load is spelled differently across the supported Triton versions:
# 3.6/3.7 only have tma.async_copy_global_to_shared, 3.8 adds tma.async_load (same
# positional arguments) and keeps the old name, 3.9 makes the old name raise. The
# generated module feature-detects it once, in its header.
TMA_LOAD_ALIAS = ('xs_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared'
                  '  # Triton >= 3.8 / 3.6-3.7 spelling')

GL_DTYPES = {"float16": "gl.float16", "bfloat16": "gl.bfloat16", "float32": "gl.float32",
             "int32": "gl.int32", "int1": "gl.int1"}
SIG_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "int32": "i32", "int1": "i1"}
_GL_OPS = {"exp2": "gl.exp2", "log2": "gl.log2", "maximum": "gl.maximum", "minimum": "gl.minimum",
           "cdiv": "gl.cdiv", "program_id": "gl.program_id", "num_programs": "gl.num_programs"}


# ---------------------------------------------------------------- value types
@dataclass(frozen=True)
class T:
    kind: str                       # scalar | tile | smem
    shape: tuple = ()
    dtype: DType | None = None
    layout: str | None = None       # rendered Gluon layout expression (tiles, smem)


SCALAR = T("scalar")


@dataclass
class TensorUse:
    """How one tensor parameter reaches the device."""

    name: str
    dtype: DType
    descs: dict = field(default_factory=dict)   # (rows, cols) -> descriptor parameter name
    pointer: bool = False                       # masked 2-D gl.load/gl.store through a pointer
    table: bool = False                         # 1-D int32 table read with xs.load_scalar


@dataclass
class WaitSite:
    """One rendered mbarrier wait (hang debug mode maps ids back to these)."""

    id: int
    agent: str
    role: str
    verb: str        # acquire | wait | event wait
    obj: str
    line: int
    what: str


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


def nvmma_shared_layout(shape, dtype: DType):
    """The NVMMASharedLayout Gluon picks for a tile (TMA boxes and wgmma operands)."""
    from triton.experimental.gluon import language as gl
    return gl.NVMMASharedLayout.get_default_for(list(shape), getattr(gl, dtype.name))


def nvmma_shared_repr(shape, dtype: DType) -> str:
    try:
        return "gl." + repr(nvmma_shared_layout(shape, dtype))
    except ImportError:
        # No triton here (e.g. `xsync lower` in the core venv): same rule as
        # NVMMASharedLayout.get_default_for for 2-D, non-transposed tiles.
        row_bytes = shape[-1] * dtype.bits // 8
        swizzle = next((w for w in (128, 64, 32) if row_bytes >= w), 0)
        return (f"gl.NVMMASharedLayout(swizzle_byte_width={swizzle}, element_bitwidth={dtype.bits}, "
                f"rank=2, transposed=False, fp4_padded=False, cga_layout=[])")


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class NvidiaRenderer(PythonRenderer):
    def __init__(self, kernel: ir.KernelIR, placement: Placement, allocation: HopperAllocation,
                 options: dict | None = None):
        self.kernel = kernel
        self.placement = placement
        self.allocation = allocation
        self.options = dict(options or {})
        self.debug_hang = bool(self.options.get("debug_hang", False))
        self.bars_smem = int(self.options.get("bars_smem", 0))
        self.timeout_ms = int(self.options.get("hang_timeout_ms", 2000))
        self.consts = dict(kernel.constexpr_values)
        self.layouts: dict[str, str] = {}        # constant name -> layout constructor
        self.layout_notes: dict[str, str] = {}
        self.wait_sites: list[WaitSite] = []
        self.tensors: dict[str, TensorUse] = {}
        self.bar_base: dict[str, int] = {}       # "tiles:full" -> index base in xs_bars
        self.bar_count: dict[str, int] = {}
        self.num_bars = 0
        self.tmp = 0
        self._check_supported()
        self._collect_tensors()
        self._assign_barriers()

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

    # ------------------------------------------------------------ constants
    def cval(self, e, what, loc):
        try:
            return evaluate(e, self.consts)
        except (NotConstant, TypeError):
            self.fail(f"{what} must be a compile-time constant", loc=loc,
                      fix="use literals and constexpr parameters")

    def shape_of(self, e, loc) -> tuple:
        items = e.items if isinstance(e, ir.TupleExpr) else (e,)
        return tuple(int(self.cval(x, "a tile shape", loc)) for x in items)

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

    # ------------------------------------------------------------ layouts
    def layout_const(self, name: str, ctor: str, note: str) -> str:
        self.layouts.setdefault(name, ctor)
        self.layout_notes.setdefault(name, note)
        return name

    def layout2d(self, shape) -> str:
        """Distributed layout of a 2-D register tile in the current partition."""
        r, c = shape
        if self.warps == 4 and c % 8 == 0 and 8 <= c <= 256:
            # The wgmma accumulator layout depends on the column count only, so every
            # [*, c] tile of a consumer warpgroup shares it (no layout conversions).
            return self.layout_const(
                f"ACC_N{c}",
                f"gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, {c}, 16])",
                f"wgmma accumulator layout: [*, {c}] tiles of a consumer warpgroup")
        w = self.warps
        return self.layout_const(
            f"BLOCKED_{w}W", f"gl.BlockedLayout([1, 4], [4, 8], [{w}, 1], [1, 0])",
            f"2-D register tiles in {w}-warp partitions")

    def layout1d(self) -> str:
        w = self.warps
        return self.layout_const(f"ROW_{w}W", f"gl.BlockedLayout([1], [32], [{w}], [0])",
                                 f"1-D register tiles in {w}-warp partitions")

    def smem_layout(self, shape, dtype) -> str:
        name = f"SMEM_{dtype.name.upper()}_{shape[0]}x{shape[1]}"
        return self.layout_const(name, nvmma_shared_repr(shape, dtype),
                                 f"shared-memory tile [{shape[0]}, {shape[1]}] {dtype.name}")

    # ------------------------------------------------------------ expressions
    def dtype(self, d) -> str:
        return GL_DTYPES[d.name]

    def const(self, v) -> str:
        if isinstance(v, DType):
            return self.dtype(v)
        return float_literal(v) if isinstance(v, float) else repr(v)

    def fresh(self, stem: str) -> str:
        self.tmp += 1
        return f"xs_{stem}{self.tmp}"

    def want_cvt(self, code: str, t: T, want: str | None, name: str | None = None):
        if t.kind == "tile" and want is not None and t.layout != want:
            if name is not None and len(t.shape) == 1 and not want.startswith(("ROW_", "BLOCKED_")):
                self.prefs.setdefault(name, want)
            return f"gl.convert_layout({code}, {want})", T("tile", t.shape, t.dtype, want)
        return code, t

    def tx(self, e, want: str | None = None, parent: int = 0):
        """Render expression ``e`` -> (code, type). ``want``: layout the result must have."""
        if isinstance(e, ir.Const):
            return self.const(e.value), SCALAR
        if isinstance(e, ir.Name):
            if e.id in self.consts:
                return e.id, SCALAR
            t = self.env.get(e.id, SCALAR)
            if t.kind == "smem":
                code = e.id
                lay = want or self.layout2d(t.shape)
                return f"{code}.load({lay})", T("tile", t.shape, t.dtype, lay)
            return self.want_cvt(e.id, t, want, e.id)
        if isinstance(e, (ir.BinOp, ir.Compare)):
            p = _PRECEDENCE["cmp" if isinstance(e, ir.Compare) else e.op]
            lt, rt = self.peek(e.left), self.peek(e.right)
            shape, lay = self.bshape([lt, rt], want)
            lc, lt = self.tx(e.left, self.child_want(lt, shape, lay), p + (isinstance(e, ir.Compare)))
            rc, rt = self.tx(e.right, self.child_want(rt, shape, lay), p + 1)
            code = f"{lc} {e.op} {rc}"
            if p < parent:
                code = f"({code})"
            if shape is None:
                return code, SCALAR
            dt = DType("int1", 8) if isinstance(e, ir.Compare) else self.promote(lt, rt)
            return code, T("tile", shape, dt, lay)
        if isinstance(e, ir.BoolOp):
            p = _PRECEDENCE[e.op]
            ts = [self.peek(v) for v in e.values]
            shape, lay = self.bshape(ts, want)
            parts = [self.tx(v, self.child_want(t, shape, lay), p + 1)[0] for v, t in zip(e.values, ts)]
            if shape is None:
                code = f" {e.op} ".join(parts)
                return (f"({code})" if p < parent else code), SCALAR
            code = " & ".join(f"({x})" for x in parts) if e.op == "and" else " | ".join(f"({x})" for x in parts)
            return f"({code})", T("tile", shape, DType("int1", 8), lay)
        if isinstance(e, ir.UnaryOp):
            c, t = self.tx(e.operand, want, _PRECEDENCE["unary"])
            if e.op == "not":
                return (f"not {c}" if t.kind == "scalar" else f"~({c})"), t
            return f"{e.op}{c}", t
        if isinstance(e, ir.TupleExpr):
            return "[" + ", ".join(self.tx(i)[0] for i in e.items) + "]", SCALAR
        if isinstance(e, ir.Subscript):
            return self.subscript(e, want)
        if isinstance(e, ir.Cast):
            c, t = self.tx(e.value, want, 99)
            if t.kind == "scalar":
                return f"{c}.to({self.dtype(e.dtype)})", SCALAR
            return f"{c}.to({self.dtype(e.dtype)})", T("tile", t.shape, e.dtype, t.layout)
        if isinstance(e, ir.Attr):
            view, t = self.field_view(e)
            if t.kind == "smem":
                lay = want or self.layout2d(t.shape)
                return f"{view}.load({lay})", T("tile", t.shape, t.dtype, lay)
            return self.want_cvt(view, t, want)
        if isinstance(e, ir.Call):
            return self.call_tx(e, want)
        raise TypeError(f"cannot render {e!r}")

    def peek(self, e) -> T:
        """Type of ``e`` without keeping the rendering (used to plan layouts)."""
        saved = (self.tmp, dict(self.prefs), self.out, list(self.last_mma_reads))
        self.out = Emitter()
        try:
            return self.tx(e)[1]
        finally:
            self.tmp, self.prefs, self.out, self.last_mma_reads = saved

    def bshape(self, ts, want):
        tiles = [t for t in ts if t.kind == "tile"]
        if not tiles:
            return None, None
        rank = max(len(t.shape) for t in tiles)
        shape = [1] * rank
        for t in tiles:
            for i, d in enumerate((1,) * (rank - len(t.shape)) + tuple(t.shape)):
                shape[i] = max(shape[i], d)
        shape = tuple(shape)
        if want is not None:
            return shape, want
        full = [t.layout for t in tiles if tuple(t.shape) == shape and t.layout]
        if full:
            # prefer a layout some computation produced over a default one (ROW_/BLOCKED_)
            derived = [lay for lay in full if not lay.startswith(("ROW_", "BLOCKED_"))]
            return shape, (derived or full)[0]
        if rank == 2:
            return shape, self.layout2d(shape)
        lays = [t.layout for t in tiles if t.layout]
        return shape, lays[0] if lays else self.layout1d()

    @staticmethod
    def child_want(t, shape, lay):
        if shape is None or t.kind != "tile":
            return None
        return lay

    @staticmethod
    def promote(*ts):
        dts = [t.dtype for t in ts if t.kind == "tile" and t.dtype is not None]
        for name in ("float32", "bfloat16", "float16"):
            for d in dts:
                if d.name == name:
                    return d
        return dts[0] if dts else None

    def subscript(self, e: ir.Subscript, want):
        inner = self.peek(e.value)
        idx = ", ".join("None" if i is None else ":" for i in e.index)
        if inner.kind != "tile" or len(inner.shape) != 1 or len(e.index) != 2:
            c, t = self.tx(e.value, None, 99)
            return f"{c}[{idx}]", t
        dim = e.index.index(None)           # expanded axis
        shape = (1, inner.shape[0]) if dim == 0 else (inner.shape[0], 1)
        parent = want or (inner.layout[len(f"gl.SliceLayout({dim}, "):-1]
                          if inner.layout and inner.layout.startswith(f"gl.SliceLayout({dim}, ") else None)
        if parent is None:
            # the other extent is unknown here: guess the agent's usual column count (the
            # second rendering pass fixes a wrong guess through the recorded preferences)
            cols = inner.shape[0] if dim == 0 else self.usual_cols or inner.shape[0]
            parent = self.layout2d((64, cols))
        c, _ = self.tx(e.value, f"gl.SliceLayout({dim}, {parent})", 99)
        return f"{c}[{idx}]", T("tile", shape, inner.dtype, parent)

    def field_view(self, e: ir.Attr):
        slot = e.value.id
        pipe = self.slot_pipe.get(slot)
        if pipe is None:
            self.fail(f"`{slot}.{e.attr}` is not a slot field here")
        spec = pipe.field(e.attr)
        if not self.placement.crosses(pipe):
            t = self.env.get(f"{pipe.name}_{e.attr}", T("tile", spec.shape, spec.dtype, None))
            return f"{pipe.name}_{e.attr}", t
        return f"{pipe.name}_{e.attr}.index({slot})", T("smem", spec.shape, spec.dtype, self.smem_layout(spec.shape, spec.dtype))

    def smem_operand(self, e):
        """Shared-memory view for an mma operand, or None if it lives in registers."""
        if isinstance(e, ir.Attr) and isinstance(e.value, ir.Name) and e.value.id in self.slot_pipe \
                and self.placement.crosses(self.slot_pipe[e.value.id]):
            view, t = self.field_view(e)
            return view, t
        if isinstance(e, ir.Call) and e.op == "trans":
            inner = self.smem_operand(e.args[0])
            if inner is not None:
                view, t = inner
                return f"{view}.permute((1, 0))", T("smem", tuple(reversed(t.shape)), t.dtype, t.layout)
        return None

    def call_tx(self, e: ir.Call, want):
        op = e.op
        if op in ("program_id", "num_programs", "cdiv"):
            return f"{_GL_OPS[op]}({', '.join(self.tx(a)[0] for a in e.args)})", SCALAR
        if op == "replica_id":
            return "REPLICA", SCALAR
        if op in ("maximum", "minimum", "exp2", "log2"):
            ts = [self.peek(a) for a in e.args]
            shape, lay = self.bshape(ts, want)
            args = [self.tx(a, self.child_want(t, shape, lay))[0] for a, t in zip(e.args, ts)]
            if shape is None:
                return f"{_GL_OPS[op]}({', '.join(args)})", SCALAR
            dt = self.promote(*ts)
            return f"{_GL_OPS[op]}({', '.join(args)})", T("tile", shape, dt, lay)
        if op == "where":
            ts = [self.peek(a) for a in e.args]
            shape, lay = self.bshape(ts, want)
            args = [self.tx(a, self.child_want(t, shape, lay))[0] for a, t in zip(e.args, ts)]
            return f"gl.where({', '.join(args)})", T("tile", shape, self.promote(*ts[1:]), lay)
        if op == "arange":
            a, b = (int(self.cval(x, "xs.arange bounds", self.loc)) for x in e.args)
            if not _pow2(b - a):
                self.fail(f"xs.arange({a}, {b}): the length must be a power of two", loc=self.loc)
            lay = want or self.layout1d()
            return f"gl.arange({a}, {b}, layout={lay})", T("tile", (b - a,), DType("int32", 32), lay)
        if op in ("zeros", "full"):
            shape = self.shape_of(e.args[0], self.loc)
            dt = e.args[-1].value
            lay = want or (self.layout2d(shape) if len(shape) == 2 else self.layout1d())
            dims = "[" + ", ".join(map(str, shape)) + "]"
            if op == "zeros":
                return f"gl.zeros({dims}, {self.dtype(dt)}, {lay})", T("tile", shape, dt, lay)
            v = self.tx(e.args[1])[0]
            return f"gl.full({dims}, {v}, {self.dtype(dt)}, {lay})", T("tile", shape, dt, lay)
        if op in ("max", "sum"):
            axis = int(self.cval(e.args[1], "the reduction axis", self.loc))
            c, t = self.tx(e.args[0])
            lay = f"gl.SliceLayout({axis}, {t.layout})"
            shape = tuple(d for i, d in enumerate(t.shape) if i != axis)
            return self.want_cvt(f"gl.{op}({c}, {axis})", T("tile", shape, t.dtype, lay), want)
        if op == "trans":
            c, t = self.tx(e.args[0])
            shape = tuple(reversed(t.shape))
            lay = want or self.layout2d(shape)
            return f"gl.convert_layout(gl.permute({c}, (1, 0)), {lay})", T("tile", shape, t.dtype, lay)
        if op == "load":
            return self.pointer_load(e, want)
        if op == "load_scalar":
            t = e.args[0].id
            return f"gl.load({t} + {self.tx(e.args[1], None, _PRECEDENCE['+'] + 1)[0]})", SCALAR
        if op == "mma":
            return self.mma(e, want)
        if op == "mma_wait":
            c, t = self.tx(e.args[0])
            n = int(self.cval(e.kwarg("pending", ir.Const(0)), "mma_wait pending", self.loc))
            return f"warpgroup_mma_wait({n}, deps=[{c}])", t
        self.fail(f"xs.{op} has no Hopper lowering yet", loc=self.loc)

    def mma(self, e: ir.Call, want):
        if self.warps != 4:
            self.fail("xs.mma outside a 4-warp consumer partition", loc=self.loc)
        a, b = e.args[0], e.args[1]
        bs = self.smem_operand(b)
        if bs is None:
            self.fail("the B operand of xs.mma must come from a pipe slot (wgmma reads B from shared "
                      "memory)", loc=self.loc, fix="pass B through a pipe from its producer role")
        bview, bt = bs
        at = self.peek(a) if self.smem_operand(a) is None else self.smem_operand(a)[1]
        m, n = at.shape[0], bt.shape[1]
        acc_l = self.layout2d((m, n))
        if not acc_l.startswith("ACC_") or m % 64:
            self.fail(f"xs.mma result [{m}, {n}] has no wgmma layout (M must be a multiple of 64, "
                      f"N a multiple of 8 up to 256)", loc=self.loc)
        reads = [bview]
        asm = self.smem_operand(a)
        if asm is not None:
            acode = asm[0]
            reads.insert(0, acode)
        else:
            bits = (at.dtype.bits if at.dtype else 16)
            dot_l = f"gl.DotOperandLayout(operand_index=0, parent={acc_l}, k_width={32 // bits})"
            if isinstance(a, ir.Name) and a.id not in self.consts and at.kind == "tile" and at.layout != dot_l:
                # a register A operand held in a variable (Q in attention): give its
                # definition the operand layout (next rendering pass), so a loop does
                # not convert it on every iteration
                self.prefs.setdefault(a.id, dot_l)
            acode, _ = self.tx(a, dot_l)
        if len(e.args) > 2 and not (isinstance(e.args[2], ir.Const) and e.args[2].value is None):
            ccode, _ = self.tx(e.args[2], acc_l)
        else:
            ccode = f"gl.zeros([{m}, {n}], gl.float32, {acc_l})"
        self.last_mma_reads = reads
        return (f"warpgroup_mma({acode}, {bview}, {ccode}, is_async=True)",
                T("tile", (m, n), DType("float32", 32), acc_l))

    def pointer_load(self, e: ir.Call, want):
        t = e.args[0].id
        use = self.tensors[t]
        shape = self.shape_of(e.args[2], self.loc)
        offs = e.args[1].items
        if len(shape) != 2:
            self.fail("xs.load reads 2-D tiles", loc=self.loc)
        lay = want or self.layout2d(shape)
        r, c = self.fresh("rows"), self.fresh("cols")
        self.out.line(f"{r} = {self.tx(offs[0])[0]} + gl.arange(0, {shape[0]}, layout=gl.SliceLayout(1, {lay}))")
        self.out.line(f"{c} = {self.tx(offs[1])[0]} + gl.arange(0, {shape[1]}, layout=gl.SliceLayout(0, {lay}))")
        code = (f"gl.load({t} + {r}[:, None].to(gl.int64) * {t}_stride + {c}[None, :], "
                f"mask=({r}[:, None] < {t}_rows) & ({c}[None, :] < {t}_cols), other=0.0)")
        return code, T("tile", shape, use.dtype, lay)

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
        self.block(stmts)

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
            o.line(f"for {s.var} in range({self.tx(s.start)[0]}, {self.tx(s.stop)[0]}, {self.tx(s.step)[0]}):"
                   f"  # line {s.loc.line}")
            self.env[s.var] = SCALAR
            o.indent()
            self.block(s.body)
            o.dedent()
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
        want = self.prefs.get(target)
        prev = self.env.get(target)
        if want is None and prev is not None and prev.kind == "tile":
            # A loop-carried value must keep one layout. If the new value's natural layout
            # differs, the next rendering pass gives the first definition that layout.
            natural = self.peek(v)
            if natural.kind == "tile" and natural.layout and natural.layout != prev.layout \
                    and not natural.layout.startswith(("ROW_", "BLOCKED_")):
                self.prefs.setdefault(target, natural.layout)
            want = prev.layout
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
        if want is not None and want.startswith("gl.DotOperandLayout(") and not (
                isinstance(v, ir.Call) and v.op in ("mma", "mma_wait")):
            # operand layout: compute in the natural layout, convert once here
            code, t = self.tx(v)
            code, t = self.want_cvt(code, t, want)
        else:
            code, t = self.tx(v, want)
            if t.kind == "tile" and want is not None and t.layout != want and (
                    target in self.prefs or (prev is not None and prev.kind == "tile"
                                             and t.shape == prev.shape)):
                # a value defined again (a loop-carried one, or a peeled copy of a loop body)
                # keeps one layout: convert where the expression does not produce it
                code, t = self.want_cvt(code, t, want)
        if t.kind == "tile" and len(t.shape) == 2 and t.shape[1] > 1 and self.usual_cols is None:
            self.usual_cols = t.shape[1]
        note = f"  # line {s.loc.line}: async wgmma" if isinstance(v, ir.Call) and v.op == "mma" else ""
        o.line(f"{target} = {code}{note}")
        if self.last_mma_reads:
            self.mma_reads[target] = list(self.last_mma_reads)
        self.env[target] = t

    def store(self, s: ir.Store):
        o = self.out
        c, t = self.tx(s.value)
        if t.kind != "tile" or len(t.shape) != 2:
            self.fail("xs.store writes 2-D tiles", loc=s.loc)
        lay = t.layout
        tn = s.tensor
        val = self.fresh("val")
        r, cc = self.fresh("rows"), self.fresh("cols")
        o.line(f"# line {s.loc.line}: xs.store({tn}, ...) -- out-of-bounds parts are masked off")
        o.line(f"{val} = {c}")
        o.line(f"{r} = {self.tx(s.offsets[0])[0]} + gl.arange(0, {t.shape[0]}, layout=gl.SliceLayout(1, {lay}))")
        o.line(f"{cc} = {self.tx(s.offsets[1])[0]} + gl.arange(0, {t.shape[1]}, layout=gl.SliceLayout(0, {lay}))")
        mask = f"({r}[:, None] < {tn}_rows) & ({cc}[None, :] < {tn}_cols)"
        if s.bounds:
            b0, b1 = (self.tx(x)[0] for x in s.bounds)
            mask += f" & ({r}[:, None] < {b0}) & ({cc}[None, :] < {b1})"
        o.line(f"gl.store({tn} + {r}[:, None].to(gl.int64) * {tn}_stride + {cc}[None, :], "
               f"{val}.to({self.dtype(self.tensors[tn].dtype)}), mask={mask})")

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

    # ------------------------------------------------------------ sync
    def ring_slot(self, pipe, counter: str) -> str:
        base = f"REPLICA * {pipe.stages} + " if self._paired(pipe) else ""
        return f"{base}{counter} % {pipe.stages}"

    def bar_index(self, obj, side, slot: str) -> str:
        return f"xs_bars.index({obj.name.upper()}_{side.upper()} + {slot})"

    def bar_wait(self, obj, side: str, index_expr: str, parity: str, verb: str, counter: str, line: int, what: str):
        bar = f"xs_bars.index({obj.name.upper()}_{side.upper()} + {index_expr})"
        if self.debug_hang:
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
        if s.guard is not None and not (isinstance(obj, ir.Pipe) and s.verb == "release"
                                         and self.placement.crosses(obj)):
            o.line(f"if {self.tx(s.guard)[0]}:  # line {line}")
            o.indent()
            self.sync(ir.SyncOp(s.verb, s.obj, s.target, s.loc, note=s.note))
            o.dedent()
        elif isinstance(obj, ir.Pipe):
            self.pipe_op(s, obj)
        elif isinstance(obj, ir.Event):
            if not self.placement.crosses(obj):
                o.line(f"# line {line}: xs.{'signal' if s.verb == 'signal' else 'wait'}({obj.name}) -- "
                       f"same partition: program order")
                return
            idx = "REPLICA" if self._paired(obj) else "0"
            if s.verb == "signal":
                o.line(f"mbarrier.arrive(xs_bars.index({obj.name.upper()}_EVENT + {idx}), count=1)"
                       f"  # line {line}: xs.signal({obj.name})")
            else:
                cnt = f"{obj.name}_waited"
                self.bar_wait(obj, "event", idx, f"{cnt} & 1", "wait", cnt, line, f"xs.wait({obj.name})")
                o.line(f"{cnt} += 1")
        else:
            # member roles sharing this partition meet once per meeting (skeleton.points)
            point = self.allocation.skeleton.renders(self.agent.name, s)
            if point is None:
                at = self.allocation.skeleton.point(self.agent.name, s).at.loc.line
                o.line(f"# line {line}: {obj.name}.{s.verb}() -- met once for this partition at line {at}")
                return
            bid = self.allocation.barrier_id(obj.name)
            n = self.barrier_threads(obj)
            fn = "xs_named_barrier_sync" if point.waits else "xs_named_barrier_arrive"
            verb = "sync" if point.waits else "arrive"
            why = f" -- {s.note}" if s.note else ""
            o.line(f"{fn}({bid}, {n})  # line {line}: {obj.name}.{verb}() -- named barrier {bid}, "
                   f"{n} threads{why}")
        self.role = role

    def pipe_op(self, s: ir.SyncOp, pipe: ir.Pipe):
        o, line, name, st = self.out, s.loc.line, pipe.name, pipe.stages
        if s.target:
            self.slot_pipe[s.target] = pipe
        if not self.placement.crosses(pipe):
            o.line(f"# line {line}: {name}.{s.verb}() -- '{pipe.src}' and '{pipe.dst}' share this "
                   f"partition: the slot is a register value")
            return
        if s.verb == "acquire":
            slot = s.target or self.fresh("slot")
            o.line(f"{slot} = {self.ring_slot(pipe, f'{name}_acquired')}")
            self.bar_wait(pipe, "empty", slot, f"(({name}_acquired // {st}) & 1) ^ 1", "acquire",
                          f"{name}_acquired", line, f"{s.target or ''}{' = ' if s.target else ''}{name}.acquire()")
            o.line(f"{name}_acquired += 1")
            if is_tma_pipe(self.kernel, pipe):
                o.line(f"mbarrier.expect({self.bar_index(pipe, 'full', slot)}, {pipe.slot_bytes})"
                       f"  # TMA completes the slot: {pipe.slot_bytes} bytes")
            self.env[slot] = SCALAR
        elif s.verb == "commit":
            if is_tma_pipe(self.kernel, pipe):
                o.line(f"# line {line}: {name}.commit() -- the TMA engine completes the full barrier")
                return
            o.line("fence_async_shared()")
            o.line(f"mbarrier.arrive({self.bar_index(pipe, 'full', self.ring_slot(pipe, f'{name}_committed'))}, "
                   f"count=1)  # line {line}: {name}.commit()")
            o.line(f"{name}_committed += 1")
        elif s.verb == "wait":
            slot = s.target or self.fresh("slot")
            o.line(f"{slot} = {self.ring_slot(pipe, f'{name}_waited')}")
            self.bar_wait(pipe, "full", slot, f"({name}_waited // {st}) & 1", "wait", f"{name}_waited", line,
                          f"{s.target or ''}{' = ' if s.target else ''}{name}.wait()")
            o.line(f"{name}_waited += 1")
            self.env[slot] = SCALAR
        else:
            bar = self.bar_index(pipe, 'empty', self.ring_slot(pipe, f'{name}_released'))
            why = f" {s.note}" if s.note else ""
            guard = self.static_guard(s.guard)
            if guard is False:
                o.line(f"# line {line}: {name}.release(){why} -- never (its guard is false here)")
            elif guard is None:
                # a guarded release is a predicated arrive, not a branch around the mbarrier op
                cond = self.tx(s.guard)[0]
                o.line(f"mbarrier.arrive({bar}, count=1, pred={cond})  # line {line}: {name}.release(){why}")
                o.line(f"{name}_released += ({cond}).to(gl.int32)")
            else:
                o.line(f"mbarrier.arrive({bar}, count=1)  # line {line}: {name}.release(){why}")
                o.line(f"{name}_released += 1")

    def static_guard(self, guard):
        """True (no guard, or one that holds at compile time), False, or None (run time)."""
        if guard is None:
            return True
        try:
            return bool(evaluate(guard, self.consts))
        except (NotConstant, TypeError):
            return None

    def counters(self, stmts):
        """Per-agent pipe/event counters this agent needs."""
        names = []
        for s in ir.walk(stmts):
            if isinstance(s, ir.SyncOp):
                obj = self.kernel.sync_object(s.obj)
                if isinstance(obj, ir.Barrier) or not self.placement.crosses(obj):
                    continue
                if isinstance(obj, ir.Pipe):
                    if s.verb == "commit" and is_tma_pipe(self.kernel, obj):
                        continue
                    n = {"acquire": "acquired", "commit": "committed", "wait": "waited", "release": "released"}[s.verb]
                    names.append((f"{obj.name}_{n}", f"pipe '{obj.name}': slots {n}"))
                elif s.verb == "wait":
                    names.append((f"{obj.name}_waited", f"event '{obj.name}': signals waited"))
        return list(dict.fromkeys(names))

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

        # kernel parameters
        params = []          # (name, kind, extra)
        for p in k.params:
            if p.kind == "constexpr":
                continue
            if p.kind == "tensor":
                use = self.tensors[p.name]
                for shape, dname in use.descs.items():
                    params.append((dname, "desc", (p.name, shape)))
                if use.table and not use.pointer:
                    params.append((p.name, "table", p.name))
                if use.pointer:
                    params.append((p.name, "ptr", p.name))
                    params.append((f"{p.name}_rows", "rows", p.name))
                    params.append((f"{p.name}_cols", "cols", p.name))
                    params.append((f"{p.name}_stride", "stride", p.name))
            else:
                params.append((p.name, "scalar", p.name))
        if self.debug_hang:
            params.append(("xs_dbg", "dbg", None))
        pnames = [n for n, _, _ in params]

        smem_args = []
        for p in k.pipes:
            if self.placement.crosses(p):
                smem_args += [f"{p.name}_{f.name}" for f in p.fields]
        ws_args = pnames + smem_args + ["xs_bars"]

        # agent functions (render twice: the first pass learns 1-D layout preferences)
        agent_src = {}
        for agent in self.placement.agents:
            warps = self.allocation.partitions_of(agent.name)[0].warps
            self.warps = warps
            stmts = agent_body(k, agent)
            self.prefs = {}
            first_site = len(self.wait_sites)
            # render until the layout preferences settle: a use may ask an earlier definition
            # for a layout (a loop-carried value, a peeled copy of the loop body)
            for attempt in range(4):
                settled = dict(self.prefs)
                del self.wait_sites[first_site:]
                self.out = Emitter()
                self.out.depth = 1
                self.render_agent_body(agent, agent.replicas, stmts)
                if attempt >= 1 and self.prefs == settled:
                    break
            agent_src[agent.name] = (self.out, stmts)

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
        o.line()
        if k.constexprs:
            o.line("# constexprs of this specialization")
            for name, value in k.constexprs:
                o.line(f"{name} = gl.constexpr({self.const(value) if isinstance(value, DType) else repr(value)})")
            o.line()
        o.line("# layouts")
        for name, ctor in self.layouts.items():
            o.line(f"{name} = gl.constexpr({ctor})  # {self.layout_notes[name]}")
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

        # move the layouts the agent bodies discovered into the module header
        src = o.source()
        lay_lines = "\n".join(f"{n} = gl.constexpr({c})  # {self.layout_notes[n]}" for n, c in self.layouts.items())
        src = re.sub(r"# layouts\n(?:[A-Z0-9_x]+ = gl\.constexpr\(.*\n)*", "# layouts\n" + lay_lines + "\n", src, count=1)

        desc_layouts = {}
        for n, kind, extra in params:
            if kind == "desc":
                t, shape = extra
                desc_layouts[n] = (t, list(shape), self.tensors[t].dtype)
        return RenderResult(src, k.name, params, self.tensors,
                            [(lb, a.name, r, w, g) for lb, a, r, w, g in parts], 4,
                            self.wait_sites, agent_ids, self.num_bars, self.debug_hang, desc_layouts)

    def _init_count(self, obj, side):
        return self.allocation.mbarrier(obj, side).arrive_count

    def helpers(self, o: Emitter):
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
        if not self.debug_hang:
            return
        timeout_ns = self.timeout_ms * 1_000_000
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
        o.line(f"    Polls xs_bars[index] for {self.timeout_ms} ms (%globaltimer). On timeout the first CTA to")
        o.line("    time out writes {1, SITE, count} at dbg[4 + 4 * AGENT] (dbg[0] = that CTA + 1),")
        o.line("    waits a grace period so other stuck agents can report too, and traps.")
        o.line('    """')
        o.line(f"    gl.inline_asm_elementwise(\"{asm}\",")
        o.line('                              "=r,r,r,l,n,n,r,~{memory}", '
               "[XS_BARS_SMEM + index * 8, phase, dbg, AGENT, SITE, count],")
        o.line("                              dtype=gl.int32, is_pure=False, pack=1)")


def render(kernel: ir.KernelIR, placement: Placement, allocation: HopperAllocation, options: dict | None = None):
    return NvidiaRenderer(kernel, placement, allocation, options).render()
