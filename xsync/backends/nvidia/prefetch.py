"""A persistent tile loop's table reads, issued tiles ahead of the tile that uses them.

A tile loop (``xs.tile_range``) opens with scalar arithmetic and table reads
(``xs.load_scalar``): the tile's entry in a tile table, then the sequence offsets that entry
names. On Hopper each read is a global load the consumer warpgroup waits for while its tensor
cores idle, and a read whose index needs another read waits twice (attention: ~450 SM cycles
a tile of ~13k at s = 1k, causal, benchmarks/tile_timeline.py). Issued ahead, a read of depth
k (its index needs k - 1 reads before it) goes out D - k + 1 tiles early, D the deepest: every
read of a tile has landed when the tile starts, and no read waits for one issued in the same
iteration. The values ride along the loop (``<table>_r<i>_ahead<j>``: the table's i-th read of
the prologue, for the tile j ahead of the current one)::

    first = program_id(0); step = num_programs(0)
    warm-up: stage D for tile first; stages D-1, D for first, first + step; ... (D rounds)
    for tile in range(first, tiles, step):
        stage 0   the prologue as written, each read replaced by its value from stage 1
        stage 1   reads of depth D       for tile + step      (indices from stage 2's values)
        ...       (values of lower depths move one stage down: ahead<j> = ahead<j+1>)
        stage D   reads of depth 1       for tile + D * step  (indices from the tile number)
        the rest of the body

A read ahead is masked off past the loop's end (it reads 0); such a value only feeds the
stages of its own tile, which the loop never reaches. The stages are ordinary IR statements
(a read ahead is ``xs.load_scalar`` with a ``mask`` keyword): the renderer spells them, the
protocol is untouched (no synchronization moves), and tests/nvidia/test_prefetch.py runs the
schedule against the prologue for every tile of random loops.

Applicability, for a loop of a consumer warpgroup's program (producers run ahead of the
consumers: their reads are off the critical path), numbered as :func:`plan` reports them:

1. The loop is ``xs.tile_range``'s, run as a loop (persistent), with a positive step.
2. Its prologue -- the leading single-target assignments of scalars in its body -- assigns
   distinct names, not the loop variable, that the rest of the body does not assign again.
3. The prologue reads, besides its own earlier targets and the loop variable, only names the body
   never assigns (parameters, constexprs, values from before the loop); the loop's bounds read
   nothing the body assigns.
4. The prologue holds at least one read, and its deepest chain is at most ``MAX_DEPTH`` reads
   (each level holds its values in registers across a tile).

:func:`plan_kernel` plans every such loop of the agent programs before spelling; the renderer
spells the :class:`ReadsAheadPlan` it is handed.

Renderer option ``prefetch_tile_scalars`` (XSYNC_NV_PREFETCH_TILE_SCALARS=1, or a schedule row's
``reads_ahead``); off by default until the H200 A/B of benchmarks/flash_attn_ab.py's ``prefetch``
candidate has run.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from xsync.backends.nvidia.layouts import ModuleLayouts, ScopeTypes, ValueKind
from xsync.lowering import ir
from xsync.lowering.passes.dataflow import fresh_name, names_in, replace_expr, substitute, writes
from xsync.lowering.placement import Placement, Unit

MAX_DEPTH = 3
SCALAR_OPS = (ir.TileOp.LOAD_SCALAR, ir.TileOp.PROGRAM_ID, ir.TileOp.NUM_PROGRAMS, ir.TileOp.REPLICA_ID,
              ir.TileOp.CDIV, ir.TileOp.MINIMUM, ir.TileOp.MAXIMUM)


@dataclass(frozen=True)
class Read:
    """One distinct ``xs.load_scalar`` of the prologue."""

    call: ir.Call
    depth: int          # 1 + the deepest read its index needs
    stem: str           # names its values: ``<stem>_ahead<j>``


@dataclass(frozen=True)
class TileReadsAhead:
    """The rewrite of one tile loop: ``warmup`` goes before it, ``head`` opens its body in
    place of ``prologue``; both as (what the statements do, statements) groups."""

    loop: ir.For
    prologue: tuple[ir.Assign, ...]
    reads: tuple[Read, ...]
    depth: int
    warmup: tuple[tuple[str, tuple[ir.Assign, ...]], ...]
    head: tuple[tuple[str, tuple[ir.Assign, ...]], ...]

    @property
    def rest(self) -> tuple:
        return self.loop.body[len(self.prologue):]


@dataclass(frozen=True)
class ReadsAheadPlan:
    """The tile loops whose reads go out ahead, keyed by the identity of the ``ir.For`` of the
    planned programs."""

    loops: Mapping[int, TileReadsAhead]

    def of(self, loop: ir.For) -> TileReadsAhead | None:
        return self.loops.get(id(loop))


def plan_kernel(kernel: ir.KernelIR, placement: Placement, allocation, layouts: ModuleLayouts, consts: dict,
                tensors: dict, bodies: Mapping[str, tuple], *, enabled: bool) -> ReadsAheadPlan:
    """:func:`plan` for every persistent tile loop of the consumer warpgroups' programs
    ``bodies`` (agent -> the statements ``layouts`` typed), where the option
    ``prefetch_tile_scalars`` (``enabled``) asks for it. New names avoid the kernel's, the
    variables live at the loop and the names earlier rewrites of the agent took."""
    loops: dict[int, TileReadsAhead] = {}
    if enabled:
        kernel_names = names_in(kernel)
        for agent in placement.agents:
            part = allocation.partitions_of(agent.name)[0]
            if part.unit != Unit.CONSUMER:
                continue
            typed = layouts.agents[agent.name]
            taken_here: set[str] = set()

            def walk(stmts):
                for s in stmts:
                    if isinstance(s, ir.RoleBlock):
                        walk(s.body)
                    elif isinstance(s, ir.If):
                        walk(s.body)
                        walk(s.orelse or ())
                    elif isinstance(s, ir.For):
                        if s.tile_loop and not s.single_tile:
                            entry = typed.loop_entry[id(s)]
                            scope = ScopeTypes(kernel, placement, consts, tensors, typed, entry, part.warps)
                            got = plan(s, lambda e: scope.type_of(e).kind is ValueKind.SCALAR,
                                       kernel_names | set(entry) | taken_here)
                            if not isinstance(got, str):
                                loops[id(s)] = got
                                taken_here.update(t for _, group in (*got.warmup, *got.head)
                                                  for a in group for t in a.targets)
                        walk(s.body)

            walk(bodies[agent.name])
    return ReadsAheadPlan(MappingProxyType(loops))


def plan(loop: ir.For, is_scalar, taken: set[str]) -> TileReadsAhead | str:
    """The rewrite of ``loop``, or why it does not apply (``"rule n: ..."``). ``is_scalar(e)``:
    whether expression ``e`` is a scalar; ``taken``: names in use (new ones avoid them)."""
    if not loop.tile_loop or loop.single_tile:
        return "rule 1: not the loop of a persistent xs.tile_range"
    if not (isinstance(loop.step, ir.Call) and loop.step.op is ir.TileOp.NUM_PROGRAMS) and not (
            isinstance(loop.step, ir.Const) and isinstance(loop.step.value, int) and loop.step.value > 0):
        return "rule 1: the step is not the program count or a positive constant"
    prologue = []
    for s in loop.body:
        if not (isinstance(s, ir.Assign) and len(s.targets) == 1 and _scalar_expr(s.value) and is_scalar(s.value)):
            break
        prologue.append(s)
    targets = [s.targets[0] for s in prologue]
    assigned = writes(loop.body[len(prologue):])
    if len(set(targets)) != len(targets) or loop.var in targets or assigned & set(targets):
        return "rule 2: the prologue assigns a name twice, the loop variable, or one the body assigns again"
    body_writes = writes(loop.body) | {loop.var}
    known = {loop.var}
    for s in prologue:
        outside = ir.expr_names(s.value) - known
        if outside & body_writes:
            return f"rule 3: line {s.loc.line} reads {sorted(outside & body_writes)}, which the loop body assigns"
        known.add(s.targets[0])
    bounds = set().union(*(ir.expr_names(e) for e in (loop.start, loop.stop, loop.step)))
    if bounds & body_writes:
        return "rule 3: the loop's bounds read a name the body assigns"
    depth_of: dict[str, int] = {}
    reads: dict[ir.Call, Read] = {}
    for s in prologue:
        for call in _reads_inner_first(s.value):
            if call not in reads:           # named after the table: cu_q_r0, cu_q_r1, ...
                table = call.args[0].id
                stem = f"{table}_r{sum(r.call.args[0].id == table for r in reads.values())}"
                reads[call] = Read(call, 1 + _depth(call.args[1], depth_of, reads), stem)
        depth_of[s.targets[0]] = _depth(s.value, depth_of, reads)
    if not reads:
        return "rule 4: the prologue reads no table"
    depth = max(r.depth for r in reads.values())
    if depth > MAX_DEPTH:
        return f"rule 4: a chain of {depth} dependent reads (at most {MAX_DEPTH})"
    return _schedule(loop, tuple(prologue), tuple(reads.values()), depth, taken)


def _scalar_expr(e) -> bool:
    """Only scalar arithmetic and the scalar ops (no tile op, no slot field)."""
    for x in ir.subexprs(e):
        if isinstance(x, ir.Call) and x.op not in SCALAR_OPS:
            return False
        if isinstance(x, (ir.Attr, ir.Subscript, ir.TupleExpr)):
            return False
    return True


def _reads_inner_first(e) -> list[ir.Call]:
    """The reads of ``e``, a read's index reads before it."""
    out = []
    for c in ir.children(e):
        out += _reads_inner_first(c)
    if isinstance(e, ir.Call) and e.op is ir.TileOp.LOAD_SCALAR:
        out.append(e)
    return out


def _depth(e, depth_of: dict, reads: dict) -> int:
    if isinstance(e, ir.Name):
        return depth_of.get(e.id, 0)
    if isinstance(e, ir.Call) and e.op is ir.TileOp.LOAD_SCALAR:
        return reads[e].depth
    return max((_depth(c, depth_of, reads) for c in ir.children(e)), default=0)


def _schedule(loop, prologue, reads, depth, taken) -> TileReadsAhead:
    names = set(taken)
    first, step = fresh_name("xs_tile_first", names), fresh_name("xs_tile_step", names)
    tile_at = {j: fresh_name(f"xs_tile_ahead{j}", names) for j in range(1, depth + 1)}
    value = {(r.call, j): fresh_name(f"{r.stem}_ahead{j}", names)
             for r in reads for j in range(1, depth - r.depth + 2)}
    local = {(s.targets[0], j): fresh_name(f"xs_{s.targets[0]}_ahead{j}", names)
             for s in prologue for j in range(1, depth + 1)}

    def carried(e, j):
        """``e`` with every read replaced by its value j tiles ahead."""
        for r in sorted(reads, key=lambda r: -r.depth):    # a read before the reads inside its index
            if (r.call, j) in value:
                e = replace_expr(e, r.call, ir.Name(value[(r.call, j)]))
        return e

    def stage(j, tile):
        """Stage j for the tile named ``tile``: the reads of depth depth - j + 1, issued now;
        the lower ones moved down from stage j + 1."""
        loc = loop.loc
        fresh = [r for r in reads if r.depth == depth - j + 1]
        needed = set().union(*(ir.expr_names(carried(r.call.args[1], j + 1)) for r in fresh))
        lets = []
        for s in reversed(prologue):        # the prologue values the new reads' indices need
            if s.targets[0] in needed:
                needed |= ir.expr_names(carried(s.value, j + 1))
                lets.append(s)
        rename = {loop.var: ir.Name(tile)} | {s.targets[0]: ir.Name(local[(s.targets[0], j)]) for s in prologue}
        out = [ir.Assign((local[(s.targets[0], j)],), substitute(carried(s.value, j + 1), rename), s.loc)
               for s in reversed(lets)]
        for r in fresh:
            table, index = r.call.args
            masked = ir.Call(ir.TileOp.LOAD_SCALAR, (table, substitute(carried(index, j + 1), rename)),
                             (("mask", ir.Compare("<", ir.Name(tile), loop.stop)),))
            out.append(ir.Assign((value[(r.call, j)],), masked, loc))
        out += [ir.Assign((value[(r.call, j)],), ir.Name(value[(r.call, j + 1)]), loc)
                for r in reads if r.depth < depth - j + 1]
        return out

    def tile_ahead(j, base, times):
        ahead = ir.Name(step) if times == 1 else ir.BinOp("*", ir.Const(times), ir.Name(step))
        return ir.Assign((tile_at[j],), base if times == 0 else ir.BinOp("+", base, ahead), loop.loc)

    def label(j, which):
        return (f"stage {j}: the reads of depth {depth - j + 1} for {which}"
                + (", the others one stage down" if any(r.depth < depth - j + 1 for r in reads) else ""))

    warmup = [("the first tiles of this program", (ir.Assign((first,), loop.start, loop.loc),
                                                    ir.Assign((step,), loop.step, loop.loc)))]
    for rnd in range(1, depth + 1):       # as if the iterations first - (depth - rnd + 1) * step had run
        for j in range(depth - rnd + 1, depth + 1):
            times = rnd - 1 - depth + j
            warmup.append((f"warm-up {rnd}/{depth}, " + label(j, f"this program's tile {times}"),
                           (tile_ahead(j, ir.Name(first), times), *stage(j, tile_at[j]))))
    head = [(f"stage 0: the tile's prologue (line {prologue[0].loc.line}), its reads fetched ahead",
             tuple(ir.Assign(s.targets, carried(s.value, 1), s.loc) for s in prologue))]
    for j in range(1, depth + 1):
        head.append((label(j, "the next tile" if j == 1 else f"the tile {j} ahead"),
                     (tile_ahead(j, ir.Name(loop.var), j), *stage(j, tile_at[j]))))
    return TileReadsAhead(loop, prologue, reads, depth, tuple(warmup), tuple(head))
