"""Every field of an acquired slot is written exactly once before the commit that hands it over.

A commit gives the consumer the whole slot. On Hopper a slot filled by TMA completes when the
copy engine has delivered the bytes its full barrier was armed with: each field's tile once
(expect-tx, derived from the fields; one arm per acquire; for a multicast field the lead CTA's
load counts in every CTA). A field left unwritten on some path never delivers its bytes (the
consumer's wait hangs; on the emulator and Ascend it would read a stale tile), a field written
twice delivers them twice (the transaction count overshoots and a later phase completes early).
Rules, checked per role block on the kernel as written:

1. between ``s = pipe.acquire()`` and the ``pipe.commit()`` that hands ``s`` over (commits hand
   slots over in acquire order), each field of the pipe is written exactly once on every path;
2. a write under an ``if`` counts where the other branch writes the field too; a loop's body is
   walked for its first trip and for the later ones, which start with the slots the trip before
   left open (``s = pipe.acquire()`` at the end of the body names the next trip's slot), and a
   slot that a trip writes and leaves open is refused (it would be written once per trip);
3. a multicast field is written by every program of the cluster alike: the backend, not the
   kernel, picks the program that loads it (the lead CTA on Hopper), so a write routed by hand
   (``if xs.cluster_rank() == 0:``) is rule 2's one-branch write, with that fix.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from xsync.errors import KernelSourceError
from xsync.lowering import ir


@dataclass
class _Open:
    """A slot acquired and not yet committed, with its fields' write counts on this path
    (``key`` names the acquire across the copies each branch of an ``if`` walks)."""
    key: int
    pipe: ir.Pipe
    var: str | None
    loc: ir.SourceLoc
    writes: dict = field(default_factory=dict)      # field -> number of writes
    last: dict = field(default_factory=dict)        # field -> loc of its last write

    def copy(self) -> "_Open":
        return _Open(self.key, self.pipe, self.var, self.loc, dict(self.writes), dict(self.last))


def check(kernel: ir.KernelIR) -> None:
    """Rules 1-3 for every role block of the kernel (a KernelSourceError at the first slip)."""
    keys = itertools.count()
    for st in ir.walk(kernel.body):
        if isinstance(st, ir.RoleBlock):
            _block(kernel, st.body, [], keys)


def _block(kernel, stmts, opened: list, keys) -> list:
    """Walk ``stmts`` with ``opened`` (this path's open slots, oldest first); the slots open after."""
    for s in stmts:
        if isinstance(s, ir.SyncOp) and isinstance(kernel.sync_object(s.obj), ir.Pipe):
            pipe = kernel.sync_object(s.obj)
            if s.verb is ir.Verb.ACQUIRE:
                opened = opened + [_Open(next(keys), pipe, s.target, s.loc)]
            elif s.verb is ir.Verb.COMMIT:
                mine = next((o for o in opened if o.pipe.name == pipe.name), None)
                if mine is not None:
                    _committed(mine, s)
                    opened = [o for o in opened if o is not mine]
        elif isinstance(s, ir.SlotWrite):
            mine = next((o for o in reversed(opened) if o.var == s.slot), None)
            if mine is not None:
                _write(mine, s)
        elif isinstance(s, ir.If):
            body = _block(kernel, s.body, [o.copy() for o in opened], keys)
            orelse = _block(kernel, s.orelse, [o.copy() for o in opened], keys)
            opened = _merge(s, body, orelse)
        elif isinstance(s, ir.For):
            opened = _loop(kernel, s, opened, keys)
        elif isinstance(s, ir.RoleBlock):
            opened = _block(kernel, s.body, opened, keys)
    return opened


def _loop(kernel, s: ir.For, opened: list, keys) -> list:
    """The body walked for its first trip and again for every later one, which starts with the
    slots the trip before left open (a slot variable the body acquires again at its end names
    the new slot there). A slot open on entry to a trip that the trip writes and leaves open
    would be written once per trip (rule 2)."""
    for _ in range(2):
        entry = {o.key: dict(o.writes) for o in opened}
        after = _block(kernel, s.body, [o.copy() for o in opened], keys)
        for o in after:
            grown = [f for f, n in o.writes.items() if o.key in entry and n > entry[o.key].get(f, 0)]
            if grown:
                _refuse(o, grown[0], o.last[grown[0]],
                        f"is written inside the loop over `{s.var}` (line {s.loc.line}), which runs between "
                        f"{o.pipe.name}.acquire() (line {o.loc.line}) and its commit: it would be written once "
                        f"per trip",
                        "write the field once, outside the loop (build the tile in the loop, then write it), "
                        "or acquire and commit the slot inside the loop")
        opened = after
    return opened


def _write(mine: _Open, s: ir.SlotWrite) -> None:
    mine.writes[s.field] = mine.writes.get(s.field, 0) + 1
    if mine.writes[s.field] > 1:
        _refuse(mine, s.field, s.loc,
                f"is written a second time (first at line {mine.last[s.field].line})",
                "write each field of a slot once between acquire and commit (build the tile in a "
                "variable and write it once)")
    mine.last[s.field] = s.loc


def _merge(s: ir.If, body: list, orelse: list) -> list:
    """The open slots after an ``if``: a slot open on both branches must have the same writes on
    both (rule 2); a slot open on one branch only (committed on the other) stays open, as the
    verifier sees it."""
    other = {o.key: o for o in orelse}
    for b in body:
        e = other.get(b.key)
        if e is None:
            continue
        for name in sorted(set(b.writes) | set(e.writes)):
            nb, ne = b.writes.get(name, 0), e.writes.get(name, 0)
            if nb == ne:
                continue
            wrote, branch = (b, "the `else` branch") if nb > ne else (e, "the `if` branch")
            fix = "write it on both branches (the same tile shape), or once before the `if`"
            if b.pipe.field(name).multicast:
                fix += ("; a multicast field is written by every program of the cluster alike and the "
                        "backend picks the one program that loads it (Hopper: the lead CTA's TMA "
                        "multicast, its bytes armed in every CTA): do not route the load to a leader "
                        "by hand")
            _refuse(b, name, wrote.last[name],
                    f"is written under the condition at line {s.loc.line} but not in {branch}: on the "
                    f"path through {branch} the slot is committed without it", fix)
    keys = {o.key for o in body}
    return body + [o for o in orelse if o.key not in keys]


def _committed(o: _Open, commit: ir.SyncOp) -> None:
    missing = [f.name for f in o.pipe.fields if o.writes.get(f.name, 0) == 0]
    if missing:
        slot = o.var or "the slot"
        _refuse(o, missing[0], commit.loc,
                f"is never written between {o.pipe.name}.acquire() (line {o.loc.line}) and this commit"
                + (f" (nor {', '.join(repr(m) for m in missing[1:])})" if len(missing) > 1 else ""),
                f"write every field of the slot before the commit: `{slot}.{missing[0]} = ...`"
                + ("" if o.var else f" (bind the slot: `{slot} = {o.pipe.name}.acquire()`)")
                + "; a field the consumer does not need belongs in another pipe")


def _refuse(o: _Open, name: str, loc: ir.SourceLoc, what: str, fix: str) -> None:
    mc = " (multicast)" if o.pipe.field(name).multicast else ""
    raise KernelSourceError(
        f"field '{name}'{mc} of pipe '{o.pipe.name}' {what}; the commit hands the consumer the whole "
        f"slot, and on Hopper its TMA barrier expects each field's bytes exactly once",
        loc=loc, objects=(o.pipe.name, o.pipe.src), fix=fix)
