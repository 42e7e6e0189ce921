"""Types and layouts of the Hopper lowering, inferred once per agent program before any text
is emitted (the renderer, :mod:`xsync.backends.nvidia.render`, only spells them).

Every value has a :class:`T`: kind (scalar, register tile, shared-memory tile), shape, dtype
and layout. A tile takes the layout its use asks for (``want``) where it can. Some uses ask an
*earlier* definition for a layout: a loop-carried value must keep one layout (the layout a
later assignment produces, unless that is a default one), a 1-D value converted where it is
used, a register A operand of a wgmma (Q in attention: its definition takes the operand
layout, so a loop does not convert it each iteration). :class:`LayoutInference` walks an
agent's statements and collects these requests (``wants``) until a walk adds none: the
fixpoint. The result is an :class:`AgentLayouts`; the layout constants every agent and the
entry function use make up :class:`ModuleLayouts` (the module header).

:class:`LayoutRules` is shared with the renderer, which only spells: it takes the type of
every expression and definition from the same rules (type_of, broadcast, definition).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Mapping

from xsync.dtypes import DType
from xsync.backends.nvidia.alloc import is_tma_pipe
from xsync.errors import BackendError
from xsync.lowering import ir
from xsync.lowering.protocol import NotConstant, evaluate, evaluated
from xsync.lowering.slicing import agent_body

DEFAULT_LAYOUTS = ("ROW_", "BLOCKED_")     # prefixes of the layouts a tile gets when nothing asks
WALKS = 4                                  # a fixpoint takes two walks in every kernel so far
WGMMA_DTYPES = ("bfloat16", "float16")     # operand types the accumulator layout's K=16 wgmma takes


class ValueKind(StrEnum):
    """Where a value lives."""

    SCALAR = "scalar"               # a scalar (a Python or Gluon scalar, a constexpr)
    TILE = "tile"                   # a register tile, in a distributed layout
    SMEM = "smem"                   # a shared-memory tile (a pipe slot's field)


@dataclass(frozen=True)
class T:
    kind: ValueKind
    shape: tuple = ()
    dtype: DType | None = None
    layout: str | None = None       # Gluon layout expression (tiles, smem)


SCALAR = T(ValueKind.SCALAR)


@dataclass(frozen=True)
class LayoutConstant:
    """One ``NAME = gl.constexpr(<ctor>)  # note`` line of the module header."""

    name: str
    ctor: str
    note: str


@dataclass(frozen=True)
class AgentLayouts:
    """One agent program's types. ``stores`` and ``loop_entry`` are keyed by the identity (``id``)
    of the statement objects of the program the inference walked (``infer``'s ``bodies``): the
    planning steps before spelling read them for the same objects."""

    agent: str
    wants: Mapping[str, str]        # variable -> the layout its definitions take (the fixpoint)
    variables: Mapping[str, T]      # variable -> its type at the end of the program
    walks: int                      # walks until the wants settled
    # whole-tile xs.store -> its value's type; loop -> the variables' types before it
    stores: Mapping[int, T] = field(default_factory=lambda: MappingProxyType({}))
    loop_entry: Mapping[int, Mapping[str, T]] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class ModuleLayouts:
    agents: Mapping[str, AgentLayouts]
    constants: tuple[LayoutConstant, ...]   # in order of first use


def nvmma_shared_layout(shape, dtype: DType, cga=None):
    """The NVMMASharedLayout Gluon picks for a tile (TMA boxes and wgmma operands); ``cga``: the
    CGA bases of a tile spread over a cluster's CTAs (xsync/backends/nvidia/cluster_ctas.py)."""
    from triton.experimental.gluon import language as gl
    if cga:
        return gl.NVMMASharedLayout.get_default_for(list(shape), getattr(gl, dtype.name), cga_layout=cga)
    return gl.NVMMASharedLayout.get_default_for(list(shape), getattr(gl, dtype.name))


def nvmma_shared_repr(shape, dtype: DType, cga=None) -> str:
    try:
        return "gl." + repr(nvmma_shared_layout(shape, dtype, cga))
    except ImportError:
        # No triton here (e.g. `xsync lower` in the core venv): same rule as
        # NVMMASharedLayout.get_default_for for 2-D, non-transposed tiles.
        row_bytes = shape[-1] * dtype.bits // 8
        swizzle = next((w for w in (128, 64, 32) if row_bytes >= w), 0)
        return (f"gl.NVMMASharedLayout(swizzle_byte_width={swizzle}, element_bitwidth={dtype.bits}, "
                f"rank=2, transposed=False, fp4_padded=False, cga_layout={cga or []})")


def smem_name(shape, dtype: DType, multicast: bool = False) -> str:
    """The module constant of a shared-memory tile's layout (``_MC``: a multicast field's)."""
    return f"SMEM_{dtype.name.upper()}_{shape[0]}x{shape[1]}" + ("_MC" if multicast else "")


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class LayoutRules:
    """Layout choices and expression types (state: ``env``, ``slot_pipe``, ``consts``,
    ``tensors``, ``warps``, ``usual_cols``, ``wants``, ``layouts``, ``placement``, ``loc``).

    ``type_of(e, want, record)`` is the type of ``e`` (the renderer spells it in that type);
    ``record`` says whether requests on earlier definitions count (not for look-aheads)."""

    recording = False               # the inference records requests; the renderer reads them
    dead = 0                        # > 0 inside an `if` whose constexpr test is false
    split = None                    # cluster_ctas.CtaSplit: tiles spread over a cluster's CTAs

    def cga(self, rank: int, split: bool = True) -> str:
        """``, cga_layout=...`` of a layout in a kernel spread over CTAs ("" otherwise)."""
        return f", cga_layout={self.split.bases(rank, split)}" if self.split is not None else ""

    # ------------------------------------------------------------ constants
    def cval(self, e, what, loc):
        try:
            return evaluate(e, self.consts)
        except (NotConstant, TypeError):
            self.fail(f"{what} must be a compile-time constant", loc=loc,
                      fix="use literals and constexpr parameters")

    def constant_truth(self, e):
        """True/False for a test of constexprs and literals, None for a run-time one."""
        v = evaluated(e, self.consts)
        return None if v is None else bool(v)

    def shape_of(self, e, loc) -> tuple:
        items = e.items if isinstance(e, ir.TupleExpr) else (e,)
        return tuple(int(self.cval(x, "a tile shape", loc)) for x in items)

    # ------------------------------------------------------------ layouts
    def layout_const(self, name: str, ctor: str, note: str) -> str:
        self.layouts.setdefault(name, LayoutConstant(name, ctor, note))
        return name

    def layout2d(self, shape) -> str:
        """Distributed layout of a 2-D register tile in the current partition."""
        r, c = shape
        if self.warps == 4 and c % 8 == 0 and 8 <= c <= 256:
            # The wgmma accumulator layout depends on the column count only, so every
            # [*, c] tile of a consumer warpgroup shares it (no layout conversions).
            return self.layout_const(
                f"ACC_N{c}",
                f"gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, {c}, 16]"
                f"{self.cga(2)})",
                f"wgmma accumulator layout: [*, {c}] tiles of a consumer warpgroup")
        w = self.warps
        return self.layout_const(
            f"BLOCKED_{w}W", f"gl.BlockedLayout([1, 4], [4, 8], [{w}, 1], [1, 0]{self.cga(2)})",
            f"2-D register tiles in {w}-warp partitions")

    def layout1d(self) -> str:
        w = self.warps
        return self.layout_const(f"ROW_{w}W", f"gl.BlockedLayout([1], [32], [{w}], [0]{self.cga(1)})",
                                 f"1-D register tiles in {w}-warp partitions")

    def smem_layout(self, shape, dtype, multicast: bool = False) -> str:
        mc = multicast and self.split is not None
        name = smem_name(shape, dtype, mc)
        # split by rows over the CTAs, or the same tile in every CTA
        ctor = nvmma_shared_repr(shape, dtype, self.split.bases(2, not mc) if self.split is not None else None)
        return self.layout_const(name, ctor, f"shared-memory tile [{shape[0]}, {shape[1]}] {dtype.name}"
                                 + (", every CTA of the cluster (multicast)" if mc else
                                    ", split by rows over the cluster's CTAs" if self.split else ""))

    def bshape(self, ts, want):
        tiles = [t for t in ts if t.kind is ValueKind.TILE]
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
            derived = [lay for lay in full if not lay.startswith(DEFAULT_LAYOUTS)]
            return shape, (derived or full)[0]
        if rank == 2:
            return shape, self.layout2d(shape)
        lays = [t.layout for t in tiles if t.layout]
        return shape, lays[0] if lays else self.layout1d()

    def broadcast(self, args, want):
        """(shape, layout, the layout each operand is asked for) of an elementwise op; shape
        None: a scalar op."""
        ts = [self.type_of(a) for a in args]
        shape, lay = self.bshape(ts, want)
        return shape, lay, [None if shape is None or t.kind is not ValueKind.TILE else
                            f"gl.SliceLayout(0, {lay})" if len(t.shape) < len(shape) else lay for t in ts]

    @staticmethod
    def promote(*ts):
        dts = [t.dtype for t in ts if t.kind is ValueKind.TILE and t.dtype is not None]
        for name in ("float32", "bfloat16", "float16"):
            for d in dts:
                if d.name == name:
                    return d
        return dts[0] if dts else None

    def dot_operand_layout(self, acc_l: str, at: T) -> str:
        bits = (at.dtype.bits if at.dtype else 16)
        return f"gl.DotOperandLayout(operand_index=0, parent={acc_l}, k_width={32 // bits})"

    @staticmethod
    def cast_first(want) -> bool:
        """A cast read as an mma operand is cast where it is computed and then converted:
        the conversion moves the narrower values (`p.to(bf16)` in the accumulate form)."""
        return want is not None and want.startswith("gl.DotOperandLayout(")

    # ------------------------------------------------------------ types
    def converted(self, t: T, want, name=None, record=False) -> T:
        """``t`` in layout ``want`` (a gl.convert_layout where it differs). A 1-D variable
        converted at a use asks its definition for that layout."""
        if t.kind is ValueKind.TILE and want is not None and t.layout != want:
            if record and name is not None and len(t.shape) == 1 and not want.startswith(DEFAULT_LAYOUTS):
                self.wants.setdefault(name, want)
            return T(ValueKind.TILE, t.shape, t.dtype, want)
        return t

    def type_of(self, e, want=None, record=False) -> T:
        if isinstance(e, ir.Const):
            return SCALAR
        if isinstance(e, ir.Name):
            if e.id in self.consts:
                return SCALAR
            t = self.env.get(e.id, SCALAR)
            if t.kind is ValueKind.SMEM:
                return T(ValueKind.TILE, t.shape, t.dtype, want or self.layout2d(t.shape))
            return self.converted(t, want, e.id, record)
        if isinstance(e, (ir.BinOp, ir.Compare)):
            return self.elementwise_type(e, (e.left, e.right), want, record)
        if isinstance(e, ir.BoolOp):
            return self.elementwise_type(e, e.values, want, record)
        if isinstance(e, ir.UnaryOp):
            return self.type_of(e.operand, want, record)
        if isinstance(e, ir.TupleExpr):
            for i in e.items:
                self.type_of(i, None, record)
            return SCALAR
        if isinstance(e, ir.Subscript):
            return self.subscript_type(e, want, record)
        if isinstance(e, ir.Cast):
            if self.cast_first(want):
                t = self.type_of(e.value, None, record)
                return SCALAR if t.kind is ValueKind.SCALAR else self.converted(T(ValueKind.TILE, t.shape, e.dtype, t.layout), want)
            t = self.type_of(e.value, want, record)
            return SCALAR if t.kind is ValueKind.SCALAR else T(ValueKind.TILE, t.shape, e.dtype, t.layout)
        if isinstance(e, ir.Attr):
            t = self.field_type(e)
            if t.kind is ValueKind.SMEM:
                return T(ValueKind.TILE, t.shape, t.dtype, want or self.layout2d(t.shape))
            return self.converted(t, want)
        if isinstance(e, ir.Call):
            return self.call_type(e, want, record)
        raise TypeError(f"cannot type {e!r}")

    def elementwise_type(self, e, args, want, record) -> T:
        """Type of a broadcasting op (arithmetic, comparison, and/or, maximum, where...)."""
        shape, lay, wants = self.broadcast(args, want)
        ts = [self.type_of(a, w, record) for a, w in zip(args, wants)]
        if shape is None:
            return SCALAR
        if isinstance(e, (ir.Compare, ir.BoolOp)):
            return T(ValueKind.TILE, shape, DType("int1", 8), lay)
        return T(ValueKind.TILE, shape, self.promote(*(ts[1:] if isinstance(e, ir.Call) and e.op is ir.TileOp.WHERE else ts)), lay)

    def subscript_axis(self, e: ir.Subscript, inner: T, want):
        """(expanded axis, 2-D parent layout) of ``v[None, :]`` / ``v[:, None]`` on a 1-D tile."""
        dim = e.index.index(None)
        parent = want or (inner.layout[len(f"gl.SliceLayout({dim}, "):-1]
                          if inner.layout and inner.layout.startswith(f"gl.SliceLayout({dim}, ") else None)
        if parent is None:
            # the other extent is unknown here: guess the agent's usual column count (a
            # wrong guess is fixed by the request it makes on the definition)
            cols = inner.shape[0] if dim == 0 else self.usual_cols or inner.shape[0]
            parent = self.layout2d((64, cols))
        return dim, parent

    @staticmethod
    def expands(e: ir.Subscript, inner: T) -> bool:
        """Whether ``e`` is ``v[None, :]`` / ``v[:, None]`` on a 1-D tile ``v``."""
        return inner.kind is ValueKind.TILE and len(inner.shape) == 1 and len(e.index) == 2

    def row_vector(self, e) -> bool:
        """Whether ``e`` is ``v[None, :]`` on a 1-D tile ``v``: an ``xs.store`` of one row
        stores ``v`` in its own layout (no conversion to a 2-D parent's column slice, which
        costs a shared-memory round trip per vector)."""
        return (isinstance(e, ir.Subscript) and e.index == (None, ":")
                and self.expands(e, self.type_of(e.value)))

    def subscript_want(self, e: ir.Subscript, t: T):
        """The layout the subscripted value is asked for, given the subscript's type ``t``."""
        return f"gl.SliceLayout({e.index.index(None)}, {t.layout})" if self.expands(e, self.type_of(e.value)) else None

    def subscript_type(self, e: ir.Subscript, want, record):
        inner = self.type_of(e.value)
        if not self.expands(e, inner):
            return self.type_of(e.value, None, record)
        dim, parent = self.subscript_axis(e, inner, want)
        shape = (1, inner.shape[0]) if dim == 0 else (inner.shape[0], 1)
        self.type_of(e.value, f"gl.SliceLayout({dim}, {parent})", record)
        return T(ValueKind.TILE, shape, inner.dtype, parent)

    def field_type(self, e: ir.Attr) -> T:
        slot = e.value.id
        pipe = self.slot_pipe.get(slot)
        if pipe is None:
            self.fail(f"`{slot}.{e.attr}` is not a slot field here")
        spec = pipe.field(e.attr)
        if not self.placement.crosses(pipe):
            return self.env.get(f"{pipe.name}_{e.attr}", T(ValueKind.TILE, spec.shape, spec.dtype, None))
        return T(ValueKind.SMEM, spec.shape, spec.dtype, self.smem_layout(spec.shape, spec.dtype, spec.multicast))

    def smem_operand_type(self, e):
        """Type of a shared-memory mma operand, or None if it lives in registers."""
        if isinstance(e, ir.Attr) and isinstance(e.value, ir.Name) and e.value.id in self.slot_pipe \
                and self.placement.crosses(self.slot_pipe[e.value.id]):
            return self.field_type(e)
        if isinstance(e, ir.Call) and e.op is ir.TileOp.TRANS:
            t = self.smem_operand_type(e.args[0])
            if t is not None:
                return T(ValueKind.SMEM, tuple(reversed(t.shape)), t.dtype, t.layout)
        return None

    def call_type(self, e: ir.Call, want, record):
        op = e.op
        if op in (ir.TileOp.PROGRAM_ID, ir.TileOp.NUM_PROGRAMS, ir.TileOp.CDIV):
            for a in e.args:
                self.type_of(a, None, record)
            return SCALAR
        if op is ir.TileOp.REPLICA_ID:
            return SCALAR
        if op in (ir.TileOp.MAXIMUM, ir.TileOp.MINIMUM, ir.TileOp.EXP2, ir.TileOp.LOG2, ir.TileOp.WHERE):
            return self.elementwise_type(e, e.args, want, record)
        if op in ir.UNARY_MATH or op is ir.TileOp.POW:     # float32 math (xsync.api), abs keeps
            t = self.type_of(e.args[0], want, record)
            if t.kind is not ValueKind.TILE or op is ir.TileOp.ABS:
                return t
            return T(ValueKind.TILE, t.shape, DType("float32", 32), t.layout)
        if op is ir.TileOp.ARANGE:
            a, b = (int(self.cval(x, "xs.arange bounds", self.loc)) for x in e.args)
            if not _pow2(b - a):
                self.fail(f"xs.arange({a}, {b}): the length must be a power of two", loc=self.loc)
            return T(ValueKind.TILE, (b - a,), DType("int32", 32), want or self.layout1d())
        if op in (ir.TileOp.ZEROS, ir.TileOp.FULL):
            shape = self.shape_of(e.args[0], self.loc)
            lay = want or (self.layout2d(shape) if len(shape) == 2 else self.layout1d())
            if op is ir.TileOp.FULL:
                self.type_of(e.args[1], None, record)
            return T(ValueKind.TILE, shape, e.args[-1].value, lay)
        if op in (ir.TileOp.MAX, ir.TileOp.SUM):
            axis = int(self.cval(e.args[1], "the reduction axis", self.loc))
            t = self.type_of(e.args[0], None, record)
            shape = tuple(d for i, d in enumerate(t.shape) if i != axis)
            return self.converted(T(ValueKind.TILE, shape, t.dtype, f"gl.SliceLayout({axis}, {t.layout})"), want)
        if op is ir.TileOp.TRANS:
            t = self.type_of(e.args[0], None, record)
            shape = tuple(reversed(t.shape))
            return T(ValueKind.TILE, shape, t.dtype, want or self.layout2d(shape))
        if op is ir.TileOp.LOAD:
            shape = self.shape_of(e.args[2], self.loc)
            if len(shape) not in (1, 2):
                self.fail("xs.load reads 1-D or 2-D tiles", loc=self.loc)
            lay = want or (self.layout2d(shape) if len(shape) == 2 else self.layout1d())
            for x in e.args[1].items:
                self.type_of(x, None, record)
            return T(ValueKind.TILE, shape, self.tensors[e.args[0].id].dtype, lay)
        if op is ir.TileOp.LOAD_SCALAR:
            self.type_of(e.args[1], None, record)
            return SCALAR
        if op is ir.TileOp.MMA:
            return self.mma_type(e, want, record)
        if op is ir.TileOp.MMA_WAIT:
            t = self.type_of(e.args[0], None, record)
            self.cval(e.kwarg("pending", ir.Const(0)), "mma_wait pending", self.loc)
            return t
        self.fail(f"xs.{op} has no Hopper lowering yet", loc=self.loc)

    def mma_shapes(self, e: ir.Call):
        """(A type, B type, accumulator layout) of an xs.mma; B must be a slot in shared memory."""
        if self.warps != 4:
            self.fail("xs.mma outside a 4-warp consumer partition", loc=self.loc)
        a, b = e.args[0], e.args[1]
        bt = self.smem_operand_type(b)
        if bt is None:
            self.fail("the B operand of xs.mma must come from a pipe slot (wgmma reads B from shared "
                      "memory)", loc=self.loc, fix="pass B through a pipe from its producer role")
        at = self.type_of(a) if self.smem_operand_type(a) is None else self.smem_operand_type(a)
        for name, t in (("A", at), ("B", bt)):
            if t.dtype is not None and t.dtype.name not in WGMMA_DTYPES and not self.dead:
                self.fail(f"xs.mma's {name} operand is {t.dtype.name}: the Hopper lowering multiplies "
                          f"16-bit tiles (wgmma with bf16 or fp16 operands)", loc=self.loc,
                          fix="convert the operand where it is made (`slot.f = (...).to(xs.bfloat16)`, or "
                              "declare the pipe field bfloat16/float16); the accumulator stays float32")
        m, n = at.shape[0], bt.shape[1]
        acc_l = self.layout2d((m, n))
        # a branch a constexpr turns off (`if FUSED_DQ:`) is never compiled (Gluon drops it):
        # its products need no wgmma shape
        if (not acc_l.startswith("ACC_") or m % 64) and not self.dead:
            self.fail(f"xs.mma result [{m}, {n}] has no wgmma layout (M must be a multiple of 64, "
                      f"N a multiple of 8 up to 256)", loc=self.loc)
        return at, bt, acc_l

    def mma_type(self, e: ir.Call, want, record):
        at, bt, acc_l = self.mma_shapes(e)
        a = e.args[0]
        if self.smem_operand_type(a) is None:
            dot_l = self.dot_operand_layout(acc_l, at)
            if record and isinstance(a, ir.Name) and a.id not in self.consts and at.kind is ValueKind.TILE \
                    and at.layout != dot_l:
                # a register A operand held in a variable (Q in attention): its definition
                # takes the operand layout, so a loop does not convert it every iteration
                self.wants.setdefault(a.id, dot_l)
            self.type_of(a, dot_l, record)
        if len(e.args) > 2 and not (isinstance(e.args[2], ir.Const) and e.args[2].value is None):
            self.type_of(e.args[2], acc_l, record)
        return T(ValueKind.TILE, (at.shape[0], bt.shape[1]), DType("float32", 32), acc_l)

    # ------------------------------------------------------------ definitions
    def assigned_type(self, target: str, v) -> tuple[T | None, str | None]:
        """(previous type, layout the definition must end in) of ``target = v``: the layout
        the wants ask for, else the layout of the variable's previous definition."""
        want = self.wants.get(target)
        prev = self.env.get(target)
        if want is None and prev is not None and prev.kind is ValueKind.TILE:
            if self.recording:
                # a loop-carried value keeps one layout: if this value's natural layout is a
                # derived one, the first definition takes it (next walk)
                natural = self.type_of(v)
                if natural.kind is ValueKind.TILE and natural.layout and natural.layout != prev.layout \
                        and not natural.layout.startswith(DEFAULT_LAYOUTS):
                    self.wants.setdefault(target, natural.layout)
            want = prev.layout
        return prev, want

    def definition(self, target: str, v, prev: T | None, want: str | None, record=False):
        """(layout asked of ``v``, type of ``v``, type ``target`` takes) of ``target = v``:
        a value defined again (loop-carried, or a peeled copy of a loop body) keeps one
        layout; an mma operand is computed in its natural layout and converted once."""
        if want is not None and want.startswith("gl.DotOperandLayout(") and not (
                isinstance(v, ir.Call) and v.op in (ir.TileOp.MMA, ir.TileOp.MMA_WAIT)):
            t = self.type_of(v, None, record)
            return None, t, self.converted(t, want)
        t = self.type_of(v, want, record)
        if t.kind is ValueKind.TILE and want is not None and t.layout != want and (
                target in self.wants or (prev is not None and prev.kind is ValueKind.TILE and t.shape == prev.shape)):
            return want, t, self.converted(t, want)
        return want, t, t

    def define(self, target: str, t: T):
        if t.kind is ValueKind.TILE and len(t.shape) == 2 and t.shape[1] > 1 and self.usual_cols is None:
            self.usual_cols = t.shape[1]
        self.env[target] = t


class LayoutInference(LayoutRules):
    """Walks one agent program after another (statements of :mod:`xsync.lowering.ir`) and
    records the types, layout requests and layout constants the renderer will spell."""

    recording = True

    def __init__(self, kernel: ir.KernelIR, placement, consts: dict, tensors: dict):
        self.kernel = kernel
        self.placement = placement
        self.consts = consts
        self.tensors = tensors
        self.layouts: dict[str, LayoutConstant] = {}
        self.loc = kernel.loc

    def fail(self, what, loc=None, objects=(), fix=""):
        raise BackendError(what, loc=loc or self.kernel.loc, objects=tuple(objects), fix=fix)

    def agent(self, agent, warps: int, stmts) -> AgentLayouts:
        self.warps = warps
        self.wants: dict[str, str] = {}
        for walk in range(1, WALKS + 1):
            before = dict(self.wants)
            self.env: dict[str, T] = {}
            self.slot_pipe: dict[str, ir.Pipe] = {}
            self.usual_cols = None
            self.loc = self.kernel.loc
            self.stores: dict[int, T] = {}
            self.loop_entry: dict[int, Mapping[str, T]] = {}
            self.block(stmts)
            if walk >= 2 and self.wants == before:
                return AgentLayouts(agent.name, MappingProxyType(dict(self.wants)),
                                    MappingProxyType(dict(self.env)), walk, MappingProxyType(self.stores),
                                    MappingProxyType(self.loop_entry))
        self.fail(f"the register layouts of agent '{agent.name}' did not settle in {WALKS} walks",
                  fix="report this kernel: the Hopper layout inference needs another rule")

    def block(self, stmts):
        for s in stmts:
            self.loc = getattr(s, "loc", self.loc)
            self.stmt(s)

    def stmt(self, s):
        if isinstance(s, ir.Assign):
            self.assign(s)
        elif isinstance(s, ir.SlotWrite):
            pipe = self.kernel.sync_object(s.pipe)
            if not self.placement.crosses(pipe):
                self.env[f"{pipe.name}_{s.field}"] = self.type_of(s.value, None, True)
            elif is_tma_pipe(self.kernel, pipe):
                for x in s.value.args[1].items:
                    self.type_of(x, None, True)
            else:
                self.type_of(s.value, None, True)
        elif isinstance(s, ir.Store):
            if self.row_vector(s.value):
                self.type_of(s.value.value, None, True)
                t = self.type_of(s.value)
            else:
                t = self.type_of(s.value, None, True)
                if len(t.shape) == 2:       # a 1-D tile is stored in its own layout, unstaged
                    self.stores[id(s)] = t
            if t.kind is not ValueKind.TILE or len(t.shape) not in (1, 2):
                self.fail("xs.store writes 1-D or 2-D tiles", loc=s.loc)
            for x in (*s.offsets, *(s.bounds or ())):
                self.type_of(x, None, True)
        elif isinstance(s, ir.RoleBlock):
            self.block(s.body)
        elif isinstance(s, ir.For):
            for x in (s.start, s.stop, s.step):
                self.type_of(x, None, True)
            self.loop_entry[id(s)] = MappingProxyType(dict(self.env))
            self.env[s.var] = SCALAR
            self.block(s.body)
        elif isinstance(s, ir.If):
            self.type_of(s.cond, None, True)
            off = self.constant_truth(s.cond)
            self.dead += off is False
            self.block(s.body)
            self.dead -= off is False
            self.dead += off is True
            self.block(s.orelse or ())
            self.dead -= off is True
        elif isinstance(s, ir.SyncOp):
            self.sync(s)

    def sync(self, s: ir.SyncOp):
        obj = self.kernel.sync_object(s.obj)
        crossing_release = isinstance(obj, ir.Pipe) and s.verb is ir.Verb.RELEASE and self.placement.crosses(obj)
        if s.guard is not None and not crossing_release:
            self.type_of(s.guard, None, True)
            self.sync(ir.SyncOp(s.verb, s.obj, s.target, s.loc, note=s.note))
        elif isinstance(obj, ir.Pipe):
            if s.target:
                self.slot_pipe[s.target] = obj
            if not self.placement.crosses(obj):
                return
            if s.verb in (ir.Verb.ACQUIRE, ir.Verb.WAIT) and s.target:
                self.env[s.target] = SCALAR
            elif s.verb is ir.Verb.RELEASE and s.guard is not None:
                if evaluated(s.guard, self.consts) is None:
                    self.type_of(s.guard, None, True)     # a predicated arrive spells the guard

    def assign(self, s: ir.Assign):
        v = s.value
        if len(s.targets) > 1:
            if not isinstance(v, ir.TupleExpr):
                self.fail("tuple assignment needs a tuple", loc=s.loc)
            for n, x in zip(s.targets, v.items):
                self.env[n] = self.type_of(x, None, True)
            return
        target = s.targets[0]
        if isinstance(v, ir.Name) and v.id in self.slot_pipe:
            self.slot_pipe[target] = self.slot_pipe[v.id]
            self.env[target] = SCALAR
            return
        prev, want = self.assigned_type(target, v)
        if isinstance(v, ir.Call) and v.op is ir.TileOp.MMA_WAIT:
            self.env[target] = self.type_of(v.args[0], want, True)
            self.cval(v.kwarg("pending", ir.Const(0)), "mma_wait pending", s.loc)
            return
        self.define(target, self.definition(target, v, prev, want, True)[2])


class ScopeTypes(LayoutRules):
    """Expression types at one point of an agent program, from its variables' types there
    (``AgentLayouts.loop_entry``); read-only, for the planning steps that run before spelling."""

    def __init__(self, kernel: ir.KernelIR, placement, consts: dict, tensors: dict, agent: AgentLayouts,
                 variables: Mapping[str, T], warps: int):
        self.kernel = kernel
        self.placement = placement
        self.consts = consts
        self.tensors = tensors
        self.wants = agent.wants
        self.env = dict(variables)
        self.warps = warps
        self.slot_pipe: dict[str, ir.Pipe] = {}
        self.usual_cols = None
        self.layouts: dict[str, LayoutConstant] = {}     # names a probe would coin are dropped
        self.loc = kernel.loc

    def fail(self, what, loc=None, objects=(), fix=""):
        raise BackendError(what, loc=loc or self.kernel.loc, objects=tuple(objects), fix=fix)


def infer(kernel: ir.KernelIR, placement, allocation, consts: dict, tensors: dict,
          bodies: Mapping[str, tuple] | None = None) -> ModuleLayouts:
    """Types and layouts of every agent program, and the module's layout constants: those the
    agents use (in order of first use), then the shared-memory rings of the entry function.
    ``bodies``: agent -> the statements to walk (default: ``agent_body``)."""
    inf = LayoutInference(kernel, placement, consts, tensors)
    inf.split = allocation.cta_split
    agents = {}
    for agent in placement.agents:
        warps = allocation.partitions_of(agent.name)[0].warps
        stmts = bodies[agent.name] if bodies is not None else agent_body(kernel, agent)
        agents[agent.name] = inf.agent(agent, warps, stmts)
    for p in kernel.pipes:
        if placement.crosses(p):
            for f in p.fields:
                inf.smem_layout(f.shape, f.dtype, f.multicast)
    return ModuleLayouts(MappingProxyType(agents), tuple(inf.layouts.values()))
