"""How each tensor parameter reaches the Gluon kernel, decided before spelling: the TMA load
descriptors its pipe fills need (one per block shape), a plain pointer (masked ``gl.load`` /
``gl.store``), an int32 table (``xs.load_scalar``); and which tensors the kernel reads at all
(a tensor it reads takes no TMA stores: :mod:`xsync.backends.nvidia.staging`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from xsync.dtypes import DType
from xsync.backends.nvidia.alloc import is_tma_pipe
from xsync.errors import BackendError
from xsync.lowering import ir
from xsync.lowering.placement import Placement
from xsync.lowering.protocol import NotConstant, evaluate
from xsync.lowering.tile_launch import tensor_ranks


@dataclass
class TensorUse:
    """How one tensor parameter reaches the device."""

    name: str
    dtype: DType
    descs: dict = field(default_factory=dict)   # (rows, cols) -> descriptor parameter name
    pointer: bool = False                       # masked 2-D gl.load/gl.store through a pointer
    table: bool = False                         # 1-D int32 table read with xs.load_scalar
    rank: int = 2                               # the rank xs.load / xs.store address it with

    def dims(self) -> tuple[list[str], list[str]]:
        """The kernel's names of the tensor's sizes and strides, one per dimension (the last
        stride is 1: the launcher checks it). A 2-D tensor keeps its ``_rows``/``_cols``/``_stride``."""
        n = self.name
        if self.rank == 2:
            return [f"{n}_rows", f"{n}_cols"], [f"{n}_stride", "1"]
        return ([f"{n}_size{i}" for i in range(self.rank)],
                [f"{n}_stride{i}" for i in range(self.rank - 1)] + ["1"])


def leading(use: TensorUse, offsets: list[str], tile_rank: int, bounds: list[str] = ()) -> tuple[str, list[str]]:
    """The address term and masks of the leading offsets (those before the tile's dimensions:
    each picks one index): `` + <offset> * <stride>`` in int64, ``<offset> < <size>`` (and
    ``< <bound>``). Empty for a tile over all of the tensor's dimensions."""
    sizes, strides = use.dims()
    lead = len(offsets) - tile_rank
    addr = "".join(f" + gl.to_tensor({o}).to(gl.int64) * {strides[i]}" for i, o in enumerate(offsets[:lead]))
    masks = [f"({o} < {sizes[i]})" for i, o in enumerate(offsets[:lead])]
    masks += [f"({o} < {b})" for o, b in zip(offsets[:lead], list(bounds)[:lead])]
    return addr, masks


@dataclass(frozen=True)
class TensorUses:
    uses: dict[str, TensorUse]       # tensor parameter -> its use, in parameter order
    read: frozenset[str]             # tensors some xs.load reads


def _shape(kernel: ir.KernelIR, e, consts: dict, loc) -> tuple:
    items = e.items if isinstance(e, ir.TupleExpr) else (e,)
    out = []
    for x in items:
        try:
            out.append(int(evaluate(x, consts)))
        except (NotConstant, TypeError):
            raise BackendError("a tile shape must be a compile-time constant", loc=loc or kernel.loc,
                               objects=(), fix="use literals and constexpr parameters") from None
    return tuple(out)


def _fail(kernel, what, loc, objects, fix):
    raise BackendError(what, loc=loc or kernel.loc, objects=tuple(objects), fix=fix)


def collect(kernel: ir.KernelIR, placement: Placement, consts: dict,
            bodies: Mapping[str, tuple]) -> TensorUses:
    """The uses of every tensor parameter in the agent programs ``bodies`` (agent -> statements)."""
    tensors: dict[str, TensorUse] = {}
    read: set[str] = set()
    ranks = tensor_ranks(kernel)
    for p in kernel.params:
        if p.kind is ir.ParamKind.TENSOR:
            tensors[p.name] = TensorUse(p.name, p.dtype, rank=ranks.get(p.name, 2))
    tma_pipes = {p.name for p in kernel.pipes if placement.crosses(p) and is_tma_pipe(kernel, p)}
    tma_loads = set()
    live = tuple(x for a in placement.agents for x in bodies[a.name])
    for s in ir.walk(live):
        if isinstance(s, ir.SlotWrite) and s.pipe in tma_pipes:
            call = s.value
            t = call.args[0].id
            shape = _shape(kernel, call.args[2], consts, s.loc)
            spec = kernel.sync_object(s.pipe).field(s.field)
            if tuple(spec.shape) != shape:
                _fail(kernel, f"xs.load of {list(shape)} into field '{s.field}' {list(spec.shape)} of pipe "
                      f"'{s.pipe}'", s.loc, (s.pipe,), "load the field's shape")
            use = tensors[t]
            if spec.dtype != use.dtype:
                _fail(kernel, f"TMA copy of `{t}` ({use.dtype.name}) into field '{s.field}' "
                      f"({spec.dtype.name}) of pipe '{s.pipe}'", s.loc, (s.pipe,),
                      "declare the field with the tensor's dtype (a.dtype)")
            use.descs.setdefault(shape, None)
            tma_loads.add(id(call))
    for s in ir.walk(live):
        exprs = []
        if isinstance(s, ir.Store):
            tensors[s.tensor].pointer = True
            exprs = [s.value, *s.offsets, *(s.bounds or ())]
        elif isinstance(s, (ir.Assign, ir.SlotWrite)):
            exprs = [s.value]
        elif isinstance(s, ir.For):
            exprs = [s.start, s.stop, s.step]
        elif isinstance(s, ir.If):
            exprs = [s.cond]
        for e in exprs:
            for c in ir.expr_calls(e):
                if c.op is ir.TileOp.LOAD:
                    read.add(c.args[0].id)
                if c.op is ir.TileOp.LOAD and id(c) not in tma_loads:
                    tensors[c.args[0].id].pointer = True
                elif c.op is ir.TileOp.LOAD_SCALAR:
                    tensors[c.args[0].id].table = True
    for use in tensors.values():
        many = len(use.descs) > 1
        for shape in list(use.descs):
            use.descs[shape] = f"{use.name}_desc" + (f"_{shape[0]}x{shape[1]}" if many else "")
    return TensorUses(tensors, frozenset(read))
