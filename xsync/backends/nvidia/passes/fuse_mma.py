"""Fuse a fresh product into the accumulating wgmma (docs/design.md §5): Hopper keeps the
accumulator in the wgmma's registers.

The portable split form, which Ascend needs (its cube cannot rescale)::

    pv = xs.mma(p, v); pv = xs.mma_wait(pv, pending=0)       # role mma
    slot.pv = pv  ...  w = pipe.wait(); o = o * alpha[:, None] + w.pv   # role softmax

becomes, when both roles share the consumer warpgroup::

    pv = xs.mma(p, v, o * alpha[:, None]); pv = xs.mma_wait(pv, pending=0)
    slot.pv = pv  ...  w = pipe.wait(); o = w.pv

Applicability, for an mma M ``r = xs.mma(a, b)`` in one block of a consumer agent's program
(role blocks are transparent; loops and branches are blocks of their own):

1. M has no accumulator (it makes a fresh product).
2. The product's value reaches, through ``r = xs.mma_wait(r, ...)`` re-bindings and
   register hand-offs (a pipe whose ends share the agent: a slot field written with the
   value, read back as ``slot.field`` after the wait), exactly one use later in the block,
   and is not written to a pipe that leaves the agent.
3. That use is ``y = E + v`` or ``y = v + E`` with v the product (or its hand-off), and E
   does not read the product.
4. No name E reads is assigned between M and the use (E has the same value at M).
5. The product's name is not read before M in the block.

Then M accumulates into E (``r = xs.mma(a, b, E)``) and the use becomes ``y = v``. No sync
operation changes. Option ``nv_fuse_mma`` (XSYNC_NV_FUSE_MMA=0 turns the pass off).
"""
from __future__ import annotations

import dataclasses

from xsync.backends.nvidia.passes import common
from xsync.lowering import ir
from xsync.lowering.passes.dataflow import assigned, leaves, mma_accumulator, replace, stmt_exprs

NAME = "fuse-accumulating-mma"
OPTION = "fuse_mma"     # the LowerOptions field


def run(kernel: ir.KernelIR, placement, log, options=None) -> ir.KernelIR:
    if not common.enabled(options, OPTION):
        return kernel
    for agent in common.consumers(placement):
        body = common.program(kernel, agent)
        new = _fuse(body, kernel, placement, agent, log)
        if new != body:
            kernel = common.with_program(kernel, agent, new)
    return kernel


def _fuse(stmts, kernel, placement, agent, log):
    """Loops and branches first (innermost blocks), then this block."""
    out = []
    for s in stmts:
        if isinstance(s, ir.For):
            s = dataclasses.replace(s, body=_fuse(s.body, kernel, placement, agent, log))
        elif isinstance(s, ir.If):
            s = dataclasses.replace(s, body=_fuse(s.body, kernel, placement, agent, log),
                                    orelse=_fuse(s.orelse, kernel, placement, agent, log))
        elif isinstance(s, ir.RoleBlock):
            s = ir.RoleBlock(s.role, tuple(_nested(s.body, kernel, placement, agent, log)), s.loc)
        out.append(s)
    return _fuse_block(tuple(out), kernel, placement, agent, log)


def _nested(stmts, kernel, placement, agent, log):
    # loops and branches nested inside a role block
    for s in stmts:
        if isinstance(s, (ir.For, ir.If)):
            yield _fuse((s,), kernel, placement, agent, log)[0]
        else:
            yield s


def _fuse_block(stmts, kernel, placement, agent, log):
    refused: set[int] = set()
    while True:
        items = list(leaves(stmts))
        found = None
        for i, s in enumerate(items):
            if id(s) in refused or not _candidate(s):
                continue
            plan = _plan(items, i, kernel, placement)
            if isinstance(plan, str):
                refused.add(id(s))
                log.note(NAME, False, common.where(kernel, agent, s), plan)
                continue
            found = (s, plan)
            break
        if found is None:
            return stmts
        s, (use, other, value) = found
        call = s.value
        log.note(NAME, True, common.where(kernel, agent, s),
                 f"its product is added to an accumulator at line {use.loc.line}: the wgmma "
                 f"accumulates into it (the add becomes a copy)")
        stmts = replace(stmts, {id(s): ir.Assign(s.targets, ir.Call(ir.TileOp.MMA, (call.args[0], call.args[1], other),
                                                                    call.kwargs), s.loc),
                                id(use): ir.Assign(use.targets, value, use.loc)})


def _candidate(s) -> bool:
    return (isinstance(s, ir.Assign) and len(s.targets) == 1 and isinstance(s.value, ir.Call)
            and s.value.op is ir.TileOp.MMA and mma_accumulator(s.value) is None)


def _plan(items, i, kernel, placement):
    """(use statement, E, the product's expression at the use), or why not (rule text)."""
    s = items[i]
    t = s.targets[0]
    alias = {ir.Name(t)}        # expressions holding the product
    handoff = set()             # (pipe, field) carrying it in registers
    use = None
    changed = set()             # names assigned after the mma
    for j in range(i + 1, len(items)):
        x = items[j]
        if isinstance(x, ir.Assign) and x.targets == (t,) and isinstance(x.value, ir.Call) \
                and x.value.op is ir.TileOp.MMA_WAIT and x.value.args[0] == ir.Name(t):
            continue
        if isinstance(x, ir.SlotWrite) and x.value in alias:
            pipe = kernel.sync_object(x.pipe)
            if placement.crosses(pipe):
                return (f"rule 2: the product goes to pipe '{pipe.name}', which leaves the agent "
                        f"(line {x.loc.line})")
            handoff.add((x.pipe, x.field))
            continue
        if isinstance(x, ir.SyncOp) and x.verb is ir.Verb.WAIT and x.target:
            for p, f in handoff:
                if p == x.obj:
                    alias.add(ir.Attr(ir.Name(x.target), f))
        touches = any(e in alias for st in ir.walk([x]) for e in stmt_exprs(st))
        if touches:
            if use is not None:
                return f"rule 2: the product has a second use at line {x.loc.line}"
            if not isinstance(x, ir.Assign) or len(x.targets) != 1:
                return f"rule 3: the product is used at line {x.loc.line}, not added to an accumulator"
            v = x.value
            if not (isinstance(v, ir.BinOp) and v.op == "+" and (v.right in alias) != (v.left in alias)):
                return (f"rule 3: the product is used at line {x.loc.line} as something other than "
                        f"`E + product`")
            other = v.left if v.right in alias else v.right
            if any(e in alias for e in ir.subexprs(other)):
                return f"rule 3: the accumulator at line {x.loc.line} reads the product itself"
            if ir.expr_names(other) & changed:
                return (f"rule 4: {sorted(ir.expr_names(other) & changed)}, read by the accumulator "
                        f"at line {x.loc.line}, change between the mma and the add")
            use = (x, other, v.right if v.right in alias else v.left)
        if use is None:
            changed |= assigned(x)
        if isinstance(x, ir.Assign) and t in x.targets and use is not None:
            break
    if use is None:
        return "rule 2: the product has no use in its block"
    before = {e for x in items[:i] for st in ir.walk([x]) for e in stmt_exprs(st)}
    if before & alias:
        return f"rule 5: `{t}` is read before the mma"
    return use
