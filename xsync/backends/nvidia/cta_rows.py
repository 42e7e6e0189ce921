"""Rule 5 of the CTA split (:mod:`xsync.backends.nvidia.cluster_ctas`): every tile of a cluster's
program is made of its programs' rows, so the rewrite -- each such tile n times taller, spread over
the CTAs by rows -- gives every CTA exactly the rows its program had, and the cluster's program
computes, row by row, what its programs computed.

A forward walk over each agent's statements gives every value a kind:

    SCALAR   the same in every program of the cluster: constants, run-time scalars, loop
             counters, ids, ``xs.load_scalar``
    ROWS     a tile whose first axis is the program's rows: a field of a split pipe, ``xs.zeros``
             / ``xs.full`` of B rows (B: the rank's row step), and what is made of them row by row

Row by row means: elementwise math of ROWS tiles of one rank and scalars; ``x[:, None]`` of a row
vector (a ROWS 1-D tile); a reduction along axis 1 (``xs.max`` / ``xs.sum(x, 1)``: each row its
own); a wgmma whose A is ROWS and whose B is a multicast field or its ``xs.trans`` (the one place
a multicast field is read). Anything else that meets the rows mixes them across programs -- a
transpose, a reduction along axis 0, an index range, ``x[None, :]``, a 1-D tile broadcast along a
2-D one's columns, a register load, a multicast field read as a value -- and the split is refused
(the programs stay independent: the allocation table names the line).

A loop's body is walked twice: the second trip starts with the kinds the first one left.
"""
from __future__ import annotations

from enum import Enum

from xsync.lowering import ir
from xsync.lowering.protocol import evaluated

SAME_OPS = (ir.TileOp.LOAD_SCALAR, ir.TileOp.CDIV, ir.TileOp.PROGRAM_ID, ir.TileOp.NUM_PROGRAMS,
            ir.TileOp.REPLICA_ID, ir.TileOp.CLUSTER_RANK, ir.TileOp.CLUSTER_ID, ir.TileOp.NUM_CLUSTERS)
ELEMENTWISE_OPS = (ir.TileOp.EXP2, ir.TileOp.LOG2, ir.TileOp.WHERE, ir.TileOp.MAXIMUM,
                   ir.TileOp.MINIMUM, ir.TileOp.ABS) + ir.FLOAT_MATH


class Kind(Enum):
    SCALAR = "the same in every program"
    ROWS = "the program's rows"


class Refused(Exception):
    """Rule 5 does not hold; the message is the allocation table's reason."""


def check(kernel: ir.KernelIR, multicast: frozenset, blocks: set, consts) -> str:
    """Rule 5 for ``kernel`` ("" when it holds). ``multicast``: (pipe, field) broadcast to every
    CTA; ``blocks``: the row steps B of the rank's offsets."""
    walk = _Walk(kernel, multicast, blocks, consts)
    try:
        for body in (kernel.body,) + tuple(p.body for p in kernel.programs):
            walk.env, walk.slots = {}, {}
            walk.block(body)
    except Refused as why:
        return f"rule 5: line {walk.line}: {why}"
    return ""


class _Walk:
    def __init__(self, kernel, multicast, blocks, consts):
        self.kernel, self.multicast, self.blocks, self.consts = kernel, multicast, blocks, consts
        self.env: dict[str, tuple[Kind, int]] = {}     # name -> (kind, rank of the tile)
        self.slots: dict[str, str] = {}                # slot variable -> its pipe
        self.line = 0

    # statements -------------------------------------------------------------
    def block(self, stmts):
        for s in stmts:
            self.stmt(s)

    def stmt(self, s):
        self.line = s.loc.line
        if isinstance(s, ir.Assign):
            tuple_value = len(s.targets) > 1 and isinstance(s.value, ir.TupleExpr)
            for t, v in zip(s.targets, s.value.items if tuple_value else (s.value,) * len(s.targets)):
                if isinstance(v, ir.Name) and v.id in self.slots:        # a slot renamed
                    self.slots[t] = self.slots[v.id]
                else:
                    self.env[t] = self.expr(v)
        elif isinstance(s, ir.SyncOp):
            if s.target is not None and s.verb in (ir.Verb.ACQUIRE, ir.Verb.WAIT):
                self.slots[s.target] = s.obj
        elif isinstance(s, ir.SlotWrite):
            if isinstance(s.value, ir.Call) and s.value.op is ir.TileOp.LOAD:
                return                                  # rules 2 and 4 own the loads
            if (s.pipe, s.field) in self.multicast:
                raise Refused(f"the multicast field '{s.pipe}.{s.field}' is written from registers")
            self.need_rows(s.value, f"the value written to '{s.pipe}.{s.field}'")
        elif isinstance(s, ir.Store):
            self.need_rows(s.value, f"the value stored to '{s.tensor}'")
        elif isinstance(s, ir.MmaWait):
            pass                                        # its targets keep their kinds
        elif isinstance(s, ir.For):
            for bound in (s.start, s.stop, s.step):
                self.need_same(bound, "a loop bound")
            self.env[s.var] = (Kind.SCALAR, 0)
            self.block(s.body)
            self.block(s.body)
        elif isinstance(s, ir.If):
            known = evaluated(s.cond, self.consts)
            if known is not None:                       # a constexpr picks the arm that renders
                self.block(s.body if known else s.orelse)
                return
            self.need_same(s.cond, "a branch condition")
            self.block(s.body)
            self.block(s.orelse)
        elif isinstance(s, ir.RoleBlock):
            self.block(s.body)

    def need_rows(self, e, what):
        kind, _ = self.expr(e)
        if kind is not Kind.ROWS:
            raise Refused(f"{what} is {kind.value}, not a tile of the program's rows")

    def need_same(self, e, what):
        kind, _ = self.expr(e)
        if kind is not Kind.SCALAR:
            raise Refused(f"{what} reads a tile of the program's rows")

    # expressions ------------------------------------------------------------
    def field(self, e):
        """(pipe, field) of a slot field read ``slot.field``, or None."""
        if isinstance(e, ir.Attr) and isinstance(e.value, ir.Name) and e.value.id in self.slots:
            return self.slots[e.value.id], e.attr
        return None

    def expr(self, e) -> tuple[Kind, int]:
        if isinstance(e, ir.Const):
            return Kind.SCALAR, 0
        if isinstance(e, ir.Name):
            return self.env.get(e.id, (Kind.SCALAR, 0))
        if isinstance(e, ir.Attr):
            f = self.field(e)
            if f is None:
                return self.expr(e.value)
            if f in self.multicast:
                raise Refused(f"the multicast field '{f[0]}.{f[1]}' is read other than as a wgmma's B operand")
            spec = next(t for t in self.kernel.sync_object(f[0]).fields if t.name == f[1])
            return Kind.ROWS, len(spec.shape)
        if isinstance(e, ir.Subscript):
            kind, rank = self.expr(e.value)
            if kind is Kind.ROWS and (not e.index or e.index[0] != ":"):
                raise Refused("`x[None, ...]` turns the program's rows into columns")
            return kind, (len(e.index) if kind is Kind.ROWS else 0)
        if isinstance(e, ir.Call):
            return self.call(e)
        if isinstance(e, ir.TupleExpr):
            return self.combine(e.items)
        if isinstance(e, ir.Cast):
            return self.expr(e.value)
        if isinstance(e, (ir.BinOp, ir.Compare)):
            return self.combine((e.left, e.right))
        if isinstance(e, ir.UnaryOp):
            return self.expr(e.operand)
        if isinstance(e, ir.BoolOp):
            return self.combine(e.values)
        raise Refused(f"{type(e).__name__} is not known to keep rows apart")

    def combine(self, parts) -> tuple[Kind, int]:
        """Elementwise: rows stay rows when every tile among ``parts`` has the same rank."""
        ranks = {rank for kind, rank in (self.expr(p) for p in parts) if kind is Kind.ROWS}
        if not ranks:
            return Kind.SCALAR, 0
        if len(ranks) > 1:
            raise Refused("a row vector meets a 2-D tile without `[:, None]`: it would run along the columns")
        return Kind.ROWS, ranks.pop()

    def call(self, e: ir.Call) -> tuple[Kind, int]:
        op = e.op
        if op in SAME_OPS:
            return Kind.SCALAR, 0
        if op in (ir.TileOp.ZEROS, ir.TileOp.FULL):
            shape = e.args[0].items if isinstance(e.args[0], ir.TupleExpr) else (e.args[0],)
            rows = evaluated(shape[0], self.consts)
            if rows not in self.blocks:
                raise Refused(f"xs.{op} of {rows} row(s): a tile of the cluster's program starts with the "
                              f"program's {' or '.join(str(b) for b in sorted(self.blocks))} rows")
            return Kind.ROWS, len(shape)
        if op is ir.TileOp.MMA:
            if self.expr(e.args[0])[0] is not Kind.ROWS:
                raise Refused("the wgmma's A operand is not a tile of the program's rows")
            b = e.args[1]
            inner = b.args[0] if isinstance(b, ir.Call) and b.op is ir.TileOp.TRANS else b
            if self.field(inner) not in self.multicast:
                raise Refused("the wgmma's B operand is not a multicast field (or its xs.trans)")
            for acc in e.args[2:]:
                if self.expr(acc)[0] is not Kind.ROWS:
                    raise Refused("the wgmma's accumulator is not a tile of the program's rows")
            return Kind.ROWS, 2
        if op is ir.TileOp.MMA_WAIT:                    # the product it waits for
            return self.expr(e.args[0])
        if op in (ir.TileOp.MAX, ir.TileOp.SUM):
            kind, rank = self.expr(e.args[0])
            axis = evaluated(e.args[1], self.consts) if len(e.args) > 1 else None
            if kind is Kind.ROWS and not (rank == 2 and axis == 1):
                raise Refused(f"xs.{op} along axis {axis} mixes the program's rows")
            return kind, (1 if kind is Kind.ROWS else 0)
        if op in ELEMENTWISE_OPS:
            return self.combine(e.args)
        if op is ir.TileOp.TRANS:
            raise Refused("xs.trans of a tile turns the program's rows into columns")
        if op is ir.TileOp.ARANGE:
            raise Refused("xs.arange makes an index range the CTAs would each need their own of")
        if op is ir.TileOp.LOAD:
            raise Refused("xs.load into registers")
        raise Refused(f"xs.{op} is not known to keep rows apart")
