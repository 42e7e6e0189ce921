"""Dataflow helpers the schedule passes share: what a statement reads and writes, the
straight-line statements of a block, use-def chains of values through copies and register
hand-offs, replica-dependent names, statement replacement by identity.

Everything works on IR statements (``xsync.lowering.ir``); nothing here knows a target.
"""
from __future__ import annotations

import dataclasses

from xsync.lowering import ir


# ---------------------------------------------------------------- reads and writes
def assigned(s) -> set[str]:
    """Names a statement (and everything inside it) assigns or binds."""
    out: set[str] = set()
    for x in ir.walk([s]):
        if isinstance(x, ir.Assign):
            out |= set(x.targets)
        elif isinstance(x, ir.SyncOp) and x.target:
            out.add(x.target)
        elif isinstance(x, ir.MmaWait):
            out |= set(x.targets)
        elif isinstance(x, ir.For):
            out.add(x.var)
    return out


def own_exprs(s) -> list:
    """The expressions one statement itself reads (not those of statements inside it)."""
    if isinstance(s, (ir.Assign, ir.SlotWrite)):
        return [s.value]
    if isinstance(s, ir.Store):
        return [s.value, *s.offsets, *(s.bounds or ())]
    if isinstance(s, ir.For):
        return [s.start, s.stop, s.step]
    if isinstance(s, ir.If):
        return [s.cond]
    if isinstance(s, ir.SyncOp):
        return [s.guard] if s.guard is not None else []
    if isinstance(s, ir.MmaWait):
        return [ir.Name(t) for t in s.targets]
    return []


def stmt_exprs(s):
    """Every expression (and sub-expression) one statement reads, itself only."""
    for r in own_exprs(s):
        yield from ir.subexprs(r)


def reads(stmts) -> set[str]:
    """Names read anywhere in ``stmts`` (nested statements included; slot variables read
    by slot writes count)."""
    out: set[str] = set()
    for st in ir.walk(list(stmts)):
        out |= {e.id for e in stmt_exprs(st) if isinstance(e, ir.Name)}
        if isinstance(st, ir.SlotWrite):
            out.add(st.slot)
    return out


def writes(stmts) -> set[str]:
    out: set[str] = set()
    for st in stmts:
        out |= assigned(st)
    return out


# ---------------------------------------------------------------- blocks
def leaves(stmts):
    """The statements of one block in program order, role blocks entered (they do not
    change control flow); loops and branches are single leaves."""
    for s in stmts:
        if isinstance(s, ir.RoleBlock):
            yield from leaves(s.body)
        else:
            yield s


def role_of_leaves(stmts, role=None) -> dict[int, str | None]:
    """id(leaf) -> the role block it sits in (None: replicated code)."""
    out = {}
    for s in stmts:
        if isinstance(s, ir.RoleBlock):
            out.update(role_of_leaves(s.body, s.role))
        else:
            out[id(s)] = role
    return out


def splice(stmts, repl: dict) -> tuple:
    """Replace statements (by identity) with lists of statements, also inside role blocks."""
    out = []
    for s in stmts:
        if id(s) in repl:
            out.extend(repl[id(s)])
        elif isinstance(s, ir.RoleBlock):
            body = splice(s.body, repl)
            if body:
                out.append(ir.RoleBlock(s.role, body, s.loc))
        else:
            out.append(s)
    return tuple(out)


def replace(stmts, repl: dict) -> tuple:
    """Replace statements (by identity) with others, also inside role blocks."""
    return splice(stmts, {key: [new] for key, new in repl.items()})


def map_blocks(stmts, fn, role=None) -> tuple:
    """Rebuild ``stmts`` bottom-up: ``fn(block, role)`` rewrites every block (loop and
    branch bodies first, then the block holding them); role blocks are entered."""
    out = []
    for s in stmts:
        if isinstance(s, ir.For):
            s = dataclasses.replace(s, body=map_blocks(s.body, fn, role))
        elif isinstance(s, ir.If):
            s = dataclasses.replace(s, body=map_blocks(s.body, fn, role), orelse=map_blocks(s.orelse, fn, role))
        elif isinstance(s, ir.RoleBlock):
            s = dataclasses.replace(s, body=map_blocks(s.body, fn, s.role))
        out.append(s)
    return tuple(fn(tuple(out), role))


# ---------------------------------------------------------------- expressions
def map_expr(e, pre, post=None):
    """``e`` rewritten top-down: where ``pre(x)`` returns an expression it replaces ``x`` (not
    descended into); elsewhere the fields are rewritten, and a node rebuilt because one of them
    changed passes through ``post`` if given. Unchanged subtrees keep their identity."""
    hit = pre(e)
    if hit is not None:
        return hit
    if not dataclasses.is_dataclass(e) or isinstance(e, (type, ir.SourceLoc)):
        return e
    changes = {}
    for f in dataclasses.fields(e):
        v = getattr(e, f.name)
        if isinstance(v, tuple):
            nv = tuple(tuple(map_expr(y, pre, post) for y in x) if isinstance(x, tuple) else
                       map_expr(x, pre, post) for x in v)
            nv = nv if any(a is not b or (isinstance(a, tuple) and any(c is not d for c, d in zip(a, b)))
                           for a, b in zip(nv, v)) else v
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            nv = map_expr(v, pre, post)
        else:
            continue
        if nv is not v:
            changes[f.name] = nv
    if not changes:
        return e
    out = dataclasses.replace(e, **changes)
    return post(out) if post is not None else out


def substitute(e, names: dict):
    """``e`` with every ``ir.Name`` in ``names`` replaced by its expression."""
    return map_expr(e, lambda x: names.get(x.id) if isinstance(x, ir.Name) else None)


def replace_expr(e, old, new):
    """``e`` with every sub-expression equal to ``old`` replaced by ``new``."""
    return map_expr(e, lambda x: new if x == old else None)


def fresh_name(stem: str, taken: set[str]) -> str:
    """``stem``, or ``stem_2``, ``stem_3`` ... whichever is not in ``taken`` (and take it)."""
    name, k = stem, 1
    while name in taken:
        k += 1
        name = f"{stem}_{k}"
    taken.add(name)
    return name


def names_in(kernel: ir.KernelIR) -> set[str]:
    """Every name the kernel uses: parameters, constexprs, sync objects, roles, variables."""
    out = {p.name for p in kernel.params} | {n for n, _ in kernel.constexprs}
    out |= {o.name for o in kernel.pipes + kernel.events + kernel.barriers}
    out |= {r.name for r in kernel.roles}
    stmts = kernel.all_statements()
    return out | writes(stmts) | reads(stmts)


# ---------------------------------------------------------------- asynchronous mma
def is_mma(s) -> bool:
    """``t = xs.mma(...)``."""
    return isinstance(s, ir.Assign) and len(s.targets) == 1 and isinstance(s.value, ir.Call) \
        and s.value.op is ir.TileOp.MMA


def mma_accumulator(call: ir.Call):
    """The accumulator expression of an mma call, or None (a fresh product)."""
    if len(call.args) > 2 and not (isinstance(call.args[2], ir.Const) and call.args[2].value is None):
        return call.args[2]
    return None


def is_full_wait(s, name: str | None = None) -> bool:
    """``t = xs.mma_wait(t, pending=0)`` (for ``t == name`` when given)."""
    if not (isinstance(s, ir.Assign) and len(s.targets) == 1 and isinstance(s.value, ir.Call)
            and s.value.op is ir.TileOp.MMA_WAIT and s.value.args[:1] == (ir.Name(s.targets[0]),)):
        return False
    if s.value.kwarg("pending", ir.Const(0)) != ir.Const(0):
        return False
    return name is None or s.targets[0] == name


def mma_calls(stmts) -> list[ir.Call]:
    return [c for s in ir.walk(list(stmts)) for c in stmt_exprs(s)
            if isinstance(c, ir.Call) and c.op in (ir.TileOp.MMA, ir.TileOp.MMA_WAIT)]


def slot_of(e) -> str | None:
    """The slot variable an mma operand reads in shared memory (``slot.f`` or
    ``trans(slot.f)``), else None."""
    if isinstance(e, ir.Call) and e.op is ir.TileOp.TRANS and len(e.args) == 1:
        e = e.args[0]
    if isinstance(e, ir.Attr) and isinstance(e.value, ir.Name):
        return e.value.id
    return None


# ---------------------------------------------------------------- replicas
def replica_tainted(stmts) -> set[str]:
    """Names whose value may differ between the replicas of one agent: anything computed
    from ``xs.replica_id()``, a pipe slot (paired pipes give each replica its own data) or
    a tainted name, and anything assigned under a tainted branch or loop (fixpoint)."""
    slots = {s.target for s in ir.walk(list(stmts)) if isinstance(s, ir.SyncOp) and s.target}
    tainted = set(slots)

    def dirty(e):
        return any(isinstance(x, ir.Call) and x.op is ir.TileOp.REPLICA_ID for x in ir.subexprs(e)) \
            or bool(ir.expr_names(e) & tainted)

    def visit(block, ctrl):
        changed = False
        for s in block:
            if isinstance(s, ir.Assign):
                if ctrl or dirty(s.value):
                    changed |= not set(s.targets) <= tainted
                    tainted.update(s.targets)
            elif isinstance(s, ir.For):
                c = ctrl or any(dirty(e) for e in (s.start, s.stop, s.step))
                if c and s.var not in tainted:
                    tainted.add(s.var)
                    changed = True
                changed |= visit(s.body, c)
            elif isinstance(s, ir.If):
                c = ctrl or dirty(s.cond)
                changed |= visit(s.body, c) | visit(s.orelse, c)
            elif isinstance(s, ir.RoleBlock):
                changed |= visit(s.body, ctrl)
        return changed

    while visit(list(stmts), False):
        pass
    return tainted


def replica_dirty(e, tainted: set[str]) -> bool:
    """Whether expression ``e`` may differ between replicas (see :func:`replica_tainted`)."""
    return any(isinstance(x, ir.Call) and x.op is ir.TileOp.REPLICA_ID for x in ir.subexprs(e)) \
        or bool(ir.expr_names(e) & tainted)
