"""Tile shapes and integer uses, checked on the parsed kernel before any backend sees it.

The frontend builds the IR; this walk gives every value a shape (a scalar is ``()``, a tile a
tuple of dimensions, ``None`` for a dimension or a rank not known at compile time) and rejects,
with the statement's line, what a backend or the emulator would otherwise meet as a shape error
of its own: tile shapes that are not positive integers of a sane size, ``xs.mma`` operands that
do not chain (``[M, K] @ [K, N] + [M, N]``), operands that do not broadcast, a slot field
written with a tile of another shape than its pipe declares, reductions and transposes of the
wrong rank. So the emulator never meets a shape error that ``check`` passed.

It also finds the run-time scalar parameters the kernel uses as integers (loop bounds, tile
offsets, bounds, indices): ``int_params`` (the launch checks that the caller passed ints).
"""
from __future__ import annotations

from xsync.errors import KernelSourceError
from xsync.lowering import ir
from xsync.lowering.protocol import NotConstant, evaluate

MAX_TILE_ELEMENTS = 1 << 22     # 16 MiB of fp32: far beyond what any core holds in one tile
MAX_DIM = 1 << 20
MAX_RANK = 4                    # xs.load / xs.store address tensors of 1 to 4 dimensions
UNKNOWN = None                  # a value whose rank is not known (a tensor parameter, a list)
SCALAR = ()
_BROADCASTING = (ir.TileOp.WHERE, ir.TileOp.MAXIMUM, ir.TileOp.MINIMUM)
_SAME_SHAPE = (ir.TileOp.EXP2, ir.TileOp.LOG2, ir.TileOp.POW) + ir.UNARY_MATH
_SCALARS = (ir.TileOp.PROGRAM_ID, ir.TileOp.NUM_PROGRAMS, ir.TileOp.REPLICA_ID, ir.TileOp.CDIV,
            ir.TileOp.LOAD_SCALAR)


def shown(shape) -> str:
    return "a scalar" if shape == SCALAR else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def tile_dims(values, what: str, loc, fix: str = "") -> tuple[int, ...]:
    """Validate a tile shape written as constants: positive ints, not too large."""
    fix = fix or "tile dimensions are positive integers (literals or int constexprs), e.g. [64, 64]"
    if not isinstance(values, (list, tuple)) or not values:
        raise KernelSourceError(f"{what} is {values!r}, not a list of dimensions", loc=loc, fix=fix)
    for d in values:
        if isinstance(d, bool) or not isinstance(d, int):
            raise KernelSourceError(f"{what} {list(values)!r} has dimension {d!r}, not an integer",
                                    loc=loc, fix=fix)
        if d <= 0:
            raise KernelSourceError(f"{what} {list(values)!r} has dimension {d}, not positive",
                                    loc=loc, fix=fix)
        if d > MAX_DIM:
            raise KernelSourceError(f"{what} {list(values)!r} has dimension {d}, more than {MAX_DIM}",
                                    loc=loc, fix="a tile is what one core holds: split the work "
                                                 "into tiles of at most a few thousand elements a side")
    elements = 1
    for d in values:
        elements *= d
    if elements > MAX_TILE_ELEMENTS:
        raise KernelSourceError(f"{what} {list(values)!r} has {elements} elements, more than "
                                f"{MAX_TILE_ELEMENTS}", loc=loc,
                                fix="a tile is what one core holds: loop over smaller tiles")
    return tuple(values)


class ShapeCheck:
    """One walk over the kernel's body (see the module docstring)."""

    def __init__(self, kernel: ir.KernelIR):
        self.kernel = kernel
        self.consts = kernel.constexpr_values
        self.env: dict[str, tuple | None] = {}
        self.slots: dict[str, ir.Pipe] = {}
        self.loc = kernel.loc
        self.scalar_params = {p.name for p in kernel.params if p.kind is ir.ParamKind.SCALAR}
        self.tensors = {p.name for p in kernel.params if p.kind is ir.ParamKind.TENSOR}
        self.deps: dict[str, set[str]] = {p: {p} for p in self.scalar_params}
        self.int_uses: dict[str, int] = {}      # scalar parameter -> first line using it as an int
        self.ranks: dict[str, tuple[int, int]] = {}     # tensor -> (rank, first line addressing it)

    def fail(self, what, fix, objects=()):
        raise KernelSourceError(what, loc=self.loc, objects=tuple(objects), fix=fix)

    def run(self):
        for name in self.consts:
            self.env[name] = SCALAR
        for p in self.kernel.params:
            self.env[p.name] = UNKNOWN if p.kind is ir.ParamKind.TENSOR else SCALAR
        self.block(self.kernel.body)
        return self

    # ------------------------------------------------------------ integer uses
    def need_int(self, e, what: str):
        """``e`` is used as an integer (a loop bound, an offset): a constant must be one; the
        run-time scalars it reads must be passed as ints (checked at launch)."""
        try:
            value = evaluate(e, self.consts)
        except NotConstant:
            value = None
        except ZeroDivisionError:
            self.fail(f"{what} divides by zero", "check the constexpr values it is computed from")
        except (OverflowError, TypeError, ValueError) as exc:
            self.fail(f"{what} cannot be computed: {exc}", "compute it from integers")
        if value is not None and (isinstance(value, float) or not isinstance(value, int)):
            self.fail(f"{what} is {value!r}, not an integer",
                      "use an integer (int(...) of a constexpr, or `//` instead of `/`)")
        for n in ir.expr_names(e):
            for p in self.deps.get(n, ()):
                self.int_uses.setdefault(p, self.loc.line)
        return value

    # ------------------------------------------------------------ statements
    def block(self, stmts):
        for s in stmts:
            self.loc = getattr(s, "loc", self.loc)
            self.stmt(s)

    def assign_names(self, names, value):
        deps = set().union(*(self.deps.get(n, set()) for n in ir.expr_names(value)))
        shapes = [self.shape(value)] if len(names) == 1 else [
            self.shape(v) for v in value.items] if isinstance(value, ir.TupleExpr) else [UNKNOWN] * len(names)
        for n, shape in zip(names, shapes):
            self.env[n] = shape
            if deps:
                self.deps[n] = self.deps.get(n, set()) | deps

    def stmt(self, s):
        if isinstance(s, ir.Assign):
            self.assign_names(s.targets, s.value)
        elif isinstance(s, ir.SlotWrite):
            self.slot_write(s)
        elif isinstance(s, ir.Store):
            self.store(s)
        elif isinstance(s, ir.SyncOp):
            obj = self.kernel.sync_object(s.obj)
            if s.target and isinstance(obj, ir.Pipe):
                self.slots[s.target] = obj
        elif isinstance(s, ir.For):
            self.loop(s)
        elif isinstance(s, ir.If):
            self.shape(s.cond)
            before = dict(self.env)
            self.block(s.body)
            after_body, self.env = self.env, dict(before)
            self.block(s.orelse)
            for n in set(after_body) | set(self.env):   # a branch-dependent shape is unknown
                if after_body.get(n, UNKNOWN) != self.env.get(n, UNKNOWN):
                    self.env[n] = UNKNOWN
        elif isinstance(s, ir.RoleBlock):
            self.block(s.body)

    def loop(self, s: ir.For):
        if not s.tile_loop:
            self.need_int(s.start, f"the start of loop `{s.var}`")
            self.need_int(s.stop, f"the stop of loop `{s.var}`")
            step = self.need_int(s.step, f"the step of loop `{s.var}`")
            if step == 0:
                self.fail(f"loop `{s.var}` has step 0 (it would never end)",
                          "use a step of 1 or more (or a negative step to count down)")
        else:
            self.need_int(s.stop, f"the tile count of `{s.var}`")
        self.env[s.var] = SCALAR
        self.deps[s.var] = set().union(*(self.deps.get(n, set()) for e in (s.start, s.stop, s.step)
                                         for n in ir.expr_names(e)))
        self.block(s.body)
        self.loc = s.loc

    def slot_write(self, s: ir.SlotWrite):
        spec = self.kernel.sync_object(s.pipe).field(s.field)
        got = self.shape(s.value)
        if got is UNKNOWN or spec is None:
            return
        if len(got) != len(spec.shape) or any(g is not None and g != d for g, d in zip(got, spec.shape)):
            self.fail(f"slot field '{s.field}' of pipe '{s.pipe}' is declared {shown(spec.shape)} but "
                      f"written with {shown(got)}",
                      f"write a {shown(spec.shape)} tile, or declare the field as "
                      f"xs.tile({shown(got)}, ...)", objects=(s.pipe,))

    def store(self, s: ir.Store):
        rank = self.tensor_rank(s.tensor, len(s.offsets), "xs.store")
        for i, o in enumerate(s.offsets):
            self.need_int(o, f"offset {i} of xs.store into `{s.tensor}`")
        for i, b in enumerate(s.bounds or ()):
            self.need_int(b, f"bound {i} of xs.store into `{s.tensor}`")
        got = self.shape(s.value)
        if got is not UNKNOWN and not 1 <= len(got) <= min(2, rank):
            self.fail(f"xs.store into `{s.tensor}` ({rank} offset(s)) writes {shown(got)}; it stores a "
                      f"1-D or 2-D tile into the tensor's last {min(2, rank)} dimension(s)",
                      "store a [rows, cols] tile or a 1-D one (x[:, None] makes a column of a 1-D "
                      "tile); each leading offset picks one index of its dimension",
                      objects=(s.tensor,))
        if got is not UNKNOWN:      # the frontend's own node, before any other reader sees it
            object.__setattr__(s, "value_rank", len(got))

    def tensor_rank(self, tensor: str, rank: int, what: str) -> int:
        """The rank ``tensor`` is addressed with (its offsets' count): 1 to MAX_RANK, and one rank
        per tensor across the kernel."""
        if not 1 <= rank <= MAX_RANK:
            self.fail(f"{what} of `{tensor}` has {rank} offset(s); tensors of 1 to {MAX_RANK} "
                      f"dimensions are addressed with one offset per dimension",
                      "pass [col] for a 1-D tensor, [row, col] for a 2-D one, [b, h, row, col] for a "
                      "4-D one", objects=(tensor,))
        first = self.ranks.setdefault(tensor, (rank, self.loc.line))
        if first[0] != rank:
            self.fail(f"{what} addresses `{tensor}` with {rank} offset(s), but line {first[1]} "
                      f"addresses it with {first[0]}", f"a tensor has one rank: give every xs.load / "
                      f"xs.store of `{tensor}` one offset per dimension ({first[0]})", objects=(tensor,))
        return rank

    # ------------------------------------------------------------ expressions
    def broadcast(self, shapes, what):
        known = [s for s in shapes if s is not UNKNOWN]
        if len(known) != len(shapes):
            return UNKNOWN
        rank = max(len(s) for s in known)
        out = []
        for i in range(rank):
            dims = {s[len(s) - rank + i] for s in known if len(s) - rank + i >= 0}
            sizes = {d for d in dims if d is not None and d != 1}
            if len(sizes) > 1:
                self.fail(f"{what}: shapes {', '.join(shown(s) for s in shapes)} do not broadcast",
                          "operands need equal dimensions (or 1, or x[:, None] / x[None, :] to "
                          "add one) along every axis")
            out.append(sizes.pop() if sizes else (None if None in dims else 1))
        return tuple(out)

    def const_dims(self, e, what):
        try:
            values = evaluate(e, self.consts) if not isinstance(e, ir.TupleExpr) else [
                evaluate(i, self.consts) for i in e.items]
        except NotConstant:
            items = e.items if isinstance(e, ir.TupleExpr) else ()
            return tuple(self.dim(i) for i in items) if items else UNKNOWN
        except ZeroDivisionError:
            self.fail(f"{what} divides by zero", "check the constexpr values it is computed from")
        except (OverflowError, TypeError, ValueError) as exc:
            self.fail(f"{what} cannot be computed: {exc}", "compute dimensions from integers")
        return tile_dims(values, what, self.loc)

    def dim(self, e):
        try:
            return tile_dims([evaluate(e, self.consts)], "a tile dimension", self.loc)[0]
        except NotConstant:
            return None

    def shape(self, e):
        if isinstance(e, ir.Const):
            return SCALAR
        if isinstance(e, ir.Name):
            return self.env.get(e.id, UNKNOWN)
        if isinstance(e, (ir.BinOp, ir.Compare)):
            return self.broadcast([self.shape(e.left), self.shape(e.right)],
                                  f"`{e.op}` of two values")
        if isinstance(e, ir.BoolOp):
            return self.broadcast([self.shape(v) for v in e.values], f"`{e.op}`")
        if isinstance(e, (ir.UnaryOp,)):
            return self.shape(e.operand)
        if isinstance(e, ir.Cast):
            return self.shape(e.value)
        if isinstance(e, ir.Attr):
            pipe = self.slots.get(e.value.id) if isinstance(e.value, ir.Name) else None
            spec = pipe.field(e.attr) if pipe is not None else None
            return spec.shape if spec is not None else UNKNOWN
        if isinstance(e, ir.Subscript):
            return self.subscript(e)
        if isinstance(e, ir.Call):
            return self.call(e)
        for c in ir.children(e):
            self.shape(c)
        return UNKNOWN

    def subscript(self, e: ir.Subscript):
        inner = self.shape(e.value)
        kept = sum(1 for i in e.index if i is not None)
        if inner is UNKNOWN:
            return UNKNOWN
        if kept != len(inner):
            self.fail(f"`[{', '.join('None' if i is None else ':' for i in e.index)}]` indexes "
                      f"{kept} axis/axes of a {shown(inner)} value",
                      "write one `:` per axis of the value and `None` where a new axis goes")
        it = iter(inner)
        return tuple(1 if i is None else next(it) for i in e.index)

    def call(self, e: ir.Call):
        op, args = e.op, e.args
        if op in _SCALARS:
            for a in args:
                self.shape(a)
            if op is ir.TileOp.LOAD_SCALAR:
                self.need_int(args[1], "the index of xs.load_scalar")
            return SCALAR
        if op is ir.TileOp.ARANGE:
            lo = self.need_int(args[0], "the start of xs.arange")
            hi = self.need_int(args[1], "the end of xs.arange")
            if lo is None or hi is None:
                return (None,)
            return tile_dims([hi - lo], f"xs.arange({lo}, {hi})'s length", self.loc)
        if op in (ir.TileOp.ZEROS, ir.TileOp.FULL):
            return self.const_dims(args[0], f"the shape of xs.{op}")
        if op is ir.TileOp.LOAD:
            return self.load(args)
        if op is ir.TileOp.MMA:
            return self.mma(e)
        if op is ir.TileOp.MMA_WAIT:
            return self.shape(args[0])
        if op is ir.TileOp.TRANS:
            x = self.shape(args[0])
            if x is not UNKNOWN and len(x) != 2:
                self.fail(f"xs.trans of {shown(x)}; it transposes a 2-D tile", "transpose [rows, cols] tiles")
            return UNKNOWN if x is UNKNOWN else (x[1], x[0])
        if op in (ir.TileOp.MAX, ir.TileOp.SUM):
            return self.reduce(e)
        if op in _SAME_SHAPE:
            return self.shape(args[0])
        if op in _BROADCASTING:
            return self.broadcast([self.shape(a) for a in args], f"xs.{op}")
        return UNKNOWN

    def load(self, args):
        """``xs.load(t, offsets, shape)``: one offset per dimension of ``t``; ``shape`` is the
        tile, 1-D or 2-D, over the tensor's last len(shape) dimensions (each leading offset
        picks one index: the tile drops that dimension)."""
        if not isinstance(args[1], ir.TupleExpr):
            self.fail("xs.load offsets must be a list, one offset per tensor dimension",
                      "pass [row, col] for a 2-D tensor ([b, h, row, col] for a 4-D one)")
        tensor = args[0].id if isinstance(args[0], ir.Name) else "?"
        rank = self.tensor_rank(tensor, len(args[1].items), "xs.load")
        for i, o in enumerate(args[1].items):
            self.need_int(o, f"offset {i} of xs.load")
        dims = self.const_dims(args[2], "the shape of xs.load")
        if dims is not UNKNOWN and len(dims) > 2:
            self.fail(f"xs.load of `{tensor}` reads a {shown(dims)} tile; tiles are 1-D or 2-D",
                      f"give the tile's own dimensions only: xs.load({tensor}, [b, h, row, col], "
                      f"[BM, D]) reads {tensor}[b, h, row:row+BM, col:col+D] (each leading offset "
                      f"picks one index)", objects=(tensor,))
        if dims is not UNKNOWN and len(dims) > rank:
            self.fail(f"xs.load of `{tensor}` reads a {shown(dims)} tile with {rank} offset(s)",
                      f"pass one offset per dimension of `{tensor}` (a {len(dims)}-D tile needs at "
                      f"least {len(dims)}), or load a {rank}-D tile", objects=(tensor,))
        return dims

    def reduce(self, e: ir.Call):
        x = self.shape(e.args[0])
        axis = self.need_int(e.args[1], f"the axis of xs.{e.op}")
        if axis is None:
            self.fail(f"the axis of xs.{e.op} must be a compile-time integer", "use 0 or 1")
        if x is UNKNOWN:
            return UNKNOWN
        if not 0 <= axis < len(x):
            self.fail(f"xs.{e.op} over axis {axis} of a {shown(x)} value",
                      f"axis is 0..{len(x) - 1}" if x else "reduce a tile, not a scalar")
        return x[:axis] + x[axis + 1:]

    def mma(self, e: ir.Call):
        a, b = self.shape(e.args[0]), self.shape(e.args[1])
        acc = self.shape(e.args[2]) if len(e.args) > 2 else UNKNOWN
        for name, s in (("A", a), ("B", b), ("accumulator", acc)):
            if s is not UNKNOWN and len(s) != 2:
                self.fail(f"xs.mma's {name} operand is {shown(s)}; mma multiplies 2-D tiles",
                          "pass [M, K] @ [K, N] with a [M, N] accumulator")
        if a is UNKNOWN or b is UNKNOWN:
            return acc

        def differ(x, y):
            return x is not None and y is not None and x != y
        if differ(a[1], b[0]):
            self.fail(f"xs.mma of {shown(a)} @ {shown(b)}: the inner dimensions differ "
                      f"({a[1]} vs {b[0]})", "A is [M, K] and B is [K, N] (xs.trans(b) "
                      "transposes a [N, K] tile)")
        out = (a[0], b[1])
        if acc is not UNKNOWN and (differ(acc[0], out[0]) or differ(acc[1], out[1])):
            self.fail(f"xs.mma of {shown(a)} @ {shown(b)} gives {shown(out)}, but the accumulator "
                      f"is {shown(acc)}", "the accumulator is [M, N]: xs.zeros([M, N], xs.float32)")
        return out


def check(kernel: ir.KernelIR) -> dict[str, int]:
    """Check every tile shape of ``kernel`` (raises KernelSourceError); returns the run-time
    scalar parameters it uses as integers, each with the first line that does."""
    return ShapeCheck(kernel).run().int_uses


def written_tiles(kernel: ir.KernelIR):
    """(shape, what, loc) of every tile shape the kernel writes as constants: pipe fields,
    xs.load / xs.zeros / xs.full shapes and xs.arange lengths (backends that need powers of
    two check them)."""
    consts = kernel.constexpr_values
    for p in kernel.pipes:
        for f in p.fields:
            yield f.shape, f"field '{f.name}' of pipe '{p.name}'", p.loc
    for s in ir.walk(kernel.all_statements()):
        exprs = [getattr(s, a) for a in ("value", "cond", "start", "stop", "step") if hasattr(s, a)]
        exprs += list(getattr(s, "offsets", ()) or ())
        for e in exprs:
            if not isinstance(e, (ir.Const, ir.Name, ir.BinOp, ir.Compare, ir.BoolOp, ir.UnaryOp,
                                  ir.Call, ir.Attr, ir.Cast, ir.Subscript, ir.TupleExpr)):
                continue
            for c in ir.expr_calls(e):
                shape = _const_shape(c, consts)
                if shape is not None:
                    yield shape, f"xs.{c.op}", s.loc


def _const_shape(c: ir.Call, consts):
    try:
        if c.op is ir.TileOp.ARANGE:
            return (evaluate(c.args[1], consts) - evaluate(c.args[0], consts),)
        shape = {ir.TileOp.LOAD: 2, ir.TileOp.ZEROS: 0, ir.TileOp.FULL: 0}.get(c.op)
        if shape is None or not isinstance(c.args[shape], ir.TupleExpr):
            return None
        return tuple(evaluate(i, consts) for i in c.args[shape].items)
    except (NotConstant, ZeroDivisionError, TypeError, ValueError, OverflowError):
        return None
