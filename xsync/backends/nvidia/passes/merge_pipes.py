"""Merge two shared-memory rings that travel together into one ring of two-tile slots.

A kernel may feed K and V (or A and B) through two pipes that the same producer fills back
to back and the same consumer takes in the same iteration. On Hopper each pipe is a ring
with its own full and empty mbarriers, so every block costs the consumer two full-barrier
waits and two empty-barrier arrives, and the producer two empty-barrier waits. One pipe with
both tiles in a slot costs one of each; the TMA engine completes the slot's full barrier
when both copies have landed::

    before:  load:  a = A.acquire(); a.k = ...; A.commit(); b = B.acquire(); b.v = ...; B.commit()
             mma:   x = A.wait() ... A.release() ... y = B.wait() ... y.v ... B.release()
    after:   load:  a = AB.acquire(); a.k = ...; a.v = ...; AB.commit()
             mma:   x = AB.wait() ... x.v ... AB.release()

The consumer now waits for B's tile where it waited for A's, and holds A's slot until it
releases B's. Applicability, for pipes A and B (A declared first; numbered as in the log):

1. A and B link the same producer role to the same consumer role with the same stages, both
   cross agents (rings in shared memory), neither was made by a pass, and their slot fields
   have different names.
2. In every block that holds a sync operation of A or B, the producer role holds exactly
   ``acquire A``, ``commit A``, ``acquire B``, ``commit B`` in this order, with no other
   sync operation, mma wait, loop or branch between the first and the last: A's commit is
   delayed only past B's acquire, which waits for nothing but the consumer's release of B.
3. In that block the consumer role holds exactly one ``wait`` and one ``release`` of each,
   A's wait before B's, A's release before B's, each wait before its release, unguarded; where
   B's acquire or wait binds a slot variable, A's binds one too (it then carries both tiles).
   (B's tile was committed right after A's, so waiting for it at A's wait waits for nothing
   the consumer must do first; A's slot is released where B's was.)
4. No other role, and no other block, acts on A or B.
5. Profitability: at least 3 stages. The merged slot holds A's tile until B is released, so
   a 2-slot ring lets the producer run only one block ahead for A (on the H200 the merged
   2-stage ring is slower than two 2-stage rings; a 3-stage merged ring is faster than two
   3-stage rings).

The pass runs before the other Hopper passes and rewrites the kernel body: one pipe
``A_B`` (fields of A, then B; ``made_by`` this pass, ``origin`` "A+B"); B's slot variables
are renamed to A's. ``Kernel.lower`` verifies the merged protocol. Option ``nv_merge_pipes``
(XSYNC_NV_MERGE_PIPES=0 turns the pass off).
"""
from __future__ import annotations

import dataclasses

from xsync.backends.nvidia.passes import common
from xsync.lowering import ir
from xsync.lowering.passes.dataflow import fresh_name, leaves, names_in, role_of_leaves, substitute

NAME = "merge-pipes"
OPTION = "merge_pipes"     # the LowerOptions field
MIN_STAGES = 3


def run(kernel: ir.KernelIR, placement, log, options=None) -> ir.KernelIR:
    if not common.enabled(options, OPTION) or kernel.programs:
        return kernel
    merged: set[str] = set()
    for i, a in enumerate(kernel.pipes):
        for b in kernel.pipes[i + 1:]:
            if a.name in merged or b.name in merged or not _pair(a, b, placement):
                continue
            where = f"pipes '{a.name}' and '{b.name}' (lines {a.loc.line}, {b.loc.line})"
            why = _check(kernel, a, b)
            if why is None and a.stages < MIN_STAGES:
                why = (f"rule 5: {a.stages} stages; a merged ring needs at least {MIN_STAGES} to keep "
                       f"the producer ahead")
            if why is not None:
                log.note(NAME, False, where, why)
                continue
            kernel, name = _merge(kernel, a, b)
            merged |= {a.name, b.name}
            log.note(NAME, True, where,
                     f"filled back to back by '{a.src}' and taken in the same iteration by '{a.dst}': "
                     f"one ring '{name}' of {a.stages} two-tile slots (one full and one empty barrier "
                     f"per block instead of two each)")
    return kernel


def _pair(a: ir.Pipe, b: ir.Pipe, placement) -> bool:
    """Rule 1 (pairs failing it are not candidates, so the log stays short)."""
    return (a.src == b.src and a.dst == b.dst and a.stages == b.stages and a.interleave == b.interleave
            and not a.made_by
            and not b.made_by and placement.crosses(a)
            and not {f.name for f in a.fields} & {f.name for f in b.fields})


def _blocks(stmts):
    """Every block (the statement list of the body, a loop or a branch), role blocks entered."""
    yield stmts
    for s in leaves(stmts):
        if isinstance(s, ir.For):
            yield from _blocks(s.body)
        elif isinstance(s, ir.If):
            yield from _blocks(s.body)
            yield from _blocks(s.orelse)


def _ops(block, names):
    """(index among the block's leaves, op, role) for the block's own sync ops on ``names``."""
    items = list(leaves(block))
    role = role_of_leaves(block)
    return items, [(i, s, role[id(s)]) for i, s in enumerate(items)
                   if isinstance(s, ir.SyncOp) and s.obj in names]


def _check(kernel, a, b) -> str | None:
    names = {a.name, b.name}
    seen = 0
    for block in _blocks(kernel.body):
        items, ops = _ops(block, names)
        if not ops:
            continue
        seen += len(ops)
        line = ops[0][1].loc.line
        others = [(i, s, r) for i, s, r in ops if r not in (a.src, a.dst)]
        if others:
            return f"rule 4: role '{others[0][2]}' acts on '{others[0][1].obj}' (line {others[0][1].loc.line})"
        prod = [(i, s) for i, s, r in ops if r == a.src]
        want = [(ir.Verb.ACQUIRE, a.name), (ir.Verb.COMMIT, a.name), (ir.Verb.ACQUIRE, b.name), (ir.Verb.COMMIT, b.name)]
        if [(s.verb, s.obj) for _, s in prod] != want:
            return (f"rule 2: '{a.src}' does not acquire and commit {a.name}, then {b.name}, back to back "
                    f"in the block at line {line}")
        first, last = prod[0][0], prod[-1][0]
        between = [x for x in items[first + 1:last]
                   if isinstance(x, (ir.SyncOp, ir.MmaWait, ir.For, ir.If)) and x not in [s for _, s in prod]]
        if between:
            return (f"rule 2: '{a.src}' does something that may wait between acquiring {a.name} and "
                    f"committing {b.name} (line {getattr(between[0], 'loc', kernel.loc).line})")
        cons = {(s.verb, s.obj): (i, s) for i, s, r in ops if r == a.dst}
        if len([1 for _, s, r in ops if r == a.dst]) != 4 or set(cons) != {
                (ir.Verb.WAIT, a.name), (ir.Verb.WAIT, b.name), (ir.Verb.RELEASE, a.name), (ir.Verb.RELEASE, b.name)}:
            return (f"rule 3: '{a.dst}' does not wait for and release each of {a.name} and {b.name} once "
                    f"in the block at line {line}")
        binds = {(s.verb, s.obj): s.target for _, s in prod}
        binds.update({key: s.target for key, (_, s) in cons.items()})
        for verb in (ir.Verb.ACQUIRE, ir.Verb.WAIT):
            if binds[verb, b.name] and not binds[verb, a.name]:
                return (f"rule 3: {b.name}'s slot is bound by its {verb} but {a.name}'s is not (block at "
                        f"line {line}): no slot variable would carry both tiles")
        if any(s.guard is not None for _, s in cons.values()) or any(s.guard is not None for _, s in prod):
            return f"rule 3: a guarded operation on {a.name} or {b.name} (block at line {line})"
        at = {k: i for k, (i, _) in cons.items()}
        if not (at[ir.Verb.WAIT, a.name] < at[ir.Verb.WAIT, b.name] and at[ir.Verb.RELEASE, a.name] < at[ir.Verb.RELEASE, b.name]
                and at[ir.Verb.WAIT, a.name] < at[ir.Verb.RELEASE, a.name] and at[ir.Verb.WAIT, b.name] < at[ir.Verb.RELEASE, b.name]):
            return (f"rule 3: '{a.dst}' does not wait for {a.name} before {b.name} and release them in the "
                    f"same order (block at line {line})")
    every = sum(1 for s in ir.walk(kernel.all_statements()) if isinstance(s, ir.SyncOp) and s.obj in names)
    if every != seen:
        return f"rule 4: {a.name} or {b.name} is used outside the blocks that fill and take them together"
    return None


def _merge(kernel: ir.KernelIR, a: ir.Pipe, b: ir.Pipe):
    name = fresh_name(f"{a.name}_{b.name}", names_in(kernel))
    pipe = ir.Pipe(name, a.src, a.dst, a.stages, a.fields + b.fields, a.loc, made_by=NAME,
                   origin=f"{a.name}+{b.name}", interleave=a.interleave)
    note = f"{NAME}: {a.name} and {b.name} share the slots of '{name}'"

    def block(stmts):
        _, ops = _ops(stmts, {a.name, b.name})
        by = {(s.verb, s.obj): s for _, s, _ in ops}
        drop, keep, rename = set(), set(), {}
        if by:
            drop = {id(by[k]) for k in ((ir.Verb.COMMIT, a.name), (ir.Verb.ACQUIRE, b.name), (ir.Verb.WAIT, b.name),
                                         (ir.Verb.RELEASE, a.name))}
            keep = {id(by[k]) for k in ((ir.Verb.ACQUIRE, a.name), (ir.Verb.WAIT, a.name), (ir.Verb.COMMIT, b.name),
                                         (ir.Verb.RELEASE, b.name))}
            for verb in (ir.Verb.ACQUIRE, ir.Verb.WAIT):     # B's slot variable is A's now
                old, new = by[verb, b.name].target, by[verb, a.name].target
                if old and new:
                    rename[old] = ir.Name(new)
        return tuple(stmt(s, drop, keep, rename) for s in stmts if id(s) not in drop)

    def stmt(s, drop, keep, rename):
        if id(s) in keep:
            return dataclasses.replace(s, obj=name, note=note)
        if isinstance(s, ir.RoleBlock):
            return dataclasses.replace(s, body=tuple(stmt(x, drop, keep, rename) for x in s.body
                                                     if id(x) not in drop))
        if isinstance(s, ir.For):
            s = dataclasses.replace(s, body=block(s.body))
        elif isinstance(s, ir.If):
            s = dataclasses.replace(s, body=block(s.body), orelse=block(s.orelse))
        elif isinstance(s, ir.SlotWrite) and s.pipe in (a.name, b.name):
            slot = rename.get(s.slot, ir.Name(s.slot)).id
            s = dataclasses.replace(s, pipe=name, slot=slot)
        return substitute(s, rename) if rename else s

    pipes = tuple(pipe if p is a else p for p in kernel.pipes if p is not b)
    return dataclasses.replace(kernel, pipes=pipes, body=block(kernel.body)), name
