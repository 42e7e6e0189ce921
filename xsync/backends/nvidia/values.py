"""How the Hopper renderer spells values: expressions, shared-memory views, wgmma operands,
loads (one :class:`ValueSpeller` per agent program, owned by the renderer's agent speller).

Spelling decides no type: an expression's :class:`T` (kind, shape, dtype, layout) and the
layouts its operands are asked for come from :class:`LayoutRules` (``type_of``, ``broadcast``,
``subscript_want``, ``definition``), the rules the inference ran
(:mod:`xsync.backends.nvidia.layouts`); the code follows the type, e.g. a
``gl.convert_layout`` where the type's layout differs from the layout the value is held in.
"""
from __future__ import annotations

from typing import Mapping

from xsync.dtypes import DType
from xsync.backends.nvidia import exp2
from xsync.backends.nvidia.tensors import leading
from xsync.backends.nvidia.layouts import SCALAR, AgentLayouts, LayoutConstant, LayoutRules, T, ValueKind
from xsync.backends.source import PRECEDENCE, Emitter, float_literal, int_power, spell_math
from xsync.errors import BackendError
from xsync.lowering import ir

GL_DTYPES = {"float16": "gl.float16", "bfloat16": "gl.bfloat16", "float32": "gl.float32",
             "int32": "gl.int32", "int1": "gl.int1"}
SIG_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "int32": "i32", "int1": "i1"}
_GL_OPS = {ir.TileOp.EXP2: "gl.exp2", ir.TileOp.LOG2: "gl.log2", ir.TileOp.MAXIMUM: "gl.maximum",
           ir.TileOp.MINIMUM: "gl.minimum", ir.TileOp.CDIV: "gl.cdiv", ir.TileOp.PROGRAM_ID: "gl.program_id",
           ir.TileOp.NUM_PROGRAMS: "gl.num_programs", ir.TileOp.WHERE: "gl.where"}

# math functions Gluon has in both Triton 3.6 and 3.9 (tanh, sigmoid, pow are spelled from exp)
_GL_MATH = frozenset({ir.TileOp.SQRT, ir.TileOp.RSQRT, ir.TileOp.EXP, ir.TileOp.LOG, ir.TileOp.ERF})


class ValueSpeller(LayoutRules):
    """Expressions of one agent program in Gluon, written to ``out``. It owns the program's
    variable types (``env``), the slots bound to pipes (``slot_pipe``), the fresh-name counter
    and the shared-memory reads of the last wgmma; the layout requests on earlier definitions
    (``wants``) and the layout constants come settled from
    :func:`xsync.backends.nvidia.layouts.infer`."""

    def __init__(self, *, kernel: ir.KernelIR, placement, consts: dict, tensors: dict,
                 layouts: Mapping[str, LayoutConstant], typed: AgentLayouts, warps: int, out: Emitter,
                 exp2_share: str | None, names=None):
        self.kernel = kernel
        self.names = names if names is not None else (lambda n: n)   # the kernel's names as spelled
        self.placement = placement
        self.consts = consts
        self.tensors = tensors
        self.layouts = layouts
        self.wants = typed.wants
        self.warps = warps
        self.out = out
        self.exp2_share = exp2_share             # option exp2_fma (exp2.py)
        self.exp2_used = False                   # a share of a tile's exp2 went to the FMA pipe
        self.env: dict[str, T] = {}
        self.slot_pipe: dict[str, ir.Pipe] = {}
        self.tmp = 0
        self.loc = kernel.loc
        self.usual_cols = None
        self.last_mma_reads: list[str] = []

    def fail(self, what, loc=None, objects=(), fix=""):
        raise BackendError(what, loc=loc or self.kernel.loc, objects=tuple(objects), fix=fix)

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

    def view(self, code: str, held: T, t: T) -> str:
        """``code`` (a value of type ``held`` where it lives) read as type ``t``: a shared-memory
        load, or a layout conversion where the layouts differ."""
        if held.kind is ValueKind.SMEM:
            return f"{code}.load({t.layout})"
        if held.kind is ValueKind.TILE and t.layout != held.layout:
            return f"gl.convert_layout({code}, {t.layout})"
        return code

    def tx(self, e, want: str | None = None, parent: int = 0):
        """Spell expression ``e`` -> (code, type). ``want``: layout the result must have; the
        type is the inference's (:meth:`LayoutRules.type_of`), the code only follows it."""
        t = self.type_of(e, want)
        return self.spell(e, t, want, parent), t

    def spell(self, e, t: T, want, parent: int) -> str:
        if isinstance(e, ir.Const):
            return self.const(e.value)
        if isinstance(e, ir.Name):
            if e.id in self.consts:
                return self.names(e.id)
            return self.view(self.names(e.id), self.env.get(e.id, SCALAR), t)
        if isinstance(e, (ir.BinOp, ir.Compare)):
            p = PRECEDENCE["cmp" if isinstance(e, ir.Compare) else e.op]
            left, right = self.operands((e.left, e.right), want, (p + isinstance(e, ir.Compare), p + 1))
            code = f"{left} {e.op} {right}"
            return f"({code})" if p < parent else code
        if isinstance(e, ir.BoolOp):
            p = PRECEDENCE[e.op]
            parts = self.operands(e.values, want, [p + 1] * len(e.values))
            if t.kind is ValueKind.SCALAR:
                code = parts[0]
                for i, x in enumerate(parts[1:], 2):     # pairs: Triton refuses A or B or C
                    code = f"{code} {e.op} {x}" if i == len(parts) else f"({code} {e.op} {x})"
                return f"({code})" if p < parent else code
            return "(" + (" & " if e.op == "and" else " | ").join(f"({x})" for x in parts) + ")"
        if isinstance(e, ir.UnaryOp):
            c = self.tx(e.operand, want, PRECEDENCE["unary"])[0]
            if e.op == "not":
                return f"not {c}" if t.kind is ValueKind.SCALAR else f"~({c})"
            return f"{e.op}{c}"
        if isinstance(e, ir.TupleExpr):
            return "[" + ", ".join(self.tx(i)[0] for i in e.items) + "]"
        if isinstance(e, ir.Subscript):
            idx = ", ".join("None" if i is None else ":" for i in e.index)
            return f"{self.tx(e.value, self.subscript_want(e, t), 99)[0]}[{idx}]"
        if isinstance(e, ir.Cast):
            if self.cast_first(want):
                code, inner = self.tx(e.value, None, 99)
                held = T(ValueKind.TILE, inner.shape, e.dtype, inner.layout) if inner.kind is ValueKind.TILE else inner
                return self.view(f"{code}.to({self.dtype(e.dtype)})", held, t)
            return f"{self.tx(e.value, want, 99)[0]}.to({self.dtype(e.dtype)})"
        if isinstance(e, ir.Attr):
            return self.view(*self.field_view(e), t)
        if isinstance(e, ir.Call):
            return self.call(e, t, want)
        raise TypeError(f"cannot render {e!r}")

    def operands(self, args, want, parents) -> list[str]:
        """The operands of a broadcasting op, each in the layout the op asks of it; a 1-D tile
        of a 2-D op gets its leading axis (``[None, :]``, as torch broadcasts): Gluon broadcasts
        equal ranks only."""
        shape, _, wants = self.broadcast(args, want)
        out = []
        for a, w, parent in zip(args, wants, parents):
            lower = shape is not None and w is not None and len(self.type_of(a).shape) < len(shape)
            code = self.tx(a, w, 99 if lower else parent)[0]
            out.append(f"{code}[None, :]" if lower else code)
        return out

    def field_view(self, e: ir.Attr):
        """(code, type) of a slot field where it lives: registers, or the slot's shared memory."""
        slot = e.value.id
        pipe = self.slot_pipe.get(slot)
        if pipe is None:
            self.fail(f"`{slot}.{e.attr}` is not a slot field here")
        t = self.field_type(e)
        if t.kind is not ValueKind.SMEM:
            return f"{pipe.name}_{e.attr}", t
        ring = "" if e.part is None else f"{e.part * pipe.stages} + "    # an N -> 1 pipe: replica part's ring
        return f"{pipe.name}_{e.attr}.index({ring}{self.names(slot)})", t

    def smem_operand(self, e):
        """Shared-memory view for an mma operand, or None if it lives in registers."""
        if self.smem_operand_type(e) is None:
            return None
        if isinstance(e, ir.Attr):
            return self.field_view(e)[0]
        return f"{self.smem_operand(e.args[0])}.permute((1, 0))"

    def call(self, e: ir.Call, t: T, want) -> str:
        op = e.op
        if op in (ir.TileOp.PROGRAM_ID, ir.TileOp.NUM_PROGRAMS, ir.TileOp.CDIV):
            return f"{_GL_OPS[op]}({', '.join(self.tx(a)[0] for a in e.args)})"
        if op is ir.TileOp.REPLICA_ID:
            return "REPLICA"
        if op in (ir.TileOp.MAXIMUM, ir.TileOp.MINIMUM, ir.TileOp.EXP2, ir.TileOp.LOG2, ir.TileOp.WHERE):
            args = self.operands(e.args, want, [0] * len(e.args))
            helper = exp2.SHARES.get(self.exp2_share)
            if op is ir.TileOp.EXP2 and helper and exp2.applies(t):     # a share on the FMA pipe (exp2.py)
                self.exp2_used = True
                return f"{helper}({args[0]}, {t.layout})"
            return f"{_GL_OPS[op]}({', '.join(args)})"
        if op in ir.UNARY_MATH or op is ir.TileOp.POW:
            return self.math(e, t, want)
        if op is ir.TileOp.ARANGE:
            a, b = (int(self.cval(x, "xs.arange bounds", self.loc)) for x in e.args)
            return f"gl.arange({a}, {b}, layout={t.layout})"
        if op in (ir.TileOp.ZEROS, ir.TileOp.FULL):
            dims = "[" + ", ".join(map(str, t.shape)) + "]"
            v = "" if op is ir.TileOp.ZEROS else f"{self.tx(e.args[1])[0]}, "
            return f"gl.{op}({dims}, {v}{self.dtype(t.dtype)}, {t.layout})"
        if op in (ir.TileOp.MAX, ir.TileOp.SUM):
            axis = int(self.cval(e.args[1], "the reduction axis", self.loc))
            c, inner = self.tx(e.args[0])
            natural = T(ValueKind.TILE, t.shape, t.dtype, f"gl.SliceLayout({axis}, {inner.layout})")
            return self.view(f"gl.{op}({c}, {axis})", natural, t)
        if op is ir.TileOp.TRANS:
            return f"gl.convert_layout(gl.permute({self.tx(e.args[0])[0]}, (1, 0)), {t.layout})"
        if op is ir.TileOp.LOAD:
            return self.pointer_load(e, t)
        if op is ir.TileOp.LOAD_SCALAR:
            at = f"{self.names(e.args[0].id)} + {self.tx(e.args[1], None, PRECEDENCE['+'] + 1)[0]}"
            mask = e.kwarg("mask")       # a read ahead of its tile (prefetch.py): 0 past the loop
            return f"gl.load({at})" if mask is None else f"gl.load({at}, mask={self.tx(mask)[0]}, other=0)"
        if op is ir.TileOp.MMA:
            return self.mma(e, t)
        if op is ir.TileOp.MMA_WAIT:
            n = int(self.cval(e.kwarg("pending", ir.Const(0)), "mma_wait pending", self.loc))
            return f"warpgroup_mma_wait({n}, deps=[{self.tx(e.args[0])[0]}])"
        self.fail(f"xs.{op} has no Hopper lowering yet", loc=self.loc)

    def math(self, e: ir.Call, t: T, want) -> str:
        """Elementwise math: Gluon's own function where 3.6 and 3.9 both have one, the rest
        through gl.exp / gl.exp2 / gl.log2 (source.spell_math); float32 operands (Triton's math
        functions take no other), ``abs`` on the operand's own dtype."""
        x = self.tx(e.args[0], want)[0]
        if e.op is ir.TileOp.ABS:
            return f"gl.abs({x})"
        x = f"{x}.to(gl.float32)" if t.kind is ValueKind.SCALAR else f"({x}).to(gl.float32)"
        n = self.cval(e.args[1], "the exponent", self.loc) if e.op is ir.TileOp.POW else None
        if e.op is ir.TileOp.POW and int_power(n) is not None and t.kind is not ValueKind.SCALAR:
            base = self.fresh("base")          # the products repeat the operand: compute it once
            self.out.line(f"{base} = {x}")
            x = base
        return spell_math(e.op, x, "gl", _GL_MATH, n)

    def mma(self, e: ir.Call, t: T) -> str:
        a, b = e.args[0], e.args[1]
        m, n = t.shape
        acc_l = t.layout
        bview = self.smem_operand(b)
        reads = [bview]
        acode = self.smem_operand(a)
        if acode is not None:
            reads.insert(0, acode)
        else:
            acode = self.tx(a, self.dot_operand_layout(acc_l, self.type_of(a)))[0]
        if len(e.args) > 2 and not (isinstance(e.args[2], ir.Const) and e.args[2].value is None):
            ccode = self.tx(e.args[2], acc_l)[0]
        else:
            ccode = f"gl.zeros([{m}, {n}], gl.float32, {acc_l})"
        self.last_mma_reads = reads
        return f"warpgroup_mma({acode}, {bview}, {ccode}, is_async=True)"

    def pointer_load(self, e: ir.Call, t: T) -> str:
        tn, offs, lay = e.args[0].id, e.args[1].items, t.layout
        use = self.tensors[tn]
        if use.rank != 2 or len(t.shape) != 2:
            return self.nd_load(use, [self.tx(x)[0] for x in offs], t)
        r, c = self.fresh("rows"), self.fresh("cols")
        self.out.line(f"{r} = {self.tx(offs[0])[0]} + gl.arange(0, {t.shape[0]}, layout=gl.SliceLayout(1, {lay}))")
        self.out.line(f"{c} = {self.tx(offs[1])[0]} + gl.arange(0, {t.shape[1]}, layout=gl.SliceLayout(0, {lay}))")
        return (f"gl.load({self.names(tn)} + {r}[:, None].to(gl.int64) * {tn}_stride + {c}[None, :], "
                f"mask=({r}[:, None] < {tn}_rows) & ({c}[None, :] < {tn}_cols), other=0.0)")

    def nd_load(self, use, offs: list[str], t: T) -> str:
        """A masked load of a 1-D or 2-D tile over the last dimensions of a tensor of any rank;
        the leading offsets pick one index each (masked like the tile's own dimensions)."""
        sizes, strides = use.dims()
        addr, lead_masks = leading(use, offs, len(t.shape))
        c = self.fresh("cols")
        if len(t.shape) == 1:
            self.out.line(f"{c} = {offs[-1]} + gl.arange(0, {t.shape[0]}, layout={t.layout})")
            ptr, masks = f"{c}", [f"({c} < {sizes[-1]})"]
        else:
            r = self.fresh("rows")
            self.out.line(f"{r} = {offs[-2]} + gl.arange(0, {t.shape[0]}, layout=gl.SliceLayout(1, {t.layout}))")
            self.out.line(f"{c} = {offs[-1]} + gl.arange(0, {t.shape[1]}, layout=gl.SliceLayout(0, {t.layout}))")
            ptr = f"{r}[:, None].to(gl.int64) * {strides[-2]} + {c}[None, :]"
            masks = [f"({r}[:, None] < {sizes[-2]})", f"({c}[None, :] < {sizes[-1]})"]
        return (f"gl.load({self.names(use.name)}{addr} + {ptr}, mask={' & '.join(masks + lead_masks)}, "
                f"other=0.0)")
