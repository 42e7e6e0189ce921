"""A cluster kernel as ONE Gluon program over the cluster's CTAs (Triton >= 3.8), decided before
rendering by numbered rules; where they do not hold, the programs of a cluster stay independent
programs that each load their own copy of a multicast field (``Target.multicast_missing``).

Gluon has no per-CTA rank: a program launched with ``num_ctas=n`` is spread over the n CTAs of a
cluster by CGA layouts (``cga_layout=``). The xsync cluster's programs (rank r) become one
program whose per-rank tiles are the CTA split of a tile n times taller, and whose multicast
fields are broadcast: the lead CTA issues their TMA with ``multicast=True``. The rewritten kernel
(:attr:`CtaSplit.kernel`) is an ordinary program of that tile; the renderer spells it with the
CGA bases, the barriers below and ``num_ctas=n`` (tests/nvidia/multicast_reference.py is the
protocol written by hand).

Derived, not written (so no kernel can get them wrong): each CTA arms its own full barrier with
the bytes it receives, its share of the split fields plus the whole multicast fields (= the
slot bytes of the per-program pipe, the allocation's ``expect``); the lead CTA alone waits for
the multicast slot to be free, on a group barrier that lives on the lead and counts one release
per CTA (``init`` multiplies the count by n, every CTA's arrive is routed to the lead). sm_90a
has no multicast mbarrier arrive, so the release goes to the one CTA that multicasts.

Rules (the first that fails keeps the per-program fallback and is the allocation table's reason):

1. the installed Gluon spells multicast (``gluon_compat.cluster_multicast()``);
2. every pipe crossing partitions is filled by TMA, and a multicast pipe has one ring: one
   producer replica (1 -> 1, or 1 -> N broadcast to consumer replicas), no interleave;
3. ``xs.cluster_rank()`` enters only as ``v = base + xs.cluster_rank() * B`` (``base`` the same in
   every program), and the program id otherwise only as the cluster id / count;
4. every such ``v`` is read only as the row offset -- ``v``, or ``v + t`` with ``t`` reading no such
   ``v`` (a replica's band: ``xs.replica_id() * S``) -- of an ``xs.load`` of ``B`` rows into a
   non-multicast field, or of an ``xs.store`` without bounds;
5. every tile is made of the programs' rows (:mod:`xsync.backends.nvidia.cta_rows`): split fields
   (each load into one at a per-rank row offset), ``xs.zeros`` / ``xs.full`` of B rows, and what
   is made of them row by row -- elementwise math, ``x[:, None]``, reductions along axis 1, a
   wgmma whose A is such a tile and whose B is a multicast field (or its ``xs.trans``), the only
   read of a multicast field; nothing transposes a tile, reduces along axis 0 or makes an index
   range.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from xsync.backends.nvidia import cta_rows
from xsync.lowering import cluster, ir
from xsync.lowering.passes import dataflow
from xsync.lowering.protocol import evaluated

SPLIT_OPS = (ir.TileOp.ZEROS, ir.TileOp.FULL)


@dataclass(frozen=True)
class CtaSplit:
    ctas: int                                   # n: CTAs of the cluster, the launch's num_ctas
    kernel: ir.KernelIR                         # the cluster's program (tiles n times taller)
    multicast: frozenset                        # (pipe, field) broadcast to every CTA
    broadcast_descs: frozenset                  # (tensor, shape) of the multicast loads

    def bases(self, rank: int, split: bool) -> list:
        """CGA bases of a rank-``rank`` tile split by rows over the CTAs, or broadcast."""
        k = self.ctas.bit_length() - 1
        return [[(1 << i) if split and d == 0 else 0 for d in range(rank)] for i in range(k)]


@dataclass(frozen=True)
class Decision:
    split: CtaSplit | None
    why: str

    def rows(self, kernel: ir.KernelIR, target) -> tuple:
        """The allocation table's rows of the kernel's multicast fields."""
        from xsync.lowering.alloc import OWN_COPY, Row, multicast_field_rows

        if self.split is None:
            return multicast_field_rows(kernel, OWN_COPY, f"{self.why}; {target.multicast_missing}")
        n = self.split.ctas
        rows = [Row("cluster", "Gluon program", f"one program over the {n} CTAs (num_ctas={n})",
                    "launched one per cluster; the per-rank tiles are its CTA split by rows (CGA layouts)")]
        rows += multicast_field_rows(kernel, f"TMA multicast to the {n} CTAs (lead CTA issues)", self.why)
        for p in kernel.pipes:
            if p.multicast:
                per = kernel.role(p.dst).replicas     # 1 -> N: each replica releases
                rows.append(Row(p.name, "multicast empty barriers",
                                f"mbarrier[{p.stages}] on the lead CTA, count {n * per} ({per} per CTA"
                                + (", 1 per consumer replica)" if per > 1 else ")"),
                                "each CTA's release also arrives there (shared::cluster); the lead "
                                "waits before it multicasts"))
        return tuple(rows)


def _rank_offset(e, rank):
    """(base, B) of ``base + rank * B`` (either order), or None."""
    if not (isinstance(e, ir.BinOp) and e.op == "+"):
        return None
    for base, prod in ((e.left, e.right), (e.right, e.left)):
        if isinstance(prod, ir.BinOp) and prod.op == "*":
            for r, b in ((prod.left, prod.right), (prod.right, prod.left)):
                if r == rank and rank not in ir.subexprs(base) and rank not in ir.subexprs(b):
                    return base, b
    return None


def gluon_has_multicast() -> bool:
    """Rule 1's fact, asked of the installed Triton (False where there is none)."""
    try:
        from xsync.backends.nvidia import gluon_compat
    except ImportError:
        return False
    return gluon_compat.cluster_multicast()


def plan(kernel: ir.KernelIR, placement, is_tma_pipe, gluon_multicast: bool | None = None) -> Decision | None:
    """The decision for ``kernel`` (None: no cluster with a multicast pipe). ``gluon_multicast``:
    rule 1's fact (None: ask the installed Triton, only for a cluster kernel)."""
    n = kernel.cluster
    mpipes = [p for p in kernel.pipes if p.multicast and placement.crosses(p)]
    if n == 1 or not mpipes:
        return None
    if not (gluon_multicast if gluon_multicast is not None else gluon_has_multicast()):
        return Decision(None, "rule 1: this Triton's Gluon has no TMA multicast (Triton 3.8+ has it)")
    for p in kernel.pipes:
        if placement.crosses(p) and not is_tma_pipe(kernel, p):
            return Decision(None, f"rule 2: pipe '{p.name}' is filled from registers, not by TMA")
    for p in mpipes:     # one ring: 1 -> 1, or 1 -> N broadcast (each consumer replica releases)
        if p.interleave > 1 or kernel.role(p.src).replicas > 1:
            return Decision(None, f"rule 2: multicast pipe '{p.name}' has one ring per producer replica")
    consts = kernel.constexpr_values
    spelled = cluster.spelling(n)
    rank, cid, progs = (spelled[op] for op in cluster.CLUSTER_OPS)
    stmts = list(ir.walk(kernel.all_statements()))
    split: dict[str, tuple] = {}            # v -> (its assignment's value, base, B)
    for s in stmts:
        if isinstance(s, ir.Assign) and len(s.targets) == 1 and rank in ir.subexprs(s.value):
            got = _rank_offset(s.value, rank)
            if got is None:
                return Decision(None, f"rule 3: line {s.loc.line} uses xs.cluster_rank() other than as "
                                      f"`base + xs.cluster_rank() * BLOCK`")
            split[s.targets[0]] = (s.value, *got)
    # rule 3: no other use of the rank or the program id
    for s in stmts:
        for e in dataflow.stmt_exprs(s):
            if e == rank and not (isinstance(s, ir.Assign) and s.targets[0] in split):
                return Decision(None, f"rule 3: line {s.loc.line} reads xs.cluster_rank() as a value")
            if isinstance(e, ir.Call) and e.op in (ir.TileOp.PROGRAM_ID, ir.TileOp.NUM_PROGRAMS) \
                    and not _inside(s, e, (rank, cid, progs)):
                what = "xs.program_id" if e.op is ir.TileOp.PROGRAM_ID else "xs.num_programs"
                return Decision(None, f"rule 3: line {s.loc.line} reads {what}({_axis(e)}) other than "
                                      f"through the cluster ops")
    if not split:
        return Decision(None, "rule 3: no tile is split by xs.cluster_rank()")
    multicast = frozenset((p.name, f.name) for p in mpipes for f in p.fields if f.multicast)
    for s in stmts:
        bad = _check_uses(kernel, s, split, multicast, consts)
        if bad:
            return Decision(None, bad)
    bad = cta_rows.check(kernel, multicast, {evaluated(v[2], consts) for v in split.values()}, consts)
    if bad:
        return Decision(None, bad)
    return Decision(_rewrite(kernel, split, multicast, consts, (cid, cluster.PROGRAM), (progs, cluster.PROGRAMS)),
                    f"rules 1-5: one program over {n} CTAs (num_ctas={n}): the lead CTA multicasts, "
                    f"each CTA arms its full barrier with the bytes it receives")


def _axis(call: ir.Call) -> str:
    return str(call.args[0].value) if call.args and isinstance(call.args[0], ir.Const) else "..."


def _inside(s, e, allowed) -> bool:
    """Whether every occurrence of ``e`` in ``s`` sits inside one of the ``allowed`` forms."""
    total = sum(1 for x in dataflow.stmt_exprs(s) if x == e)
    inside = sum(1 for x in dataflow.stmt_exprs(s) if x in allowed for y in ir.subexprs(x) if y == e)
    return total == inside


def _check_uses(kernel, s, split, multicast, consts) -> str:
    """Rule 4 for one statement ("" when it holds)."""
    line = s.loc.line
    allowed = []                                    # the Name objects read as row offsets
    if isinstance(s, ir.SlotWrite) and isinstance(s.value, ir.Call) and s.value.op is ir.TileOp.LOAD:
        offs, shape = s.value.args[1].items, s.value.args[2].items
        if (s.pipe, s.field) not in multicast:
            v = _row_offset(offs[0], split)
            if v is None:
                return f"rule 5: line {line}: the load into '{s.pipe}.{s.field}' has no per-rank row offset"
            block = evaluated(split[v.id][2], consts)
            if block is None or block != evaluated(shape[0], consts):
                step = "by a value known only at run time" if block is None else f"{block}"
                return (f"rule 4: line {line}: the load into '{s.pipe}.{s.field}' reads {evaluated(shape[0], consts)} "
                        f"rows, its rank offset steps {step}")
            allowed.append(v)
    elif isinstance(s, ir.Store):
        v = _row_offset(s.offsets[0], split)
        if v is None or s.bounds is not None or s.reduce is not None:
            return f"rule 4: line {line}: the store to '{s.tensor}' is not at a per-rank row offset without bounds"
        allowed.append(v)
    reads = [e for e in dataflow.stmt_exprs(s) if isinstance(e, ir.Name) and e.id in split]
    if len(reads) > len(allowed):
        return f"rule 4: line {line} reads `{reads[0].id}` other than as a row offset"
    return ""


def _row_offset(e, split):
    """The split name ``v`` of a row offset ``v`` or ``v + t`` (either order), or None. ``t`` reads
    no split name, so it is the same in every program of the cluster (rule 3 keeps the rank and
    the program id out of it): e.g. a replica's band, ``xs.replica_id() * S``. The cluster's
    program then loads the n programs' blocks at ``base + t`` as one block of n times the rows."""
    if isinstance(e, ir.Name) and e.id in split:
        return e
    if isinstance(e, ir.BinOp) and e.op == "+":
        for v, t in ((e.left, e.right), (e.right, e.left)):
            if isinstance(v, ir.Name) and v.id in split and not any(
                    isinstance(x, ir.Name) and x.id in split for x in ir.subexprs(t)):
                return v
    return None


def _rewrite(kernel, split, multicast, consts, *spellings) -> CtaSplit:
    n = kernel.cluster

    def scaled(shape_expr):
        items = shape_expr.items
        return ir.TupleExpr((ir.Const(n * evaluated(items[0], consts)),) + tuple(items[1:]))

    def one(s):
        """A statement made the cluster's (its nested blocks are rewritten already)."""
        if isinstance(s, ir.Assign) and len(s.targets) == 1 and s.targets[0] in split:
            s = dataclasses.replace(s, value=split[s.targets[0]][1])
        if isinstance(s, ir.SlotWrite) and (s.pipe, s.field) not in multicast \
                and isinstance(s.value, ir.Call) and s.value.op is ir.TileOp.LOAD:
            a = s.value.args
            s = dataclasses.replace(s, value=dataclasses.replace(s.value, args=(a[0], a[1], scaled(a[2])) + a[3:]))
        for e in list(dataflow.stmt_exprs(s)):
            if isinstance(e, ir.Call) and e.op in SPLIT_OPS:
                s = dataflow.replace_expr(s, e, dataclasses.replace(e, args=(scaled(e.args[0]),) + e.args[1:]))
        return s

    def program(stmts):
        stmts = dataflow.map_blocks(stmts, lambda block, role: tuple(one(s) for s in block))
        for old, new in spellings:       # the cluster's id and count become the program's
            stmts = tuple(dataflow.replace_expr(s, old, new) for s in stmts)
        return stmts

    pipes = tuple(dataclasses.replace(p, fields=tuple(
        f if (p.name, f.name) in multicast else dataclasses.replace(f, shape=(n * f.shape[0],) + tuple(f.shape[1:]))
        for f in p.fields)) for p in kernel.pipes)
    programs = tuple(dataclasses.replace(p, body=program(p.body)) for p in kernel.programs)
    out = dataclasses.replace(kernel, pipes=pipes, body=program(kernel.body), programs=programs)
    descs = frozenset((w.value.args[0].id, tuple(evaluated(x, consts) for x in w.value.args[2].items))
                      for w in ir.walk(out.all_statements())
                      if isinstance(w, ir.SlotWrite) and (w.pipe, w.field) in multicast)
    return CtaSplit(n, out, multicast, descs)

