"""Intra-warpgroup overlap (FA3-style): the product of the previous key block is in flight
while the current block's softmax runs.

A loop with two asynchronous mmas -- a fresh product S (``s = mma(q, trans(kt.k))``) whose
value feeds the rest of the body B (the softmax), and an accumulating product PV
(``t = mma(p, vt.v, E)``) whose operands B computes and whose value flows back into the
accumulator E reads (D: register hand-offs and copies) -- runs, per iteration n::

    A_n: K.wait(); s = mma(..); s = mma_wait(s, 0); K.release()
    B_n: softmax of s -> p, alpha, ...
    C_n: V.wait(); t = mma(p, .., E); t = mma_wait(t, 0); V.release()
    D_n: hand-offs of t ending in the accumulator

so the tensor core idles during B. Rotated by one GEMM (wgmma groups retire in issue order)::

    if start < stop:
        A_0; n = start; B_0                          # S_0 issued and waited, its softmax
        for n in range(start + step, stop, step):
            K.wait(); s = mma(q, ..)                 # S_n
            V.wait(); t = mma(p, .., E)              # PV_{n-1}: p, alpha of B_{n-1}
            s, t = mma_wait(s, t, pending=1)         # S_n completes, PV_{n-1} stays in flight
            K.release(); B_n                         # softmax(S_n) overlaps PV_{n-1}
            t = mma_wait(t, pending=0); D_{n-1}; V.release()
        V.wait(); t = mma(p, .., E); t = mma_wait(t, 0); D_last; V.release()

A P operand written as a cast (``mma(p.to(bf16), ..)``, the accumulate form) is cast at the
end of B into a name of its own, so the loop carries the bf16 tile, not the fp32 one (as a
slot hand-off of the cast value does in the split form).

Nothing is in flight across the back edge (a product carried in flight into the next
iteration, whose first wait would retire it, makes ptxas serialize every wgmma: C7514), no
branch surrounds a wgmma or its wait, and the pending counts are constants. K and V are each
waited and released once per block, in FIFO order; the verifier checks the rewritten
protocol. Ping-pong turn barriers (pingpong pass) stay attached to their wgmma issue.

H200, flash attention d=128, b*s=16384, one run, TFLOP/s s=4k/8k/16k, ping-pong "each"
without overlap -> overlap without ping-pong: non-causal 551/570/572 -> 583/597/603, causal
456/499/550 -> 502/537/599 (overlap with ping-pong "each": 545/563/565, 453/500/550). So
unless ``nv_pingpong`` is given, an agent this pass rotates runs without ping-pong.

Applicability, for a loop L of a consumer agent's program (inner loops first; role blocks
and branches entered), the statements identified by use-def chains, not by position:

1. L's bounds and enclosing conditions are the same for every replica of the agent, its step
   is a positive compile-time constant, and the body assigns neither its bounds nor its
   variable.
2. The body holds exactly two mmas and two mma_waits, all at its top level: S without an
   accumulator and PV with one, each waited to 0 pending (J_S, J_PV) after it.
3. S reads its B operand from the slot of a wait W_K on a pipe K that crosses agents with at
   least 2 stages per replica pair (``lane_stages``), and its other inputs are loop-invariant; PV reads its B operand from the
   slot of a wait W_V on such a pipe V. K and V are each waited once and released once in the
   body (R_K after J_S, R_V after J_PV). K and V may be one pipe (both tiles in one slot: one
   wait before S, one release after J_PV): then the slot is read by S and PV only, and in the
   rotated loop PV_{n-1} reads the previous block's slot, kept in a name of its own (the
   release after PV_{n-1} frees the oldest held slot, FIFO; 2 stages hold both).
4. D, the statements after J_PV (other than R_K, R_V), are only register hand-offs of PV's
   value and at most one copy ``y = value`` into the accumulator that E reads (or PV's result
   is that accumulator itself); B, the other statements, holds no mma, no sync with another
   agent and no barrier.
5. The stages commute: B writes nothing A or C read, C and D read nothing A writes (but S's
   value through B), D writes nothing A or B touch and reads nothing A or B write but PV's
   value; A, C and D do not read the loop variable.

Option ``nv_overlap`` (XSYNC_NV_OVERLAP=0 turns it off).
"""
from __future__ import annotations

import dataclasses

from xsync.backends.nvidia.passes import common
from xsync.lowering import ir
from xsync.lowering.passes.dataflow import (fresh_name, is_full_wait, is_mma, leaves, mma_accumulator, mma_calls,
                                            own_exprs, reads, replica_dirty, replica_tainted, slot_of, writes)
from xsync.lowering.protocol import evaluated

NAME = "overlap-softmax"
OPTION = "overlap_softmax"     # the LowerOptions field


def run(kernel: ir.KernelIR, placement, log, options=None) -> ir.KernelIR:
    if not common.enabled(options, OPTION):
        return kernel
    for agent in common.consumers(placement):
        body = common.program(kernel, agent)
        new = _Rewriter(kernel, placement, agent, body, log).block(body, True)
        if new != body:
            kernel = common.with_program(kernel, agent, new)
    return kernel


def rotates(body, kernel, placement) -> bool:
    """Whether the pass would rotate a loop of ``body`` (the pingpong pass asks)."""
    r = _Rewriter(kernel, placement, None, body, None)
    return r.block(body, True) != body


class _Rewriter:
    def __init__(self, kernel, placement, agent, body, log):
        self.kernel, self.placement, self.agent, self.log = kernel, placement, agent, log
        self.tainted = replica_tainted(body)

    def note(self, applied, loop, why):
        if self.log is not None:
            self.log.note(NAME, applied, common.where(self.kernel, self.agent, loop), why)

    def block(self, stmts, uniform):
        out = []
        for s in stmts:
            if isinstance(s, ir.For):
                ok = uniform and not any(replica_dirty(e, self.tainted) for e in (s.start, s.stop, s.step))
                s = dataclasses.replace(s, body=self.block(s.body, ok))
                plan = _plan(s, self.kernel, self.placement)
                if isinstance(plan, str):
                    if plan:
                        self.note(False, s, plan)
                elif not ok:
                    self.note(False, s, "rule 1: the loop's trip count may differ between the replicas")
                else:
                    self.note(True, s, "the next S and the previous PV are in flight during the "
                                       "softmax (first softmax peeled before the loop, last PV after it)")
                    out.extend(_rotate(s, *plan))
                    continue
            elif isinstance(s, ir.If):
                ok = uniform and not replica_dirty(s.cond, self.tainted)
                s = dataclasses.replace(s, body=self.block(s.body, ok), orelse=self.block(s.orelse, ok))
            elif isinstance(s, ir.RoleBlock):
                s = ir.RoleBlock(s.role, self.block(s.body, uniform), s.loc)
            out.append(s)
        return tuple(out)


def is_turn(s, kernel) -> bool:
    """A ping-pong turn operation (``if replica ...: turn.sync()/arrive()`` on barriers the
    pingpong pass declared)."""
    if not isinstance(s, ir.If):
        return False
    ops = list(s.body) + list(s.orelse)
    return bool(ops) and all(isinstance(o, ir.SyncOp) and getattr(kernel.sync_object(o.obj), "made_by", "")
                             == "pingpong" for o in ops)


def _issue(items, wait, mma, kernel):
    """The issue of one wgmma: its slot's wait, the turn sync before it, the mma, the turn
    arrive after it (both or neither: a turn spans one issue), or None."""
    k = next(i for i, x in enumerate(items) if x is mma)
    before = k > 0 and is_turn(items[k - 1], kernel)
    after = k + 1 < len(items) and is_turn(items[k + 1], kernel)
    if before != after:
        return None
    return [wait, items[k - 1], mma, items[k + 1]] if before else [wait, mma]


def _plan(loop: ir.For, kernel, placement):
    """(A issue, J_S, R_K, B, C issue, J_PV, D, R_V), or why not ('' = nothing to say)."""
    calls = mma_calls(loop.body)
    if sum(c.op is ir.TileOp.MMA for c in calls) < 2:
        return ""
    items = list(leaves(loop.body))
    # rule 2
    tops = [s for s in items if isinstance(s, ir.Assign) and isinstance(s.value, ir.Call)
            and s.value.op in (ir.TileOp.MMA, ir.TileOp.MMA_WAIT)]
    if len(calls) != 4 or len(tops) != 4:
        return "rule 2: the body does not hold exactly two mmas and their two waits at its top level"
    fresh = [s for s in items if is_mma(s) and mma_accumulator(s.value) is None]
    accum = [s for s in items if is_mma(s) and mma_accumulator(s.value) is not None]
    if len(fresh) != 1 or len(accum) != 1:
        return "rule 2: not one fresh product and one accumulating product"
    m_s, m_pv = fresh[0], accum[0]
    s_name, pv = m_s.targets[0], m_pv.targets[0]
    if s_name == pv:
        return "rule 2: both products use one name"
    i_s, i_pv = items.index(m_s), items.index(m_pv)
    j_s = next((x for x in items[i_s + 1:] if is_full_wait(x, s_name)), None)
    j_pv = next((x for x in items[i_pv + 1:] if is_full_wait(x, pv)), None)
    if j_s is None or j_pv is None:
        return "rule 2: a product is not waited to 0 pending after its mma"
    # rule 1 (the constant step)
    step = evaluated(loop.step, kernel.constexpr_values)
    if not isinstance(step, int) or step <= 0:
        return "rule 1: the loop's step is not a positive compile-time constant"
    # rule 3: the pipes behind the B operands
    k_pipe, k_wait, k_rel = _operand_pipe(items, m_s, j_s, kernel, placement)
    if k_wait is None:
        return k_pipe
    v_pipe, v_wait, v_rel = _operand_pipe(items, m_pv, j_pv, kernel, placement)
    if v_wait is None:
        return v_pipe
    shared = k_pipe == v_pipe      # K and V in one slot: one wait before S, one release after PV
    a_issue = _issue(items, k_wait, m_s, kernel)
    c_issue = _issue(items, v_wait, m_pv, kernel)
    if a_issue is None or c_issue is None:
        return "rule 4: a ping-pong turn spans more than one wgmma issue (placement 'wrap')"
    if shared:
        c_issue, k_rel = c_issue[1:], None
    # A register hand-off PV reads (P from the softmax) is consumed when PV is issued: its
    # release goes with the issue, so the next block's softmax can hand over its P while
    # PV_{n-1} is in flight (a register hand-off holds one value at a time).
    pv_slots = {e.id for a in m_pv.value.args for e in ir.subexprs(a) if isinstance(e, ir.Name)}
    taken = []
    for x in items:
        if isinstance(x, ir.SyncOp) and x.verb is ir.Verb.RELEASE:
            obj = kernel.sync_object(x.obj)
            w = next((y for y in items if isinstance(y, ir.SyncOp) and y.obj == x.obj and y.verb is ir.Verb.WAIT), None)
            if isinstance(obj, ir.Pipe) and not placement.crosses(obj) and w is not None and w.target in pv_slots:
                later = items[items.index(m_pv) + 1:]
                if any(w.target in ir.expr_names(e) for y in later for e in own_exprs(y)):
                    return f"rule 4: the slot of '{x.obj}' is read after the PV issue"
                taken.append(x)
    c_issue = c_issue + taken
    # rule 4: D after J_PV, B the rest
    a_all, c_all = a_issue + [j_s] + ([k_rel] if k_rel else []), c_issue + [j_pv, v_rel]
    ids_ac = {id(x) for x in a_all + c_all}
    k_pv = items.index(j_pv)
    body_d = [x for x in items[k_pv + 1:] if id(x) not in ids_ac]
    body_b = [x for x in items if id(x) not in ids_ac and not any(x is d for d in body_d)]
    alias, handoff, y = {ir.Name(pv)}, set(), None
    for st in body_d:
        if isinstance(st, ir.SyncOp):
            obj = kernel.sync_object(st.obj)
            if not isinstance(obj, ir.Pipe) or placement.crosses(obj):
                return f"rule 4: after the PV wait the body synchronizes on '{st.obj}' (line {st.loc.line})"
            if st.verb is ir.Verb.WAIT and st.target:
                alias |= {ir.Attr(ir.Name(st.target), f) for p, f in handoff if p == st.obj}
        elif isinstance(st, ir.SlotWrite) and st.value in alias:
            if placement.crosses(kernel.sync_object(st.pipe)):
                return f"rule 4: PV's value leaves the agent through pipe '{st.pipe}'"
            handoff.add((st.pipe, st.field))
        elif isinstance(st, ir.Assign) and len(st.targets) == 1 and st.value in alias and y is None:
            y = st.targets[0]
        else:
            return (f"rule 4: after the PV wait the body does more than hand PV's value to the "
                    f"accumulator (line {st.loc.line})")
    acc_names = ir.expr_names(mma_accumulator(m_pv.value))
    if y is None:
        if pv not in acc_names:
            return "rule 4: PV's value does not flow back into the accumulator"
    elif y in (pv, s_name) or y not in acc_names:
        return f"rule 4: PV's value is copied to `{y}`, which the accumulator does not read"
    for st in ir.walk(body_b):
        if is_turn(st, kernel) or isinstance(st, ir.MmaWait) or (isinstance(st, ir.SyncOp) and st.guard is not None):
            return f"rule 4: the softmax holds a scheduling operation (line {st.loc.line})"
        if isinstance(st, ir.SyncOp):
            obj = kernel.sync_object(st.obj)
            if isinstance(obj, ir.Barrier) or placement.crosses(obj):
                return f"rule 4: the softmax synchronizes on '{st.obj}' with another agent (line {st.loc.line})"
    # rule 5: commutation
    ra, wa = reads(a_all), writes(a_all)
    rb, wb = reads(body_b), writes(body_b)
    rc, wc = reads(c_all), writes(c_all)
    rd, wd = reads(body_d), writes(body_d)
    body_w = writes(loop.body)
    if loop.var in body_w or (ir.expr_names(loop.start) | ir.expr_names(loop.stop)) & body_w:
        return "rule 1: the body assigns the loop variable or a bound"
    if loop.var in ra | rc | rd:
        return "rule 5: S, PV or the hand-off of PV reads the loop variable"
    if (wb | wc | wd) & (ra | wa):
        return f"rule 5: {sorted((wb | wc | wd) & (ra | wa))} written after S is read or written by it"
    # a shared slot: PV_{n-1} reads the previous block's slot, kept under another name
    slot = {k_wait.target} if shared else set()
    if (rc | rd) & wa - slot:
        return f"rule 5: PV or its hand-off reads {sorted((rc | rd) & wa - slot)}, which S writes"
    if wd & (ra | wa | rb | wb) or rd & (wa | wb) - {pv}:
        return "rule 5: the hand-off of PV touches what S or the softmax use"
    if (ra - {k_wait.target, s_name}) & body_w:
        return f"rule 3: S reads {sorted((ra - {k_wait.target, s_name}) & body_w)}, which the loop changes"
    if shared and k_wait.target in rd | reads(body_b):
        return f"rule 3: the slot of '{k_pipe}' is read outside S and PV"
    return a_issue, j_s, k_rel, body_b, c_issue, j_pv, body_d, v_rel, (k_wait.target if shared else None)


def _operand_pipe(items, m, j, kernel, placement):
    """(pipe name, its wait, its release) behind the mma's B operand, or (why not, None, None)."""
    slot = slot_of(m.value.args[1]) if len(m.value.args) > 1 else None
    k = items.index(m)
    w = next((x for x in items[:k] if isinstance(x, ir.SyncOp) and x.verb is ir.Verb.WAIT and slot and x.target == slot), None)
    pipe = kernel.sync_object(w.obj) if w is not None else None
    if not isinstance(pipe, ir.Pipe) or not placement.crosses(pipe) or pipe.lane_stages < 2:
        return (f"rule 3: the mma at line {m.loc.line} does not read B from a pipe from another agent "
                f"with at least 2 stages per replica pair", None, None)
    ops = [x for x in items if isinstance(x, ir.SyncOp) and x.obj == pipe.name]
    nested = [x for x in ir.walk(tuple(items)) if isinstance(x, ir.SyncOp) and x.obj == pipe.name]
    rels = [x for x in ops if x.verb is ir.Verb.RELEASE]
    if len(nested) != len(ops) or [x.verb for x in ops].count(ir.Verb.WAIT) != 1 or len(rels) != 1 \
            or items.index(rels[0]) < items.index(j):
        return (f"rule 3: pipe '{pipe.name}' is not waited once and released once after the mma's wait",
                None, None)
    return pipe.name, w, rels[0]


def _rotate(loop: ir.For, a_issue, j_s, k_rel, body_b, c_issue, j_pv, body_d, v_rel, slot=None):
    s_name, pv = j_s.targets[0], j_pv.targets[0]
    loc = loop.loc
    keep = ()
    m_pv = next(x for x in c_issue if is_mma(x))
    args = m_pv.value.args
    body_b = tuple(body_b)
    if slot is not None:
        # K and V share a slot: PV_{n-1} reads the previous block's slot, kept as `prev` (its
        # release after PV_{n-1} frees the oldest held slot: FIFO)
        prev = fresh_name(f"{slot}_prev", reads(loop.body) | writes(loop.body))
        args = tuple(_rename_slot(a, slot, prev) for a in args)
        keep = (ir.Assign((prev,), ir.Name(slot), loc),)
    if isinstance(args[0], ir.Cast):
        # PV_{n-1} reads B_{n-1}'s P cast to the input type (`mma(p.to(bf16), ..)`, the
        # accumulate form): cast at the end of B, so the loop carries the narrow tile, as a
        # slot hand-off of the cast value does (rule 5: nothing after B writes what it reads)
        cast = fresh_name("p_operand", reads(loop.body) | writes(loop.body))
        body_b = (*body_b, ir.Assign((cast,), args[0], m_pv.loc))
        args = (ir.Name(cast), *args[1:])
    if args != m_pv.value.args:
        renamed = ir.Assign(m_pv.targets, dataclasses.replace(m_pv.value, args=args), m_pv.loc)
        c_issue = [renamed if x is m_pv else x for x in c_issue]
    k_rel = (k_rel,) if k_rel is not None else ()
    body = (*a_issue, *c_issue,
            ir.MmaWait((s_name, pv), 1, j_s.loc, "overlap_softmax: S of this block completes; the previous PV stays in flight"),
            *k_rel, *body_b,
            ir.MmaWait((pv,), 0, j_pv.loc, "overlap_softmax: the previous PV completes (it overlapped this softmax)"),
            *body_d, v_rel, *keep)
    new_loop = dataclasses.replace(loop, start=ir.BinOp("+", loop.start, loop.step), body=body, loc=loc)
    prologue = (*a_issue, j_s, *k_rel, *keep, ir.Assign((loop.var,), loop.start, loc), *body_b)
    epilogue = (*c_issue, ir.MmaWait((pv,), 0, j_pv.loc, "overlap_softmax: the last PV completes"), *body_d, v_rel)
    return [ir.If(ir.Compare("<", loop.start, loop.stop), (*prologue, new_loop, *epilogue), (), loc)]


def _rename_slot(e, slot: str, prev: str):
    """``e`` with the slot fields ``slot.f`` read as ``prev.f``."""
    if isinstance(e, ir.Attr) and e.value == ir.Name(slot):
        return ir.Attr(ir.Name(prev), e.attr, e.part)
    if isinstance(e, ir.Call):
        return dataclasses.replace(e, args=tuple(_rename_slot(a, slot, prev) for a in e.args))
    return e
