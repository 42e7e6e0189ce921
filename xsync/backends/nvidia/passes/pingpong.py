"""Inter-warpgroup ping-pong (FA3-style): the two consumer warpgroups of one agent take turns
issuing their wgmmas, so one's softmax (or other non-tensor-core work) overlaps the other's
GEMMs instead of both contending for the tensor core at once.

The pass declares two barriers for the agent, ``<agent>_turn0`` and ``<agent>_turn1``
(both replicas are members; the allocator gives them named-barrier IDs like any barrier,
so nothing is reserved when the pass does not fire), and emits, in IR sync operations::

    if replica == 1: turn0.arrive()                           # replica 0 goes first
    for ...:
        if replica == 0: turn0.sync()  else: turn1.sync()     # wait for this replica's turn
        t = xs.mma(...)
        if replica == 0: turn1.arrive() else: turn0.arrive()  # hand the turn to the other
    if replica == 0: turn0.sync(); turn1.arrive()             # take replica 1's last hand-over,
    else:            turn1.sync()                             # then let replica 1 go on

Both replicas meet each barrier equally often (zero-trip loops included), and a replica
never arrives twice on a barrier before the other's matching sync: the closing handshake
keeps replica 1 from arriving for the loop's next run (the next tile of a persistent loop)
before replica 0 took its last hand-over. Without it (a bare ``turn0.arrive()`` of replica 0
after the loop, the first version of this pass) replica 1 can be two meetings ahead on
turn0, which the verifier rejects (phase aliasing). The verifier checks the rewritten
protocol (deadlock, leftovers, a member two meetings ahead).

Placement (option ``nv_pingpong``: ``each``, the default, ``first``, ``wrap``; ``0`` off):
``each`` wraps every wgmma issue of the loop (strict alternation: QK0 QK1 PV0 PV1 ...),
``first`` only the first (QK^T in attention), ``wrap`` the span from the first to the last.
H200, flash attention d=128, one run, off/each TFLOP/s: non-causal s=4k 531,527/550, s=16k
562,559/576; causal 464,449/457, 547,544/548 ("wrap" loses 20%: it keeps the softmax inside
the turn).

Applicability, for a loop L of a consumer agent A (the outermost loop whose body holds the
mmas directly), numbered as in the log:

1. A has exactly two replicas (two consumer warpgroups).
2. L's bounds and every enclosing branch condition and loop bound are the same for both
   replicas (no ``xs.replica_id()``, pipe slot or value derived from them): both replicas
   run the same number of turns.
3. Every mma of L's body sits at its top level (role blocks entered), not under a branch or
   an inner loop, and all of them in one role.
4. ``nv_pingpong`` is not given and overlap-softmax rotates A's loop: A runs without ping-pong
   (measured faster: see overlap-softmax); an explicit ``nv_pingpong`` keeps both.
"""
from __future__ import annotations

import dataclasses

from xsync.backends.nvidia.passes import common
from xsync.lowering import ir
from xsync.lowering.passes.dataflow import (is_mma, leaves, mma_calls, names_in, fresh_name,
                                            replica_dirty, replica_tainted, role_of_leaves, splice)

NAME = "pingpong"
OPTION = "pingpong"     # the LowerOptions field
PLACEMENTS = ("each", "first", "wrap")   # the first is the default


def placement_option(options=None) -> tuple[str | None, bool]:
    """(placement or None when off, whether the option was given)."""
    v = getattr(options, OPTION) if options is not None else None
    if v is None:
        return PLACEMENTS[0], False
    if v == "0":
        return None, True
    return (PLACEMENTS[0] if v == "1" else v), True


def run(kernel: ir.KernelIR, placement, log, options=None) -> ir.KernelIR:
    from xsync.backends.nvidia.passes import overlap

    where, explicit = placement_option(options)
    if where is None:
        return kernel
    for agent in common.consumers(placement):
        body = common.program(kernel, agent)
        if not any(c.op is ir.TileOp.MMA for c in mma_calls(body)):
            continue
        if agent.replicas != 2:
            log.note(NAME, False, f"agent '{agent.name}'",
                     f"rule 1: the agent has {agent.replicas} replica(s), not two consumer warpgroups")
            continue
        if not explicit and common.enabled(options, overlap.OPTION) and overlap.rotates(body, kernel, placement):
            log.note(NAME, False, f"agent '{agent.name}'",
                     "rule 4: overlap-softmax rotates the agent's loop and nv_pingpong is not given "
                     "(together they measured slower)")
            continue
        rewriter = _Rewriter(kernel, agent, where, log)
        new = rewriter.block(body, True, None)
        if rewriter.barriers:
            kernel = dataclasses.replace(kernel, barriers=kernel.barriers + tuple(rewriter.barriers))
            kernel = common.with_program(kernel, agent, new)
    return kernel


def _replica_is(k: int) -> ir.Compare:
    return ir.Compare("==", ir.Call("replica_id", ()), ir.Const(k))


class _Rewriter:
    def __init__(self, kernel, agent, where, log):
        self.kernel, self.agent, self.where, self.log = kernel, agent, where, log
        self.tainted = replica_tainted(common.program(kernel, agent))
        self.barriers: list[ir.Barrier] = []

    def turns(self, role, loc) -> tuple[str, str]:
        if not self.barriers:
            taken = names_in(self.kernel)
            for k in (0, 1):
                name = fresh_name(f"{self.agent.name}_turn{k}", taken)
                self.barriers.append(ir.Barrier(name, (role,), loc, made_by=NAME))
        return self.barriers[0].name, self.barriers[1].name

    def block(self, stmts, uniform, role):
        out = []
        for s in stmts:
            if isinstance(s, ir.For):
                ok = uniform and not any(replica_dirty(e, self.tainted) for e in (s.start, s.stop, s.step))
                plan = self.plan(s, ok, role)
                if plan is not None:
                    out.extend(plan)
                    continue
                s = dataclasses.replace(s, body=self.block(s.body, ok, role))
            elif isinstance(s, ir.If):
                ok = uniform and not replica_dirty(s.cond, self.tainted)
                s = dataclasses.replace(s, body=self.block(s.body, ok, role), orelse=self.block(s.orelse, ok, role))
            elif isinstance(s, ir.RoleBlock):
                s = ir.RoleBlock(s.role, self.block(s.body, uniform, s.role), s.loc)
            out.append(s)
        return tuple(out)

    def plan(self, loop: ir.For, uniform: bool, role):
        """The rewritten statements, or None (inner loops are tried next)."""
        items = list(leaves(loop.body))
        mmas = [s for s in items if is_mma(s)]
        nested = [c for c in mma_calls(loop.body) if c.op is ir.TileOp.MMA]
        if not mmas or len(nested) != len(mmas):
            if nested and not mmas:
                return None      # the mmas are in an inner loop: try it
            if nested:
                self.log.note(NAME, False, common.where(self.kernel, self.agent, loop),
                              "rule 3: an mma of the body sits under a branch or an inner loop")
            return None
        where = common.where(self.kernel, self.agent, loop)
        if not uniform:
            self.log.note(NAME, False, where, "rule 2: the loop's trip count may differ between the replicas")
            return None
        roles = role_of_leaves(loop.body)
        mine = {roles.get(id(m)) for m in mmas}
        if len(mine) != 1 or None in mine:
            self.log.note(NAME, False, where, "rule 3: the mmas of the body are not all in one role")
            return None
        mma_role = mine.pop()
        t0, t1 = self.turns(mma_role, loop.loc)
        loc = loop.loc
        mine0 = _replica_is(0)

        def op(verb, bar, note):
            return ir.SyncOp(verb, bar, None, loc, note=f"pingpong: {note}")

        sync = ir.If(mine0, (op(ir.Verb.SYNC, t0, "wait for this replica's turn"),),
                     (op(ir.Verb.SYNC, t1, "wait for this replica's turn"),), loc)
        arrive = ir.If(mine0, (op(ir.Verb.ARRIVE, t1, "hand the turn to the other replica"),),
                       (op(ir.Verb.ARRIVE, t0, "hand the turn to the other replica"),), loc)
        if self.where == "each":
            repl = {id(m): [sync, m, arrive] for m in mmas}
        elif self.where == "first" or len(mmas) == 1:
            repl = {id(mmas[0]): [sync, mmas[0], arrive]}
        else:
            repl = {id(mmas[0]): [sync, mmas[0]], id(mmas[-1]): [mmas[-1], arrive]}
        self.log.note(NAME, True, where,
                      f"the two replicas take turns issuing its {len(mmas)} wgmma(s) (placement "
                      f"{self.where!r}) on barriers '{t0}' and '{t1}'")
        first = ir.If(_replica_is(1), (op(ir.Verb.ARRIVE, t0, "replica 0 issues first"),), (), loc)
        last = ir.If(_replica_is(0), (op(ir.Verb.SYNC, t0, "take replica 1's last hand-over"),
                                      op(ir.Verb.ARRIVE, t1, "this loop's turns are over")),
                     (op(ir.Verb.SYNC, t1, "wait until replica 0 took the last hand-over"),), loc)
        return [first, dataclasses.replace(loop, body=splice(loop.body, repl)), last]
