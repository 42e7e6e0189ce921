"""Slicing: the statements one agent executes.

An agent keeps the unannotated (replicated) statements and the blocks of the roles
placed on it, in source order. Replicated assignments the agent never reads are
dropped, and so are loops and branches left empty, so generated code shows only what
that agent does.
"""
from __future__ import annotations

import dataclasses

from xsync.lowering import ir


def slice_agent(body, roles) -> tuple:
    kept = _keep_roles(body, set(roles))
    return _prune(kept, set())[0]


def agent_body(kernel: ir.KernelIR, agent) -> tuple:
    """What ``agent`` (a placement Agent) runs: the program a schedule pass gave it, else
    its slice of the kernel body."""
    prog = kernel.program(agent.name)
    return prog.body if prog is not None else slice_agent(kernel.body, agent.roles)


def _keep_roles(body, roles):
    out = []
    for s in body:
        if isinstance(s, ir.RoleBlock):
            if s.role in roles:
                out.append(s)
        elif isinstance(s, ir.For):
            out.append(dataclasses.replace(s, body=tuple(_keep_roles(s.body, roles))))
        elif isinstance(s, ir.If):
            out.append(dataclasses.replace(s, body=tuple(_keep_roles(s.body, roles)),
                                           orelse=tuple(_keep_roles(s.orelse, roles))))
        else:
            out.append(s)
    return out


def reads(s) -> set[str]:
    """Names a statement (and everything inside it) reads."""
    if isinstance(s, ir.Assign):
        return ir.expr_names(s.value)
    if isinstance(s, ir.SlotWrite):
        return ir.expr_names(s.value) | {s.slot}
    if isinstance(s, ir.Store):
        out = ir.expr_names(s.value) | {s.tensor}
        for o in s.offsets + (s.bounds or ()):
            out |= ir.expr_names(o)
        return out
    if isinstance(s, ir.For):
        out = ir.expr_names(s.start) | ir.expr_names(s.stop) | ir.expr_names(s.step)
        for b in s.body:
            out |= reads(b)
        return out
    if isinstance(s, ir.If):
        out = set(ir.expr_names(s.cond))
        for b in s.body + s.orelse:
            out |= reads(b)
        return out
    if isinstance(s, ir.RoleBlock):
        out = set()
        for b in s.body:
            out |= reads(b)
        return out
    if isinstance(s, ir.MmaWait):
        return set(s.targets)
    if isinstance(s, ir.SyncOp) and s.guard is not None:
        return ir.expr_names(s.guard)
    return set()


def _prune(body, live_after):
    """Backwards pass: drop dead replicated assignments and empty loops/branches."""
    live = set(live_after)
    out = []
    for s in reversed(body):
        if isinstance(s, ir.Assign):
            if not live & set(s.targets):
                continue
            live -= set(s.targets)
            live |= reads(s)
            out.append(s)
        elif isinstance(s, ir.For):
            # a loop body sees its own later iterations: iterate liveness to a fixpoint
            inner_live = live | reads(s)
            inner, _ = _prune(list(s.body), inner_live)
            if not inner:
                continue
            s = dataclasses.replace(s, body=inner)
            live |= reads(s)
            out.append(s)
        elif isinstance(s, ir.If):
            body, _ = _prune(list(s.body), live)
            orelse, _ = _prune(list(s.orelse), live)
            if not body and not orelse:
                continue
            s = dataclasses.replace(s, body=body, orelse=orelse)
            live |= reads(s)
            out.append(s)
        else:
            live |= reads(s)
            out.append(s)
    return tuple(reversed(out)), live
