"""Clusters (``xs.cluster(n)``): the frontend's rules, and the spelling of a cluster kernel's
program numbering in the vocabulary every backend already renders.

A cluster is ``n`` consecutive programs of axis 0. ``xs.cluster_id()`` is ``program_id(0) // n``,
``xs.cluster_rank()`` is ``program_id(0) % n`` and ``xs.num_clusters()`` is ``num_programs(0) //
n``; ``xs.tile_range`` deals its tiles to clusters (``range(cluster_id, total, num_clusters)``),
so every program of a cluster walks the same tiles. A pipe field declared ``xs.tile(...,
multicast=True)`` holds the same tile in every program of the cluster.

Rules (each a :class:`~xsync.errors.KernelSourceError` at the user's line):

1. ``xs.cluster(n)`` is a statement of the kernel's top level, once, before the first role; ``n``
   is 1, 2, 4 or 8 (a literal or a constexpr).
2. A multicast field belongs to a pipe whose producer is a copy role, and it is written only as
   ``slot.f = xs.load(tensor, offsets, shape)``: the copy engine delivers a load to several
   programs, not a computed value.
3. The offsets of that load do not depend on the program inside the cluster: no
   ``xs.cluster_rank()``, ``xs.program_id(0)`` or ``xs.replica_id()``, and no name computed
   from one -- through assignments, assigned under a branch or in a loop whose condition or
   bounds depend on one, or around a loop -- and a slot acquired before such a branch is not
   filled inside it (each arm would give it another tile).
   ``xs.cluster_id()``, ``xs.num_clusters()``, ``xs.program_id(1)`` and up, and the tile of
   ``xs.tile_range`` are the same for all of them (with clusters of one program,
   ``xs.program_id(0)`` is the cluster).

Whether every program of a cluster waits, and releases, as many slots of a multicast pipe is a
property of the protocol, decided by the verifier (a program that skips a release leaves the
others' producers waiting: a deadlock with a counterexample).
"""
from __future__ import annotations

import ast
import dataclasses

from xsync import api
from xsync.errors import KernelSourceError
from xsync.lowering import ir
from xsync.lowering.passes import dataflow

PROGRAM_DEPENDENT = (ir.TileOp.CLUSTER_RANK, ir.TileOp.PROGRAM_ID, ir.TileOp.REPLICA_ID)
CLUSTER_OPS = (ir.TileOp.CLUSTER_RANK, ir.TileOp.CLUSTER_ID, ir.TileOp.NUM_CLUSTERS)
PROGRAM = ir.Call(ir.TileOp.PROGRAM_ID, (ir.Const(0),))
PROGRAMS = ir.Call(ir.TileOp.NUM_PROGRAMS, (ir.Const(0),))


def spelling(n: int) -> dict:
    """The cluster ops of a cluster of ``n`` programs in program_id / num_programs: every
    backend renders these; the verifier and the Hopper CTA split read them back."""
    if n == 1:
        return {ir.TileOp.CLUSTER_RANK: ir.Const(0), ir.TileOp.CLUSTER_ID: PROGRAM,
                ir.TileOp.NUM_CLUSTERS: PROGRAMS}
    return {ir.TileOp.CLUSTER_RANK: ir.BinOp("%", PROGRAM, ir.Const(n)),
            ir.TileOp.CLUSTER_ID: ir.BinOp("//", PROGRAM, ir.Const(n)),
            ir.TileOp.NUM_CLUSTERS: ir.BinOp("//", PROGRAMS, ir.Const(n))}


def declare(fe, call: ast.Call, s, top: bool) -> None:
    """Rule 1: ``xs.cluster(n)`` at the top level, once, before the first role."""
    usage = "write `xs.cluster(2)` (1, 2, 4 or 8 programs) as the kernel's first statement"
    if not top:
        fe.error(s, "xs.cluster(...) inside a loop, branch or role block", fix=usage)
    if fe.cluster_loc is not None:
        fe.error(s, f"xs.cluster is declared twice (first at line {fe.cluster_loc.line})", fix=usage)
    if fe.roles:
        fe.error(s, "xs.cluster(...) after a role declaration", fix=usage)
    if len(call.args) != 1 or call.keywords:
        fe.error(s, f"xs.cluster takes the number of programs, got `{ast.unparse(call)}`", fix=usage)
    n = fe.const_eval(call.args[0], "xs.cluster's programs")
    if not isinstance(n, int) or isinstance(n, bool) or n not in api.CLUSTER_SIZES:
        fe.error(s, f"xs.cluster({ast.unparse(call.args[0])}) is {n!r} programs",
                 fix="a cluster holds 1, 2, 4 or 8 programs (Hopper's portable cluster sizes)")
    fe.cluster, fe.cluster_loc = n, fe.loc(s)


def multicast_flag(fe, fnode: ast.Call, s, pipe: str, field: str) -> bool:
    """``multicast=`` of ``xs.tile(shape, dtype, multicast=...)`` (False when absent)."""
    kw = {k.arg: k.value for k in fnode.keywords}
    if set(kw) - {"multicast"}:
        fe.error(s, f"xs.tile got unknown arguments {sorted(set(kw) - {'multicast'})}",
                 fix="xs.tile(shape, dtype) or xs.tile(shape, dtype, multicast=True)", objects=(pipe,))
    if "multicast" not in kw:
        return False
    flag = fe.const_eval(kw["multicast"], f"multicast of field {field}")
    if not isinstance(flag, (bool, int)):
        fe.error(s, f"field {field} of pipe '{pipe}' has multicast={flag!r}",
                 fix="multicast=True or False (or a constexpr holding one)", objects=(pipe,))
    return bool(flag)


# ---------------------------------------------------------------- rules 2 and 3
@dataclasses.dataclass(frozen=True)
class _Origin:
    """Where a value that differs between a cluster's programs comes from: the program-dependent
    call, and the joins (a branch, a loop's bounds) through which it reached a name."""
    op: ir.TileOp               # one of PROGRAM_DEPENDENT
    through: tuple = ()         # e.g. ("the branch at line 12",)

    def via(self, where: str) -> "_Origin":
        return _Origin(self.op, self.through + (where,))

    @property
    def call(self) -> str:
        return f"xs.{self.op}()"

    def __str__(self) -> str:
        return ", through ".join((self.call,) + self.through)


@dataclasses.dataclass(frozen=True)
class _Hit:
    """What makes an expression differ between the programs: a program-dependent call in it, or
    a name it reads that one tainted."""
    origin: _Origin
    name: str | None = None

    def __str__(self) -> str:
        return f"`{self.name}` (computed from {self.origin})" if self.name else self.origin.call


@dataclasses.dataclass
class _Branch:
    """The outermost branch on a program-dependent condition that a statement runs in, and the
    slots acquired inside it (a slot acquired before it gets a different tile in each arm)."""
    why: _Origin   # what the condition comes from
    line: int
    acquired: set = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class _Taint:
    """Rule 3's data flow: which names differ between the programs of a cluster, each with the
    call it comes from. A name is tainted by a value computed from one; where paths join -- after
    a branch on such a condition, after a loop whose trip count depends on one -- by being
    assigned on them; and around a loop by what a later iteration assigns (the loop head joins
    entry and back edge). Inside a branch or loop every program that runs a statement computes
    the same values, so how often a multicast load runs is left to the verifier (a program that
    takes fewer slots is a deadlock with a counterexample)."""
    kernel: ir.KernelIR
    multicast: set
    names: dict = dataclasses.field(default_factory=dict)     # name -> _Origin

    def source(self, e) -> _Hit | None:
        """What makes ``e`` differ between the programs of a cluster, or None. ``program_id``
        of axis 1 and up is the same for them (a cluster is programs of axis 0), and with
        clusters of one program ``program_id(0)`` is the cluster."""
        for x in ir.subexprs(e):
            if isinstance(x, ir.Call) and x.op in PROGRAM_DEPENDENT and not self._same_in_cluster(x):
                return _Hit(_Origin(x.op))
            if isinstance(x, ir.Name) and x.id in self.names:
                return _Hit(self.names[x.id], x.id)
        return None

    def _same_in_cluster(self, call: ir.Call) -> bool:
        if call.op is not ir.TileOp.PROGRAM_ID:
            return False
        axis = call.args[0] if call.args else ir.Const(0)
        return isinstance(axis, ir.Const) and (axis.value != 0 or self.kernel.cluster == 1)

    def assign(self, names, origin: _Origin | None) -> None:
        for n in names:
            if origin:
                self.names[n] = origin
            else:
                self.names.pop(n, None)

    def joined(self, stmts, hit: _Hit, where: str) -> None:
        """Taint what ``stmts`` assign: after them their values depend on ``hit``."""
        for n in set().union(*map(dataflow.assigned, stmts)):
            self.names[n] = hit.origin.via(where)

    def walk(self, stmts, branch: _Branch | None = None) -> None:
        for s in stmts:
            if isinstance(s, ir.Assign):
                hit = self.source(s.value)
                self.assign(s.targets, hit and hit.origin)
            elif isinstance(s, ir.For):
                self.loop(s, branch)
            elif isinstance(s, ir.If):
                hit = self.source(s.cond)
                inner = branch or (_Branch(hit.origin, s.loc.line) if hit else None)
                entry = dict(self.names)
                self.walk(s.body, inner)
                taken = self.names
                self.names = dict(entry)
                self.walk(s.orelse, inner)
                self.names = {**self.names, **taken}
                if hit:
                    self.joined(s.body + s.orelse, hit, f"the branch at line {s.loc.line}")
            elif isinstance(s, ir.RoleBlock):
                self.walk(s.body, branch)
            elif isinstance(s, ir.SyncOp) and s.verb is ir.Verb.ACQUIRE and branch and s.target:
                branch.acquired.add(s.target)
            elif isinstance(s, ir.SlotWrite) and (s.pipe, s.field) in self.multicast:
                self.check_write(s, branch)

    def loop(self, s: ir.For, branch: _Branch | None) -> None:
        first = next(filter(None, map(self.source, (s.start, s.step))), None)   # per-trip values
        trips = first or self.source(s.stop)
        where = f"the bounds of the loop at line {s.loc.line}"
        entry = dict(self.names)
        while True:      # to the fixpoint: taint only grows, over finitely many names
            self.names = dict(entry)
            self.assign((s.var,), first and first.origin.via(where))
            self.walk(s.body, branch)
            joined = {**self.names, **entry}
            if joined.keys() == entry.keys():
                break
            entry = joined
        self.names = joined      # no iteration (entry) or the last one's end
        if trips:
            self.joined((s,), trips, where)

    def check_write(self, s: ir.SlotWrite, branch: _Branch | None) -> None:
        pipe = next(p for p in self.kernel.pipes if p.name == s.pipe)
        where = f"field '{s.field}' of pipe '{pipe.name}' is multicast"
        if not (isinstance(s.value, ir.Call) and s.value.op is ir.TileOp.LOAD):
            raise KernelSourceError(
                f"{where}, but `{s.slot}.{s.field}` is not written by xs.load", loc=s.loc,
                objects=(pipe.name,),
                fix=(f"a multicast field is a tile the copy engine delivers to every program of the "
                     f"cluster: write it as `{s.slot}.{s.field} = xs.load(tensor, offsets, shape)`, or "
                     f"declare the field without multicast=True"))
        hit = next(filter(None, map(self.source, s.value.args[1:2])), None)
        if hit:
            what = f"its load's offsets depend on {hit}"
        elif branch and s.slot not in branch.acquired:
            what = (f"slot `{s.slot}`, acquired before the branch at line {branch.line} on {branch.why}, "
                    f"is filled inside it")
        else:
            return
        origin = hit.origin if hit else branch.why
        who = ("the replicas of its copy role" if origin.op is ir.TileOp.REPLICA_ID
               else "the programs of the cluster")
        raise KernelSourceError(
            f"{where}, but {what}: {who} would load different tiles into one slot", loc=s.loc,
            objects=(pipe.name,),
            fix=("compute the offsets of a multicast load from xs.cluster_id(), the tile of "
                 "xs.tile_range, scalars and the counters of loops whose bounds are the same in "
                 "every program, outside branches on the program; a tile that differs by program "
                 "is an ordinary field (drop multicast=True)"))


def lower(kernel: ir.KernelIR) -> ir.KernelIR:
    """Rules 2 and 3, then the cluster ops spelled in program_id / num_programs."""
    multicast = {(p.name, f.name) for p in kernel.pipes for f in p.fields if f.multicast}
    for p in kernel.pipes:
        if p.multicast and kernel.role(p.src).kind is not ir.RoleKind.COPY:
            f = next(f for f in p.fields if f.multicast)
            raise KernelSourceError(
                f"field '{f.name}' of pipe '{p.name}' is multicast, but its producer '{p.src}' is a "
                f"{kernel.role(p.src).kind} role", loc=p.loc, objects=(p.name, p.src),
                fix=(f"multicast is a copy engine's delivery: produce the pipe from a role of kind "
                     f"'copy', or drop multicast=True"))
    if multicast:
        _Taint(kernel, multicast).walk(kernel.body)
    return _spelled(kernel)


def _spelled(kernel: ir.KernelIR) -> ir.KernelIR:
    """The cluster ops spelled in program_id / num_programs, which every backend renders."""
    if not any(isinstance(e, ir.Call) and e.op in CLUSTER_OPS
               for st in ir.walk(kernel.body) for e in dataflow.stmt_exprs(st)):
        return kernel
    body = kernel.body
    for op, spelled in spelling(kernel.cluster).items():
        body = tuple(dataflow.replace_expr(st, ir.Call(op, ()), spelled) for st in body)
    return dataclasses.replace(kernel, body=body)
