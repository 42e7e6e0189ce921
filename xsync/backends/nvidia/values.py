"""How the Hopper renderer spells values: types and layouts of tiles, expressions, wgmma
operands, loads (a mixin of :class:`xsync.backends.nvidia.render.NvidiaRenderer`).

Each expression renders to (Gluon code, :class:`T`): its kind (scalar, register tile, shared-
memory tile), shape, dtype and layout. A tile takes the layout its use asks for (``want``)
where it can; what a use asks of an earlier definition (a loop-carried value keeps one
layout) is settled before rendering (:mod:`xsync.backends.nvidia.layouts`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from xsync.api import DType
from xsync.backends.nvidia.layouts import SCALAR, LayoutRules, T
from xsync.backends.source import _PRECEDENCE, float_literal
from xsync.errors import BackendError
from xsync.lowering import ir

GL_DTYPES = {"float16": "gl.float16", "bfloat16": "gl.bfloat16", "float32": "gl.float32",
             "int32": "gl.int32", "int1": "gl.int1"}
SIG_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "int32": "i32", "int1": "i1"}
_GL_OPS = {"exp2": "gl.exp2", "log2": "gl.log2", "maximum": "gl.maximum", "minimum": "gl.minimum",
           "cdiv": "gl.cdiv", "program_id": "gl.program_id", "num_programs": "gl.num_programs"}


@dataclass
class TensorUse:
    """How one tensor parameter reaches the device."""

    name: str
    dtype: DType
    descs: dict = field(default_factory=dict)   # (rows, cols) -> descriptor parameter name
    pointer: bool = False                       # masked 2-D gl.load/gl.store through a pointer
    table: bool = False                         # 1-D int32 table read with xs.load_scalar


class ValueSpeller(LayoutRules):
    """Expressions in Gluon (state: ``env``, ``layouts``, ``consts``, ``tensors`` of the
    renderer); their types and layouts follow :class:`LayoutRules`, the layout requests on
    earlier definitions (``wants``) come settled from :func:`xsync.backends.nvidia.layouts.infer`."""

    # ------------------------------------------------------------ layouts
    def layout_const(self, name: str, ctor: str, note: str) -> str:
        # every layout was named by the inference (layouts.infer) before any text
        if name not in self.layouts:
            raise BackendError(f"internal: layout {name} was not inferred before rendering", loc=self.kernel.loc)
        return name

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
        """Type of ``e`` before spelling it (to plan its operands' layouts)."""
        return self.type_of(e)

    def subscript(self, e: ir.Subscript, want):
        inner = self.peek(e.value)
        idx = ", ".join("None" if i is None else ":" for i in e.index)
        if inner.kind != "tile" or len(inner.shape) != 1 or len(e.index) != 2:
            c, t = self.tx(e.value, None, 99)
            return f"{c}[{idx}]", t
        dim, parent = self.subscript_axis(e, inner, want)
        shape = (1, inner.shape[0]) if dim == 0 else (inner.shape[0], 1)
        c, _ = self.tx(e.value, f"gl.SliceLayout({dim}, {parent})", 99)
        return f"{c}[{idx}]", T("tile", shape, inner.dtype, parent)

    def field_view(self, e: ir.Attr):
        slot = e.value.id
        pipe = self.slot_pipe.get(slot)
        if pipe is None:
            self.fail(f"`{slot}.{e.attr}` is not a slot field here")
        t = self.field_type(e)
        return (f"{pipe.name}_{e.attr}" if t.kind != "smem" else f"{pipe.name}_{e.attr}.index({slot})"), t

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
            t = self.type_of(e, want)
            a, b = (int(self.cval(x, "xs.arange bounds", self.loc)) for x in e.args)
            return f"gl.arange({a}, {b}, layout={t.layout})", t
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
        at, bt, acc_l = self.mma_shapes(e)
        a, b = e.args[0], e.args[1]
        m, n = at.shape[0], bt.shape[1]
        bview = self.smem_operand(b)[0]
        reads = [bview]
        asm = self.smem_operand(a)
        if asm is not None:
            acode = asm[0]
            reads.insert(0, acode)
        else:
            acode, _ = self.tx(a, self.dot_operand_layout(acc_l, at))
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
