"""Checks of ``xs.store(t, offsets, value, reduce="add")`` before any backend renders it.

A reduce-add is complete for a reader only once every producer's adds are synchronized with
the reader: in xsync that is a later kernel launch (no program of a launch waits for another
program; on Hopper the TMA reduce is also asynchronous to its own partition). So, portable
rules (docs/tutorial.md "Reduce-add", docs/verifier.md):

1. A tensor the kernel reduce-adds into is not read by the same kernel (``xs.load``,
   ``xs.load_scalar``): the read would race with the adds of other programs.
2. A tensor is either reduce-added into or stored to by one kernel, never both: a plain store
   and another program's add to one element are unordered.

And per target (its ``Target.reduce_add_dtypes`` / ``reduce_add_deterministic``):

3. The tensor's element type is one the target adds atomically.
4. ``deterministic=True`` only where the target orders the adds (today: the CPU emulator).
5. The role that adds runs on a unit the target adds from (``Target.reduce_add_units``; Ascend:
   the vector cores).
"""
from __future__ import annotations

from xsync.errors import KernelSourceError, UnsupportedError
from xsync.lowering import ir
from xsync.lowering.passes.dataflow import stmt_exprs
from xsync.lowering.placement import Placement

_READS = (ir.TileOp.LOAD, ir.TileOp.LOAD_SCALAR)


def _stores(kernel: ir.KernelIR) -> list[ir.Store]:
    return [s for s in ir.walk(kernel.all_statements()) if isinstance(s, ir.Store)]


def _role_stores(stmts, role=None):
    """(role, store) of every reduce-add below ``stmts``."""
    for s in stmts:
        if isinstance(s, ir.Store) and s.reduce is not None:
            yield role, s
        elif isinstance(s, ir.RoleBlock):
            yield from _role_stores(s.body, s.role)
        elif isinstance(s, ir.For):
            yield from _role_stores(s.body, role)
        elif isinstance(s, ir.If):
            yield from _role_stores(s.body + tuple(s.orelse or ()), role)


def _check_units(kernel: ir.KernelIR, placement: Placement) -> None:
    """Rule 5: the role that reduce-adds runs on a unit the target adds from."""
    target = placement.target
    for role, s in _role_stores(kernel.body):
        agent = placement.agent_of(role)
        if agent.unit not in target.reduce_add_units:
            raise UnsupportedError(
                f"xs.store(..., reduce=\"add\") into `{s.tensor}` in role '{role}', which runs on "
                f"the {agent.hardware} on {target.name}: {target.reduce_add_units_why}",
                loc=s.loc, objects=(s.tensor, role),
                fix=f"reduce-add from a role of kind 'vector': declare one (`red = xs.role(\"reduce\", "
                    f"kind=\"vector\")`), hand it the tile through `xs.pipe(<role '{role}'>, red, "
                    f"stages=2, t=xs.tile(...))` and reduce-add in `with red:`")


def check(kernel: ir.KernelIR, placement: Placement) -> None:
    """Raise on a reduce-add the rules above refuse (placement: the target's facts)."""
    stores = _stores(kernel)
    adds = [s for s in stores if s.reduce is not None]
    if not adds:
        return
    added = {s.tensor: s for s in adds}
    for st in ir.walk(kernel.all_statements()):                                       # rule 1
        for e in stmt_exprs(st):
            if (isinstance(e, ir.Call) and e.op in _READS and e.args
                    and isinstance(e.args[0], ir.Name) and e.args[0].id in added):
                first = added[e.args[0].id]
                raise KernelSourceError(
                    f"`{e.args[0].id}` is reduce-added into (line {first.loc.line}) and read by "
                    f"xs.{e.op} in the same kernel; the adds of other programs are not complete "
                    f"until the launch ends", loc=st.loc, objects=(e.args[0].id,),
                    fix="read the sum in a later kernel launch, or accumulate in registers and "
                        "hand the value over through a pipe")
    for s in stores:                                                                    # rule 2
        if s.reduce is None and s.tensor in added:
            raise KernelSourceError(
                f"`{s.tensor}` is both stored to (line {s.loc.line}) and reduce-added into (line "
                f"{added[s.tensor].loc.line}) by one kernel; a store and another program's add "
                f"to one element are unordered", loc=s.loc, objects=(s.tensor,),
                fix="zero (or initialise) the tensor before the launch, e.g. torch.zeros, and "
                    "only reduce-add into it here")
    target = placement.target
    dtypes = {p.name: p.dtype for p in kernel.params if p.dtype is not None}
    if target.reduce_add_units is not None:
        _check_units(kernel, placement)
    for s in adds:
        dt = dtypes.get(s.tensor)
        if dt is not None and dt.name not in target.reduce_add_dtypes:                  # rule 3
            offered = ", ".join(target.reduce_add_dtypes) or "none"
            into = f"a {target.reduce_add_dtypes[0]} tensor" if target.reduce_add_dtypes else "it on another backend"
            raise UnsupportedError(
                f"xs.store(..., reduce=\"add\") into `{s.tensor}` of {dt.name}: the {target.name} "
                f"backend ({target.reduce_add or 'no reduce-add'}) adds {offered} only",
                loc=s.loc, objects=(s.tensor,),
                fix=f"reduce-add into {into} (an accumulator a later kernel converts) and pass "
                    f"that tensor")
        if s.deterministic and not target.reduce_add_deterministic:                      # rule 4
            raise UnsupportedError(
                f"xs.store(..., reduce=\"add\", deterministic=True) into `{s.tensor}`: the "
                f"{target.name} backend does not order the adds of its programs yet (its "
                f"{target.reduce_add or 'reduce-add'} lands in whatever order the programs run)",
                loc=s.loc, objects=(s.tensor,),
                fix="drop deterministic=True (fp32 sums then vary in their last bits from run to "
                    "run), or use the CPU emulator, which orders them by program id")
