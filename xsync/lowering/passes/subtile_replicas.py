"""Replicas as sub-tiles: each replica's work of a step in one piece.

Where one core runs more replicas of a role than it has cores to spread them over (Ascend: the
cube runs a matrix role's replicas in lockstep, and two vector cores take a vector role's four
replicas), the renderer emits each run of statements between two sync actions replica by
replica, and each sync action once for all of them. In the attention step, as written, a sync
action sits between a replica's product and its store (``s = mma(...)`` / ``s_out.acquire()`` /
``so.s = s``) and between its softmax and the S it reads (``s_out.release()``): so every
replica's product, S and P are live at once, which is what overflows L0C and the unified buffer
at 128 x 512 steps. This pass moves a role block's acquires and waits to its start and its
releases and commits to its end, so each replica's product-and-store (or load, softmax and
store) is one run::

    before:  wait S; x = S.s; release S; softmax; acquire P; P.p = p; commit P
    after:   wait S; acquire P; x = S.s; softmax; P.p = p; release S; commit P

Each pipe's actions keep their order and count; a slot is taken earlier and given back later,
which the verifier checks like any emitted protocol (``Kernel.lower`` verifies after the passes).

Applicability, for a role block B (numbered as in the log):

1. B is in a loop and its role has more replicas than an AI core has vector cores (two): the
   replicas are sub-tiles of the rows the two vector cores split (the cube runs them in
   lockstep too). With two replicas or fewer the lowering is as written.
2. Every sync action of B is at its top level (none inside an ``if`` or a loop of B).
3. B holds a statement between two of its sync actions (else there is nothing to join).
4. No statement of B uses a slot after B releases or commits it (its actions would move
   past that use).
5. Each pipe's acquires and waits in B come before its releases and commits (moving them
   keeps every pipe's own order: a block that waits, releases and waits again on one pipe is
   lowered as written).
"""
from __future__ import annotations

import dataclasses

from xsync.lowering import ir
from xsync.lowering.passes.dataflow import reads
from xsync.lowering.placement import Placement, Unit

NAME = "subtile-replicas"
_EARLY = (ir.Verb.ACQUIRE, ir.Verb.WAIT)
_LATE = (ir.Verb.RELEASE, ir.Verb.COMMIT)
VECTOR_CORES = 2


def run(kernel: ir.KernelIR, placement: Placement, log, options=None) -> ir.KernelIR:
    body = _block(kernel, placement, kernel.body, log, False)
    return dataclasses.replace(kernel, body=body) if body is not kernel.body else kernel


def subtiled(kernel, placement, role: str) -> bool:
    """Rule 1: more replicas than vector cores, on a core that runs them one after another."""
    agent = placement.agent_of(role)
    return kernel.role(role).replicas > VECTOR_CORES and agent.unit in (Unit.CUBE, Unit.VECTOR)


def _block(kernel, placement, stmts, log, in_loop):
    out, changed = [], False
    for s in stmts:
        new = s
        if isinstance(s, ir.For):
            body = _block(kernel, placement, s.body, log, True)
            new = dataclasses.replace(s, body=body) if body is not s.body else s
        elif isinstance(s, ir.If):
            b = _block(kernel, placement, s.body, log, in_loop)
            e = _block(kernel, placement, s.orelse, log, in_loop)
            new = dataclasses.replace(s, body=b, orelse=e) if b is not s.body or e is not s.orelse else s
        elif isinstance(s, ir.RoleBlock) and in_loop and subtiled(kernel, placement, s.role):
            body = _join(s, log)
            new = dataclasses.replace(s, body=body) if body is not None else s
        changed |= new is not s
        out.append(new)
    return tuple(out) if changed else stmts


def _join(block: ir.RoleBlock, log):
    """B's statements with its acquires and waits first and its releases and commits last, or
    None (the log says why)."""
    where = f"role '{block.role}' block at line {block.loc.line}"
    body = list(block.body)
    nested = [s for s in body if not isinstance(s, ir.SyncOp)
              and any(isinstance(x, ir.SyncOp) for x in ir.walk([s]))]
    if nested:
        log.note(NAME, False, where, f"rule 2: a sync action inside the statement at line {nested[0].loc.line}")
        return None
    kinds = ["s" if isinstance(s, ir.SyncOp) else "w" for s in body]
    text = "".join(kinds).strip("s")
    if "s" not in text:
        return None          # rule 3: already one run of statements (nothing to say)
    early = [s for s in body if isinstance(s, ir.SyncOp) and s.verb in _EARLY]
    late = [s for s in body if isinstance(s, ir.SyncOp) and s.verb in _LATE]
    if len(early) + len(late) != kinds.count("s"):
        log.note(NAME, False, where, "rule 2: an event or barrier action among the pipe actions")
        return None
    for pipe in sorted({s.obj for s in early + late}):
        order = [s.verb in _EARLY for s in body if isinstance(s, ir.SyncOp) and s.obj == pipe]
        if order != sorted(order, reverse=True):
            log.note(NAME, False, where, f"rule 5: pipe '{pipe}' gives a slot back before it takes another")
            return None
    work = [s for s in body if not isinstance(s, ir.SyncOp)]
    slots = {s.obj: s.target for s in early if s.target}
    for k, s in enumerate(body):
        slot = slots.get(s.obj) if isinstance(s, ir.SyncOp) and s.verb in _LATE else None
        if slot and slot in reads([x for x in body[k + 1:] if not isinstance(x, ir.SyncOp)]):
            log.note(NAME, False, where, f"rule 4: slot '{slot}' is used after line {s.loc.line}")
            return None
    joined = early + work + late
    if joined == body:
        return None
    pipes = sorted({s.obj for s in early + late})
    log.note(NAME, True, where, f"each replica's {len(work)} statement(s) run in one piece between "
             f"the actions on {', '.join(repr(p) for p in pipes)} (slots taken first, given back last)")
    return tuple(joined)
