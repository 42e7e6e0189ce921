"""Holding more than one slot of a pipe: the frontend's rules for split counters and
interleaved rings (docs/verifier.md, "Holding several slots").

* **Split counters.** Each side of a pipe keeps two counters, one per verb: the consumer's
  ``waited`` (which slot its next ``wait`` returns) and ``released`` (which slot its next
  ``release`` frees), the producer's ``acquired`` and ``committed``. A consumer may therefore
  wait for slot i + 1 before it releases slot i (CuTeDSL's ``advance_on_wait``); it then holds
  ``waited - released`` slots. Releases free slots in the order they were waited: ``release()``
  frees the oldest held slot, and ``release(slot)`` names it -- naming any other held slot is
  refused here (:func:`check_release_order`), since no backend can free a ring slot out of
  order (an mbarrier phase or an Ascend flag counts completions, not slot names). How many
  slots may be held at once is the verifier's question: more than the ring has is a deadlock
  with a counterexample.
* **Interleaved rings.** ``xs.pipe(src, dst, stages=S, interleave=N)`` between N replicas of
  each role (N -> N paired): the N replica pairs share one ring of S slots with stride N
  (CuTeDSL's ``interleave_stride``), pair r using slots r, r + N, r + 2N, ... . Each pair has
  S / N slots of the ring (its capacity), so S must be a multiple of N. The k-th slot of pair r
  is ring position r + N * (k % (S / N)), phase (k // (S / N)) & 1: every position belongs to
  one pair, so its phases count that pair's slots only (no aliasing between pairs).
"""
from __future__ import annotations

import ast
import dataclasses

from xsync.errors import SlotOrderError
from xsync.lowering import ir
from xsync.lowering.passes import dataflow


def interleave(fe, kw: dict, s, name: str, stages: int, src, dst) -> int:
    """The ``interleave=`` of a pipe declaration (1 when absent), checked."""
    if "interleave" not in kw:
        return 1
    n = fe.const_eval(kw.pop("interleave"), "interleave")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        fe.error(s, f"pipe '{name}' has interleave={n!r}", objects=(name,),
                 fix="interleave is the number of replica pairs sharing the ring: an integer >= 1")
    if n == 1:
        return 1
    if not (src.replicas == dst.replicas == n):
        fe.error(s, f"pipe '{name}' has interleave={n}, but it runs from {src.replicas} replica(s) "
                    f"of '{src.name}' to {dst.replicas} of '{dst.name}'", objects=(name,),
                 fix=(f"interleave shares one ring between the replica pairs of an N -> N pipe: declare "
                      f"both roles with replicas={n}, or drop interleave= (a 1 -> N pipe broadcasts "
                      f"every slot)"))
    if stages % n:
        lo, hi = stages - stages % n, stages + n - stages % n
        fe.error(s, f"pipe '{name}' has stages={stages}, which interleave={n} does not divide: "
                    f"the {n} replica pairs share the ring with stride {n}", objects=(name,),
                 fix=f"use stages={hi}" + (f" or stages={lo}" if lo else "") +
                     f" (a multiple of {n}: each pair gets stages // {n} slots)")
    return n


def release_slot(fe, pipe, call: ast.Call, s) -> str | None:
    """The slot a ``pipe.release(slot)`` names (None for ``release()``), checked."""
    if call.keywords or len(call.args) > 1:
        fe.error(s, f"{ast.unparse(call)}: release takes at most the slot it frees",
                 fix="`pipe.release()` (the oldest slot held) or `pipe.release(slot)`",
                 objects=(pipe.name,))
    if not call.args:
        return None
    a = call.args[0]
    slot = fe.slots.get(a.id) if isinstance(a, ast.Name) else None
    if slot is None or fe.objects[slot[0]].name != pipe.name or slot[1] != "consumer":
        fe.error(s, f"{ast.unparse(call)}: `{ast.unparse(a)}` is not a slot waited from pipe "
                    f"'{pipe.name}'", objects=(pipe.name,),
                 fix=f"name a slot bound by `slot = {ast.unparse(call.func.value)}.wait()`, or "
                     f"call release() to free the oldest slot held")
    return a.id


def check_release_order(kernel: ir.KernelIR) -> None:
    """Refuse a ``release(slot)`` that names a slot other than the oldest one its role holds,
    and a read of a slot's field after the release that freed it (the producer may already be
    refilling it: a race on every backend).

    Walks the kernel once per role with, per pipe, the slot names the role waited and has not
    yet released (oldest first), across all its role blocks; a loop body is walked twice (its
    second iteration starts where the first ended), and where branches or loops leave different
    lists the pipe's order is unknown and its later named releases are not checked. A name
    bound by several held waits means the newest of them. A released name stays released
    until a wait binds it again, on any path that reaches the read."""
    for role in kernel.roles:
        _walk(kernel, kernel.body, _Held({}, {}), role.name, False)


@dataclasses.dataclass
class _Held:
    slots: dict    # pipe -> slot names waited and not yet released, oldest first (None: unknown)
    gone: dict     # slot name -> (pipe, line of the release that freed it), until waited again

    def copy(self) -> "_Held":
        return _Held(dict(self.slots), dict(self.gone))


def _walk(kernel, stmts, held: _Held, role: str, inside: bool) -> _Held:
    for st in stmts:
        if inside:
            _check_reads(kernel, st, held.gone, role)
        if isinstance(st, ir.SyncOp) and inside and isinstance(kernel.sync_object(st.obj), ir.Pipe):
            names = held.slots.get(st.obj, [])
            if st.verb is ir.Verb.WAIT:
                held.gone.pop(st.target, None)
                if names is not None:
                    held.slots[st.obj] = names + [st.target or "?"]
            elif st.verb is ir.Verb.RELEASE and names is not None:
                if st.slot is not None:
                    _check(kernel, st, names)
                freed = st.slot or (names[0] if names else None)
                if freed and freed != "?" and freed not in names[1:]:
                    held.gone[freed] = (st.obj, st.loc.line)
                held.slots[st.obj] = names[1:]
        elif isinstance(st, ir.For):
            once = _walk(kernel, st.body, held.copy(), role, inside)
            twice = _walk(kernel, st.body, once.copy(), role, inside) if once != held else once
            held = _merge(held, once, twice)
        elif isinstance(st, ir.If):
            held = _merge(_walk(kernel, st.body, held.copy(), role, inside),
                          _walk(kernel, st.orelse, held.copy(), role, inside))
        elif isinstance(st, ir.RoleBlock) and st.role == role:
            held = _walk(kernel, st.body, held, role, True)
    return held


def _merge(*states: _Held) -> _Held:
    return _Held(_merge_lists(*(x.slots for x in states)),
                 {k: v for x in states for k, v in x.gone.items()})   # released on some path


def _merge_lists(*states: dict) -> dict:
    keys = set().union(*states)
    return {k: (states[0].get(k, []) if all(x.get(k, []) == states[0].get(k, []) for x in states)
                else None) for k in keys}


def _check_reads(kernel, st, gone: dict, role: str) -> None:
    """A field read of a released slot in ``st`` itself (not the statements inside it)."""
    if not gone:
        return
    for e in dataflow.stmt_exprs(st):
        if isinstance(e, ir.Attr) and isinstance(e.value, ir.Name) and e.value.id in gone:
            name = e.value.id
            pipe, line = gone[name]
            raise SlotOrderError(
                f"`{name}.{e.attr}` reads slot `{name}` of pipe '{pipe}' after its release at line "
                f"{line}: the producer may already be refilling it", loc=st.loc, objects=(pipe, role),
                fix=(f"read every field of `{name}` before releasing it: move the release after this "
                     f"line (releases free the oldest held slot first, so keep the order of waits)"))


def _check(kernel, st: ir.SyncOp, names: list) -> None:
    pipe = kernel.sync_object(st.obj)
    where = [i for i, n in enumerate(names) if n == st.slot]
    if where and where[-1] == 0:
        return
    held = ", ".join(f"`{n}`" + (" (an earlier wait)" if n in names[k + 1:] else "")
                     for k, n in enumerate(names)) or "none"
    if not where:
        what = (f"{st.obj}.release({st.slot}) frees slot `{st.slot}`, which '{pipe.dst}' does not "
                f"hold here (slots held, oldest first: {held})")
    else:
        what = (f"{st.obj}.release({st.slot}) frees slots out of order: `{st.slot}` is the "
                f"{_nth(where[-1])} slot '{pipe.dst}' holds, and releases free the oldest first "
                f"(held, oldest first: {held})")
    why = (f": pipe '{st.obj}' counts waits and releases apart (split counters), so the k-th "
           f"release frees the k-th slot waited")
    if where and names[0] == st.slot:     # the name was bound again while its older slot is held
        fix = (f"`{st.slot}` names the newest of the slots bound to it, since a later "
               f"`{st.slot} = {st.obj}.wait()` rebound it while the older one is still held: give that "
               f"wait a name of its own, or free the oldest slot with `{st.obj}.release()`{why}")
    elif where:
        fix = f"release `{names[0]}` first{why}; reorder the releases or keep the slot longer"
    else:
        fix = (f"`{st.slot}` was released earlier on this path (in a loop: by the iteration before) "
               f"or never waited; rebind it with `{st.slot} = {st.obj}.wait()` before releasing it "
               f"again, or release the oldest held slot" + (f" `{names[0]}`" if names else "") + why)
    raise SlotOrderError(what, loc=st.loc, objects=(st.obj, pipe.dst), fix=fix)


def _nth(i: int) -> str:
    return {0: "oldest", 1: "second oldest", 2: "third oldest"}.get(i, f"{i + 1}th oldest")


def most_held(kernel: ir.KernelIR) -> dict[str, int]:
    """Per pipe, the most slots one consumer holds at once where its role's statements say so
    (waits not yet released, across the role's blocks, loop bodies walked twice); pipes whose
    count is unknown there (branches that differ) are left out. Display only: the verifier
    decides what may be held."""
    out: dict[str, int] = {}

    def visit(stmts, held: dict, role: str, inside: bool) -> dict:
        for st in stmts:
            if isinstance(st, ir.SyncOp) and inside and isinstance(kernel.sync_object(st.obj), ir.Pipe):
                n = held.get(st.obj, 0)
                if n is None or st.verb not in (ir.Verb.WAIT, ir.Verb.RELEASE):
                    continue
                held[st.obj] = max(n + (1 if st.verb is ir.Verb.WAIT else -1), 0)
                out[st.obj] = max(out.get(st.obj, 0), held[st.obj])
            elif isinstance(st, ir.For):
                once = visit(st.body, dict(held), role, inside)
                twice = visit(st.body, dict(once), role, inside) if once != held else once
                held = _merge_lists(held, once, twice)
            elif isinstance(st, ir.If):
                held = _merge_lists(visit(st.body, dict(held), role, inside),
                                    visit(st.orelse, dict(held), role, inside))
            elif isinstance(st, ir.RoleBlock) and st.role == role:
                held = visit(st.body, held, role, True)
        return held

    for role in kernel.roles:
        visit(kernel.body, {}, role.name, False)
    return out


def counter_row(kernel: ir.KernelIR, link, spelled: str, held: dict[str, int]):
    """The allocation row of a pipe's split counters (None for a pipe whose consumer holds one
    slot at a time in a ring of its own: the slot and phase rows already say everything).
    ``spelled``: how the target names the counters."""
    from xsync.lowering.alloc import Row   # alloc imports the skeleton, which imports ir

    n, cap = link.interleave, link.capacity
    most = held.get(link.obj, 1)
    if n == 1 and most <= 1:
        return None
    per = " per replica pair" if n > 1 else ""
    rule = (f"'{link.dst}' holds up to {most} slot(s) at once (waits minus releases); the ring gives "
            f"it {cap}{per}, and the verifier proves the holds fit" if most > 1
            else f"'{link.dst}' holds one slot at a time")
    if n > 1:
        rule += (f"; interleave={n}: the {n} replica pairs share one ring of {link.stages}, pair r "
                 f"takes its k-th slot at r + {n} * (k % {cap}), phase (k // {cap}) & 1")
    return Row(link.obj, "split counters", spelled, rule)
