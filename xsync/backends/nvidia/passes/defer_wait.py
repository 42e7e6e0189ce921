"""Keep one wgmma in flight across the iterations of an accumulating loop ("wait deferral").

The portable loop waits for every mma before it releases the slots the mma read::

    for k in range(start, stop, step):
        s = pipe.wait()
        acc = xs.mma(s.a, s.b, acc)
        acc = xs.mma_wait(acc, pending=0)
        pipe.release()

so on Hopper each wgmma drains before the next is issued. The rewrite waits with
``pending=1`` (every wgmma but the one just issued has completed), releases the slot of the
*previous* iteration (whose wgmma has now completed; nothing in the first iteration), and
after the loop drains the last wgmma and releases the last slot (nothing for a zero-trip
loop). In IR sync operations::

    for k in range(start, stop, step):
        s = pipe.wait()
        acc = xs.mma(s.a, s.b, acc)
        acc = xs.mma_wait(acc, pending=1)
        pipe.release()            guard: k > start     (FIFO: the oldest held slot)
    acc = mma_wait(acc, 0)        (all values complete)
    pipe.release()                guard: start < stop

The releases keep their count and FIFO order, one iteration later; the verifier checks the
rewritten protocol (with one stage the next wait would wait for our own release: rule 4).

Applicability, for a loop L of a consumer agent's program (inner loops first; role blocks
and branches entered), numbered as in the log:

1. L's step is a positive compile-time constant (the guard ``var > start`` means "not the
   first iteration").
2. L's body holds exactly one mma M, at its top level (role blocks entered), with an
   accumulator that is a name c, and exactly one mma_wait: the full wait J of M's result,
   after M.
3. M's result reaches c by the end of the body: J rebinds c itself, or J's value t is copied
   to c later at the top level (``c = t``, the fused split form); nothing else in the body
   reads or writes t or c.
4. Every shared-memory operand of M is a slot field (``s.f``, ``trans(s.f)``) of a wait W on
   a pipe P that crosses agents and has at least 2 stages per replica pair (``lane_stages``:
   an interleaved ring gives each pair stages / interleave); P is waited once in the body,
   before M, and released once, after J. Every register operand is loop-invariant (a wgmma
   in flight reads its registers).
5. The body synchronizes with no other agent except through those waits and releases
   (holding a slot one iteration longer must not block a partner we wait for).

Option ``nv_defer_mma_wait`` (XSYNC_NV_DEFER_MMA_WAIT=0 turns it off).
"""
from __future__ import annotations

import dataclasses

from xsync.backends.nvidia.passes import common
from xsync.lowering import ir
from xsync.lowering.passes.dataflow import (is_full_wait, is_mma, leaves, mma_accumulator, mma_calls,
                                            replace, slot_of, stmt_exprs, writes)
from xsync.lowering.protocol import evaluated

NAME = "defer-mma-wait"
OPTION = "defer_mma_wait"     # the LowerOptions field


def run(kernel: ir.KernelIR, placement, log, options=None) -> ir.KernelIR:
    if not common.enabled(options, OPTION):
        return kernel
    for agent in common.consumers(placement):
        body = common.program(kernel, agent)
        new = _rewrite(body, kernel, placement, agent, log)
        if new != body:
            kernel = common.with_program(kernel, agent, new)
    return kernel


def _rewrite(stmts, kernel, placement, agent, log):
    out = []
    for s in stmts:
        if isinstance(s, ir.For):
            s = dataclasses.replace(s, body=_rewrite(s.body, kernel, placement, agent, log))
            plan = _plan(s, kernel, placement)
            if isinstance(plan, str):
                if plan:
                    log.note(NAME, False, common.where(kernel, agent, s), plan)
            else:
                log.note(NAME, True, common.where(kernel, agent, s),
                         f"one wgmma stays in flight across iterations; the release of "
                         f"{', '.join(repr(p) for p in plan[2])} moves one iteration later")
                out.extend(_apply(s, *plan))
                continue
        elif isinstance(s, ir.If):
            s = dataclasses.replace(s, body=_rewrite(s.body, kernel, placement, agent, log),
                                    orelse=_rewrite(s.orelse, kernel, placement, agent, log))
        elif isinstance(s, ir.RoleBlock):
            s = ir.RoleBlock(s.role, _rewrite(s.body, kernel, placement, agent, log), s.loc)
        out.append(s)
    return tuple(out)


def _plan(loop: ir.For, kernel, placement):
    """(wait J, chain variable c, released pipes, their releases), or why not ('' = no mma:
    nothing to say)."""
    calls = mma_calls(loop.body)
    if not any(c.op is ir.TileOp.MMA for c in calls):
        return ""
    items = list(leaves(loop.body))
    # rule 2
    mmas = [s for s in items if is_mma(s)]
    if len(mmas) != 1 or sorted(c.op for c in calls) != [ir.TileOp.MMA, ir.TileOp.MMA_WAIT]:
        return "rule 2: the body does not hold exactly one mma and one mma_wait at its top level"
    m = mmas[0]
    acc = mma_accumulator(m.value)
    if not isinstance(acc, ir.Name):
        return f"rule 2: the mma at line {m.loc.line} does not accumulate into a name"
    mi = items.index(m)
    t = m.targets[0]
    ji = next((j for j in range(mi + 1, len(items)) if is_full_wait(items[j], t)), None)
    if ji is None:
        return f"rule 2: the mma at line {m.loc.line} is not waited to 0 pending later in the body"
    j = items[ji]
    # rule 1
    step = evaluated(loop.step, kernel.constexpr_values)
    if not (isinstance(step, int) and step > 0):
        return "rule 1: the loop's step is not a positive compile-time constant"
    # rule 3: the accumulator chain t -> c
    c = acc.id
    chain = {m, j}
    if t != c:
        copy = next((x for x in items[ji + 1:] if isinstance(x, ir.Assign) and x.targets == (c,)
                     and x.value == ir.Name(t)), None)
        if copy is None:
            return f"rule 3: the product `{t}` does not flow back into the accumulator `{c}`"
        chain.add(copy)
    for st in ir.walk(loop.body):
        if any(st is x for x in chain):
            continue
        if _own_names(st) & {t, c}:
            return f"rule 3: the accumulator is read or written elsewhere in the body (line {st.loc.line})"
    # rule 4: operands
    body_writes = writes(loop.body)
    waits = {}
    for arg in m.value.args[:2]:
        slot = slot_of(arg)
        if slot is None:
            names = ir.expr_names(arg)
            if names & body_writes:
                return (f"rule 4: register operand {sorted(names & body_writes)} of the mma at line "
                        f"{m.loc.line} changes in the loop")
            continue
        w = next((x for x in items[:mi] if isinstance(x, ir.SyncOp) and x.verb is ir.Verb.WAIT and x.target == slot), None)
        pipe = kernel.sync_object(w.obj) if w is not None else None
        if not isinstance(pipe, ir.Pipe) or not placement.crosses(pipe):
            return f"rule 4: operand `{slot}` of the mma at line {m.loc.line} is not a slot of a pipe from another agent"
        if pipe.lane_stages < 2:
            return (f"rule 4: pipe '{pipe.name}' has {pipe.lane_stages} stage per replica pair: its next "
                    f"wait would need our own release")
        waits[pipe.name] = w
    if not waits:
        return f"rule 4: the mma at line {m.loc.line} reads no pipe slot"
    releases = {}
    for name, w in waits.items():
        ws = [x for x in ir.walk(loop.body) if isinstance(x, ir.SyncOp) and x.obj == name and x.verb is ir.Verb.WAIT]
        rs = [x for x in ir.walk(loop.body) if isinstance(x, ir.SyncOp) and x.obj == name and x.verb is ir.Verb.RELEASE]
        after = [x for x in items[ji + 1:] if any(x is r for r in rs)]
        if len(ws) != 1 or len(rs) != 1 or not after:
            return f"rule 4: pipe '{name}' is not waited once before the mma and released once after its wait"
        releases[name] = after[0]
    # rule 5
    ours = set(map(id, waits.values())) | set(map(id, releases.values()))
    for st in ir.walk(loop.body):
        if isinstance(st, ir.SyncOp) and id(st) not in ours:
            obj = kernel.sync_object(st.obj)
            if isinstance(obj, ir.Barrier) or placement.crosses(obj):
                return f"rule 5: the body also synchronizes on '{st.obj}' (line {st.loc.line})"
    return j, c, tuple(releases), tuple(releases.values())


def _own_names(st) -> set[str]:
    """Names one statement itself reads or binds (not the statements inside it)."""
    bound = set(st.targets) if isinstance(st, (ir.Assign, ir.MmaWait)) else \
        {st.target} if isinstance(st, ir.SyncOp) and st.target else {st.var} if isinstance(st, ir.For) else set()
    return bound | {e.id for e in stmt_exprs(st) if isinstance(e, ir.Name)}


def _apply(loop: ir.For, j, c, pipes, releases):
    """[rewritten loop, drain and last releases after it] (outside any role block the
    releases act for their pipe's consumer role)."""
    later = ir.Compare(">", ir.Name(loop.var), loop.start)
    ran = ir.Compare("<", loop.start, loop.stop)
    repl = {id(j): ir.Assign(j.targets, ir.Call(ir.TileOp.MMA_WAIT, j.value.args, (("pending", ir.Const(1)),)), j.loc)}
    for r in releases:
        repl[id(r)] = ir.SyncOp(r.verb, r.obj, r.target, r.loc, guard=later,
                                note="of the previous iteration's slot (held back: its wgmma has completed)")
    new_loop = dataclasses.replace(loop, body=replace(loop.body, repl))
    tail = [ir.MmaWait((c,), 0, j.loc, note="defer_mma_wait: the loop's last wgmma completes")]
    tail += [ir.SyncOp(r.verb, r.obj, r.target, r.loc, guard=ran,
                       note="of the last slot (held back: its wgmma has completed)") for r in releases]
    return [new_loop, *tail]
