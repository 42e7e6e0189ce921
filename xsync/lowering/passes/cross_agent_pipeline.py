"""Cross-agent software pipelining: issue a producer's hand-off one iteration ahead.

In a loop where agent A hands a value to another agent through pipe P and later in the same
iteration waits for that agent's answer through pipe Q (the attention kernel on Ascend: the
cube computes S and commits ``s_out``, then waits for P on ``p_in``), A and the other agent
strictly alternate. Rotating A's loop so that the P hand-off of iteration i+1 is issued before
A waits on Q for iteration i lets both run at once (the cube computes QK^T of block i+1 while
the vector cores run the softmax of block i)::

    before:  for i:  A: stage_a(i) -> commit P   wait Q -> stage_b(i)
    after:   if lo < hi: A: stage_a(lo)
             for i:  A: if i + step < hi: stage_a(i + step)      (commit P, one ahead)
                     A: stage_b(i)                                (wait Q for i)

Only A's program changes; the other agents' programs are untouched. The rewritten kernel is
what the verifier checks (``Kernel.lower`` verifies after the passes).

Applicability, for a ``for`` loop L and an agent A (numbered as in the log):

1. L's step is a positive compile-time constant and its start and stop are not assigned in
   L's body (the guards ``start < stop`` and ``i + step < stop`` are loop-invariant).
2. A commits a pipe P to another agent in L's body, at the top level of one of its role blocks,
   and waits on a pipe Q from another agent later in the same iteration.
3. stage_a is the backward dataflow slice of P's commit within A's statements of the
   iteration (P's acquire and slot writes, the statements whose values they read, and the
   whole same-agent pipe traffic those values pass through); stage_b is the rest of A's
   statements, in their order.
4. stage_a waits on no pipe or event from another agent other than P's own acquire.
5. No flow between the stages: stage_b writes no name stage_a reads (stage_a(i+1) now runs
   before stage_b(i)), and stage_a writes no name stage_b reads (stage_b(i) must see its own
   iteration's values, which only travel through pipes), except as rule 9 allows.
6. stage_a reads no name that unannotated statements of L's body define.
7. The rewritten protocol verifies (checked by ``Kernel.lower`` right after the passes). Where
   it is proven only up to the verifier's bounds and the kernel as written for every value
   (the windowed fused dK/dV on Ascend), lowering keeps the kernel as written; the log says
   "not kept".
8. Depth: stage_a runs one iteration ahead per stage of P beyond the first, at most two (a
   3-stage P: the prologue issues the first two iterations' stage_a, the loop stage_a(i + 2 step)
   before stage_b(i)); P's stages are the slots those hand-offs occupy.
9. Same-agent slots read by both stages (the attention backward's Q and dO tiles: S^T = K Q^T
   in stage_a, dK += dS^T Q in stage_b): a slot stage_a waits on from a pipe that stays on A
   may be read by stage_b through its fields, each written once by stage_a from the loop
   counter and names the loop does not assign, out of tensors the kernel never stores to.
   stage_b(i) then computes each such field again (``xs_<slot>_<field>_again``, issued before
   stage_b's first wait) instead of reading the slot, which stage_a(i + 1) has overwritten
   where the renderer keeps the payload in one value per pipe (Ascend's same-core pipes).
   Not a copy carried across the iteration: a tile carried in the loop is copied L1 to L1 by
   the HIVM compiler, which it refuses ("Unsupported copy from cbuf to cbuf"). The verifier
   reads the rotated guard ``i + j step < stop`` from the loop's trip count
   (``verifier.forms.iterations_ahead``), so it adds no scalar values to try.
"""
from __future__ import annotations

import dataclasses

from xsync.lowering import ir
from xsync.lowering.passes.dataflow import assigned, fresh_name, names_in, replace_expr, stmt_exprs, substitute
from xsync.lowering.placement import Placement
from xsync.lowering.protocol import NotConstant, evaluate
from xsync.lowering.slicing import reads

NAME = "cross-agent-pipeline"


def _sync_ops(s) -> list[ir.SyncOp]:
    return [x for x in ir.walk([s]) if isinstance(x, ir.SyncOp)]


# ---------------------------------------------------------------- the pass
def run(kernel: ir.KernelIR, placement: Placement, log, options=None) -> ir.KernelIR:
    body = _rewrite_block(kernel, placement, kernel.body, log)
    return dataclasses.replace(kernel, body=body) if body is not kernel.body else kernel


def _rewrite_block(kernel, placement, stmts, log):
    out, changed = [], False
    for s in stmts:
        if isinstance(s, ir.For):
            inner = _rewrite_block(kernel, placement, s.body, log)
            loop = dataclasses.replace(s, body=inner) if inner is not s.body else s
            rewritten = _try_loop(kernel, placement, loop, log)
            if rewritten is not None:
                out += rewritten
                changed = True
                continue
            changed |= loop is not s
            out.append(loop)
        elif isinstance(s, ir.If):
            b = _rewrite_block(kernel, placement, s.body, log)
            e = _rewrite_block(kernel, placement, s.orelse, log)
            if b is not s.body or e is not s.orelse:
                s, changed = dataclasses.replace(s, body=b, orelse=e), True
            out.append(s)
        else:
            out.append(s)
    return tuple(out) if changed else stmts


def _try_loop(kernel, placement, loop: ir.For, log):
    for agent in placement.agents:
        roles = set(agent.roles)
        blocks = [s for s in loop.body if isinstance(s, ir.RoleBlock) and s.role in roles]
        if not blocks:
            continue
        where = f"loop at line {loop.loc.line} on agent '{agent.name}'"
        plan = _plan(kernel, placement, loop, agent, blocks)
        if isinstance(plan, str):
            if plan:
                log.note(NAME, False, where, plan)
            continue
        stage_a, p, q, carried = plan
        depth = _depth(p)
        ahead = "one iteration" if depth == 1 else f"{depth} iterations"
        again = "" if not carried else "; loaded again for the later stage: " + ", ".join(
            f"'{slot}.{f}'" for slot, f in sorted(carried))
        log.note(NAME, True, where,
                 f"the hand-off on pipe '{p.name}' is issued {ahead} ahead of the wait on "
                 f"'{q.name}' ({len(stage_a)} statement(s) rotated; '{p.name}' has {p.stages} "
                 f"stage(s){again})")
        if not carried:
            return _rewrite(loop, agent, stage_a, depth)
        return _rewrite(loop, agent, stage_a, depth, _named(kernel, carried))
    return None


def _plan(kernel, placement, loop, agent, blocks):
    """(stage_a statement ids, P, Q), or the reason the pass does not apply ('' = nothing to
    say: the agent has no cross-agent pipe hand-off here)."""
    roles = set(agent.roles)
    # A's top-level statements of one iteration, in order
    items = [(b.role, s) for b in blocks for s in b.body]
    commits = [(k, s) for k, (_, s) in enumerate(items) if isinstance(s, ir.SyncOp)
               and s.verb is ir.Verb.COMMIT and _crossing_out(kernel, placement, s.obj, roles)]
    waits = [(k, s) for k, (_, s) in enumerate(items) if isinstance(s, ir.SyncOp)
             and s.verb is ir.Verb.WAIT and _crossing_in(kernel, placement, s.obj, roles)]
    if not commits or not waits:
        return ""
    k_commit, commit = commits[0]
    later = [(k, w) for k, w in waits if k > k_commit]
    if not later:
        return ""
    p = kernel.sync_object(commit.obj)
    q = kernel.sync_object(later[0][1].obj)
    # rule 1
    try:
        step = evaluate(loop.step, kernel.constexpr_values)
    except NotConstant:
        step = None
    if not (isinstance(step, int) and step > 0):
        return "rule 1: the loop's step is not a positive compile-time constant"
    in_loop = set().union(*(assigned(s) for s in loop.body)) if loop.body else set()
    bound_names = ir.expr_names(loop.start) | ir.expr_names(loop.stop)
    if bound_names & in_loop:
        return f"rule 1: the loop bound uses {sorted(bound_names & in_loop)}, assigned in the loop"
    # rule 3: the backward slice of P's commit
    same_agent = {o.name for o in kernel.pipes if not placement.crosses(o)}

    def pipe_of(st):
        if isinstance(st, ir.SyncOp):
            return st.obj
        return st.pipe if isinstance(st, ir.SlotWrite) else None

    need = {k_commit}
    changed = True
    while changed:
        changed = False
        through = {pipe_of(items[j][1]) for j in need} & same_agent
        for k, (_, st) in enumerate(items):
            if k in need:
                continue
            later_reads = set().union(*(reads(items[j][1]) for j in need if j > k))
            if (pipe_of(st) == p.name and k < k_commit) or (assigned(st) & later_reads) \
                    or pipe_of(st) in through:
                need.add(k)
                changed = True
    stage_a = sorted(need)
    stage_b = [k for k in range(len(items)) if k not in need]
    # rule 4
    for k in stage_a:
        for op in _sync_ops(items[k][1]):
            obj = kernel.sync_object(op.obj)
            if op.verb is ir.Verb.WAIT and not isinstance(obj, ir.Barrier) and placement.crosses(obj) \
                    and obj.dst in roles:
                return f"rule 4: the stage to rotate waits on '{op.obj}' from another agent"
            if isinstance(obj, ir.Barrier):
                return f"rule 4: the stage to rotate meets barrier '{op.obj}'"
    # rule 5
    a_reads = set().union(*(reads(items[k][1]) for k in stage_a))
    a_writes = set().union(*(assigned(items[k][1]) for k in stage_a))
    b_reads = set().union(*(reads(items[k][1]) for k in stage_b)) if stage_b else set()
    b_writes = set().union(*(assigned(items[k][1]) for k in stage_b)) if stage_b else set()
    if b_writes & a_reads:
        return f"rule 5: the later stage writes {sorted(b_writes & a_reads)}, which the rotated stage reads"
    # rule 9: slot fields of same-agent pipes the later stage reads are computed again there
    carried = _carried(kernel, placement, loop, [items[k] for k in stage_a], [items[k][1] for k in stage_b],
                       a_writes & b_reads)
    if isinstance(carried, str):
        return carried
    # rule 6
    replicated = set().union(*(assigned(s) for s in loop.body if not isinstance(s, ir.RoleBlock))) \
        if loop.body else set()
    if a_reads & replicated:
        return f"rule 6: the rotated stage reads {sorted(a_reads & replicated)}, defined in the loop body"
    ids = {id(items[k][1]) for k in stage_a}
    return ids, p, q, carried


def _carried(kernel, placement, loop, stage_a, stage_b, flow):
    """Rule 9: {(slot, field): (consumer role, value)} for every slot field the later stage
    reads from a slot of a same-agent pipe the rotated stage waited on, ``value`` being what
    the rotated stage wrote into it; or the rule-5 refusal where a name of ``flow`` is
    anything else, or where the value cannot be computed again in the later stage."""
    waits, writes = {}, {}
    for role, st in stage_a:
        for x in ir.walk([st]):
            if isinstance(x, ir.SyncOp) and x.verb is ir.Verb.WAIT and x.target:
                obj = kernel.sync_object(x.obj)
                if isinstance(obj, ir.Pipe) and not placement.crosses(obj):
                    waits[x.target] = (role, obj)
            elif isinstance(x, ir.SlotWrite):
                writes.setdefault((x.pipe, x.field), []).append(x.value)
    other = sorted(flow - set(waits))
    if other:
        return f"rule 5: the rotated stage writes {other}, which the later stage reads"
    # the values are computed again in the later stage: from the loop counter and names the
    # loop does not assign, from tensors no statement of the kernel stores to
    fixed = set().union(*(assigned(s) for s in loop.body)) - {loop.var}
    stored = {x.tensor for x in kernel.all_statements() if isinstance(x, ir.Store)}
    out = {}
    for st in stage_b:
        for x in ir.walk([st]):
            for e in stmt_exprs(x):
                if not (isinstance(e, ir.Attr) and isinstance(e.value, ir.Name) and e.value.id in flow):
                    continue
                role, pipe = waits[e.value.id]
                values = writes.get((pipe.name, e.attr), [])
                if e.part is not None or len(values) != 1:
                    return (f"rule 9: '{e.value.id}.{e.attr}' (pipe '{pipe.name}') is not written once "
                            f"by the rotated stage")
                names = ir.expr_names(values[0])
                if kernel.role(pipe.src).replicas != kernel.role(pipe.dst).replicas and any(
                        isinstance(c, ir.Call) and c.op is ir.TileOp.REPLICA_ID for c in ir.subexprs(values[0])):
                    return f"rule 9: '{e.value.id}.{e.attr}' reads the replica id of '{pipe.src}'"
                if names & fixed or names & stored:
                    return (f"rule 9: '{e.value.id}.{e.attr}' reads {sorted(names & (fixed | stored))}, "
                            f"changed in the loop or the kernel")
                out[(e.value.id, e.attr)] = (role, values[0])
    left = reads(_substituted(stage_b, {k: ir.Name("") for k in out})) & flow
    if left:
        return f"rule 5: the later stage reads the slot {sorted(left)} other than by its fields"
    return out


def _substituted(stmts, fields: dict) -> list:
    """``stmts`` with each slot field read ``slot.f`` (``fields``: (slot, f) -> expr) replaced
    by its expression."""
    out = []
    for s in stmts:
        for (slot, f), new in fields.items():
            s = replace_expr(s, ir.Attr(ir.Name(slot), f), new)
        out.append(s)
    return out


def _crossing_out(kernel, placement, name, roles) -> bool:
    obj = kernel.sync_object(name)
    return isinstance(obj, ir.Pipe) and placement.crosses(obj) and obj.src in roles


def _crossing_in(kernel, placement, name, roles) -> bool:
    obj = kernel.sync_object(name)
    return isinstance(obj, ir.Pipe) and placement.crosses(obj) and obj.dst in roles


MAX_DEPTH = 2


def _depth(p) -> int:
    """Iterations stage_a runs ahead (rule 8): one per stage of P beyond the first, at most
    MAX_DEPTH (P's stages are the slots the hand-offs issued ahead occupy)."""
    return max(1, min(MAX_DEPTH, p.stages - 1))


def _named(kernel, carried: dict) -> dict:
    """Rule 9: (slot, field) -> (role, a fresh name, value) for the later stage's slot fields."""
    taken = names_in(kernel)
    return {(slot, f): (role, fresh_name(f"xs_{slot}_{f}_again", taken), value)
            for (slot, f), (role, value) in sorted(carried.items())}


def _rewrite(loop: ir.For, agent, stage_a_ids, depth: int = 1, again: dict | None = None) -> list:
    """[prologue Ifs (one per iteration issued ahead), rewritten loop]; ``again`` (rule 9): the
    slot fields the later stage reads, computed again there under names of their own."""
    roles = set(agent.roles)
    step = loop.step

    def plus(base, j):
        return base if j == 0 else ir.BinOp("+", base, step if j == 1 else ir.BinOp("*", ir.Const(j), step))

    ahead = plus(ir.Name(loop.var), depth)

    def stage_blocks(subst):
        out = []
        for s in loop.body:
            if isinstance(s, ir.RoleBlock) and s.role in roles:
                part = tuple(substitute(x, subst) for x in s.body if id(x) in stage_a_ids)
                if part:
                    out.append(ir.RoleBlock(s.role, part, s.loc))
        return tuple(out)

    prologue = [ir.If(ir.Compare("<", plus(loop.start, j), loop.stop),
                      stage_blocks({loop.var: plus(loop.start, j)}), (), loop.loc) for j in range(depth)]
    guard = ir.If(ir.Compare("<", ahead, loop.stop), stage_blocks({loop.var: ahead}), (), loop.loc)
    # rule 9: issued before the later stage's first wait, so the loads overlap it
    later, by_role = {}, {}
    for key, (role, name, value) in (again or {}).items():
        later[key] = ir.Name(name)
        by_role.setdefault(role, []).append(ir.Assign((name,), value, loop.loc))
    rest = [ir.RoleBlock(role, tuple(v), loop.loc) for role, v in by_role.items()]
    for s in loop.body:
        if isinstance(s, ir.RoleBlock) and s.role in roles:
            part = tuple(_substituted([x], later)[0] for x in s.body if id(x) not in stage_a_ids)
            if part:
                rest.append(ir.RoleBlock(s.role, part, s.loc))
        else:
            rest.append(s)
    return prologue + [dataclasses.replace(loop, body=(guard,) + tuple(rest))]
