"""Verifier: exhaustive interleaving check of the unrolled protocol.

Each agent instance runs its unrolled list of sync actions; a state is the vector of
positions (every counter — commits, releases, signals, arrivals — follows from the
positions). A breadth-first search over all interleavings finds, with the shortest
counterexample:

* deadlock: a state where some agent has not finished and none can move,
* lost signals: the protocol ends with committed slots never waited, waited slots never
  released, or event signals never consumed (the next tile or launch would see them),
* phase aliasing (Hopper): an mbarrier-backed event or barrier running two phases
  ahead of its waiter, which a parity wait cannot tell apart,
* flag overflow (Ascend): more than 15 sets pending on one cross-core flag.

Run-time loop trip counts and branch conditions are enumerated over small values; loops
with the same bound text share a trip count (see ``protocol``).

Why a single schedule can stand for all of them when the state space is large: every
counter is consumed by exactly one endpoint (a consumer has its own wait count, the
producer its own acquire count) and only grows, so an action that is enabled stays
enabled until its agent takes it. Such a system is persistent, hence confluent: every
maximal interleaving ends in the same state and every path to a state has the same
length. Deadlock and leftover signals are therefore decided by one greedy run, and the
largest reachable lead of a signaller over its waiter by the run that holds the waiter
back as long as anything else can move. Small protocols are still searched state by
state (breadth first), which checks the same verdicts independently.
"""
from __future__ import annotations

import itertools
import os
from collections import deque
from dataclasses import dataclass

from xsync.errors import DeadlockError, ProtocolError
from xsync.lowering import ir
from xsync.lowering.placement import Placement
from xsync.lowering.protocol import (Instance, Step, agent_skeleton, binders, instances, symbolic_keys,
                                     unroll)

ASCEND_FLAG_MAX_PENDING = 15
MAX_STATES = 200_000
MAX_ASSIGNMENTS = 48


@dataclass(frozen=True)
class VerifyReport:
    backend: str
    assignments: int      # trip-count / branch assignments explored
    states: int           # distinct states explored in total
    trip_values: tuple[int, ...]
    complete: bool        # False when a state cap cut the search short
    confluent: int = 0    # assignments decided by the one-schedule (confluence) argument

    def summary(self) -> str:
        how = "all interleavings" if self.complete else "interleavings up to the state cap"
        trips = ", ".join(map(str, self.trip_values))
        method = (f"{self.assignments - self.confluent} searched state by state, {self.confluent} "
                  f"by confluence" if self.confluent else "searched state by state")
        return (f"verified for {self.backend}: {how} of {self.assignments} trip-count/branch "
                f"assignment(s) ({method}; run-time trip counts tried: {trips}), "
                f"{self.states} states")


def enabled_verification() -> bool:
    from xsync import config

    return bool(config.current().verify)


def verify(kernel: ir.KernelIR, placement: Placement) -> VerifyReport:
    """Raise ProtocolError/DeadlockError on the first bug; return a report otherwise."""
    insts = instances(placement)
    trees = [agent_skeleton(kernel, inst.roles, inst.replica or 0, inst.serial) for inst in insts]
    bound_by = binders(trees)
    loops, branches = [], []
    for t in trees:
        lo, br = symbolic_keys(t, frozenset(bound_by))
        loops += lo
        branches += br
    loop_keys = sorted({lp.key for lp in loops})
    cond_keys = sorted({b.key for b in branches})
    max_stages = max([p.stages for p in kernel.pipes] + [1])
    trip_values = tuple(range(0, max_stages + 3))
    total_states, count, complete, confluent = 0, 0, True, 0
    worst: ProtocolError | None = None
    for trips, conds in _assignments(loop_keys, cond_keys, trip_values):
        atoms = {name: lp.start + trips[lp.key] * lp.step for name, lp in bound_by.items()
                 if lp.key in trips}
        programs = [unroll(t, trips, conds, atoms) for t in trees]
        try:
            model = _Model(kernel, placement, insts, programs, trips, conds, loops, atoms)
            states, full = model.search()
        except ProtocolError as err:
            # Keep looking: a hang found with other trip counts outranks a leftover signal.
            if worst is None or _severity(err) < _severity(worst):
                worst = err
            if _severity(worst) == 0:
                break
            continue
        total_states += states
        complete &= full
        count += 1
        confluent += model.used_confluence
    if worst is not None:
        raise worst
    return VerifyReport(placement.backend, count, total_states, trip_values, complete, confluent)


@dataclass(frozen=True)
class Counterexample:
    """A deadlock found by the verifier: the model it ran (instances, programs, trip counts),
    the stuck state and the interleaving (instance index, step) that reaches it."""

    model: "_Model"
    state: tuple[int, ...]
    path: tuple


def _key(a) -> tuple:
    return (a.verb, a.obj, a.replica)


def _severity(err: ProtocolError) -> int:
    """Which bug to report first: hangs, then counter limits, then order, then leftovers."""
    if isinstance(err, DeadlockError):
        return 0
    what = err.what
    if what.startswith(("phase aliasing", "flag overflow")):
        return 1
    if "without a slot" in what:
        return 2
    return 3


def _assignments(loop_keys, cond_keys, trip_values):
    """Trip counts per loop key and truth values per condition key, small ones first."""
    bools = (False, True)
    full = list(itertools.product(*([trip_values] * len(loop_keys) + [bools] * len(cond_keys))))
    if len(full) > MAX_ASSIGNMENTS:
        # Keep equal trip counts for all keys, plus each key varied alone.
        chosen = []
        for t in trip_values:
            for b in bools:
                chosen.append(tuple([t] * len(loop_keys) + [b] * len(cond_keys)))
        base = trip_values[min(2, len(trip_values) - 1)]
        for i in range(len(loop_keys)):
            for t in trip_values:
                vals = [base] * len(loop_keys) + [True] * len(cond_keys)
                vals[i] = t
                chosen.append(tuple(vals))
        full = list(dict.fromkeys(chosen))
    for combo in full:
        yield (dict(zip(loop_keys, combo[:len(loop_keys)])),
               dict(zip(cond_keys, combo[len(loop_keys):])))


class _Model:
    def __init__(self, kernel, placement, insts: list[Instance], programs: list[list[Step]],
                 trips, conds, loops, atoms=None):
        self.atoms = atoms or {}
        self.kernel = kernel
        self.placement = placement
        self.insts = insts
        self.programs = programs
        self.trips = trips
        self.conds = conds
        self.loops = loops
        self.backend = placement.backend
        # prefix[i][(verb, obj, replica)][pos] = such actions instance i did before pos
        self.prefix = []
        for prog in programs:
            table: dict[tuple, list[int]] = {}
            for step in prog:
                table.setdefault(_key(step.action), [0] * (len(prog) + 1))
            for key, arr in table.items():
                c = 0
                for pos, step in enumerate(prog):
                    arr[pos] = c
                    if _key(step.action) == key:
                        c += 1
                arr[len(prog)] = c
            self.prefix.append(table)
        # An endpoint is one replica of a role: (instance index, replica index).
        self.by_role: dict[str, list[tuple[int, int]]] = {}
        for i, inst in enumerate(insts):
            for role in inst.roles:
                if role in inst.serial:
                    reps = range(kernel.role(role).replicas)
                else:
                    reps = [inst.replica or 0]
                self.by_role.setdefault(role, []).extend((i, r) for r in reps)
        self._static_checks()

    # ---------------------------------------------------------------- counting
    def count(self, ep, verb, obj, state) -> int:
        i, r = ep
        arr = self.prefix[i].get((verb, obj, r))
        return arr[state[i]] if arr else 0

    def label(self, ep) -> str:
        i, r = ep
        inst = self.insts[i]
        serial = [role for role in inst.serial if (i, r) in self.by_role.get(role, [])]
        return f"{inst.label}:{serial[0]}[{r}]" if serial else inst.label

    def channel(self, obj, ep, side):
        """Endpoints on the other side of ``obj`` for endpoint ep (pairing rules)."""
        src, dst = self.by_role[obj.src], self.by_role[obj.dst]
        if side == "src":  # producer asks: which consumers must release?
            if len(src) == len(dst) and len(src) > 1:
                return [d for d in dst if d[1] == ep[1]]
            return dst
        if len(src) == len(dst) and len(src) > 1:
            return [e for e in src if e[1] == ep[1]]
        return src

    def stages(self, pipe: ir.Pipe) -> int:
        # A pipe inside one agent is a register hand-off: one value at a time.
        return pipe.stages if self.placement.crosses(pipe) else 1

    def blocked_reason(self, i, state) -> str | None:
        """None when instance i can take its next action, else why it waits."""
        step = self.programs[i][state[i]]
        a = step.action
        me = (i, a.replica)
        obj = self.kernel.sync_object(a.obj)
        if a.verb == "acquire":
            held = self.count(me, "acquire", a.obj, state)
            worst = None
            for d in self.channel(obj, me, "src"):
                rel = self.count(d, "release", a.obj, state)
                if held - rel >= self.stages(obj):
                    worst = (d, rel)
            if worst is None:
                return None
            d, rel = worst
            return (f"acquire on pipe '{a.obj}': all {self.stages(obj)} slot(s) in use "
                    f"({held} acquired, {rel} released by {self.label(d)})")
        if a.verb == "wait":
            waited = self.count(me, "wait", a.obj, state)
            (p,) = self.channel(obj, me, "dst")
            committed = self.count(p, "commit", a.obj, state)
            if waited < committed:
                return None
            return (f"wait on pipe '{a.obj}': slot {waited} not committed yet "
                    f"({committed} committed by {self.label(p)})")
        if a.verb == "evwait":
            waited = self.count(me, "evwait", a.obj, state)
            srcs = self.channel(obj, me, "dst")
            signals = min(self.count(s, "signal", a.obj, state) for s in srcs)
            if waited < signals:
                return None
            who = ", ".join(self.label(s) for s in srcs)
            return f"wait on event '{a.obj}': signal {waited + 1} not sent yet ({signals} sent by {who})"
        if a.verb == "bar_wait":
            mine = self.count(me, "bar_arrive", a.obj, state)
            late = [j for j in self._members(obj) if self.count(j, "bar_arrive", a.obj, state) < mine]
            if not late:
                return None
            return (f"sync on barrier '{a.obj}' (meeting {mine}): waiting for "
                    f"{', '.join(self.label(j) for j in late)}")
        return None

    def _members(self, bar: ir.Barrier):
        return [i for r in bar.members for i in self.by_role.get(r, [])]

    # ---------------------------------------------------------------- checks
    def _static_checks(self):
        """Per-agent order errors: commit without acquire, release without wait."""
        for i, prog in enumerate(self.programs):
            held: dict[tuple, int] = {}
            for step in prog:
                a = step.action
                if a.verb in ("acquire", "wait"):
                    held[(a.obj, a.verb, a.replica)] = held.get((a.obj, a.verb, a.replica), 0) + 1
                elif a.verb in ("commit", "release"):
                    pair = "acquire" if a.verb == "commit" else "wait"
                    if held.get((a.obj, pair, a.replica), 0) == 0:
                        raise ProtocolError(
                            f"{a.verb} on pipe '{a.obj}' without a slot from {pair}",
                            loc=a.loc, objects=(a.obj, a.role),
                            fix=f"every {a.verb} must follow its own {a.obj}.{pair}() in role '{a.role}'",
                            details=self._trip_note() + _iter_note(step))
                    held[(a.obj, pair, a.replica)] -= 1

    def _trip_note(self) -> str:
        notes = []
        for key, n in sorted(self.trips.items()):
            line = next((lp.loc.line for lp in self.loops if lp.key == key), "?")
            notes.append(f"loop at line {line} `{key}` runs {n} time(s)")
        notes += [f"so {name} = {value}" for name, value in sorted(self.atoms.items())]
        notes += [f"condition `{k}` is {v}" for k, v in sorted(self.conds.items())]
        return ("with " + "; ".join(notes) + "\n") if notes else ""

    def state_violation(self, state) -> tuple[str, object, str] | None:
        """Backend-specific counter limits (phase aliasing, flag overflow)."""
        for ev in self.kernel.events:
            if not self.placement.crosses(ev):
                continue
            for d in self.by_role[ev.dst]:
                srcs = self.channel(ev, d, "dst")
                pending = min(self.count(s, "signal", ev.name, state) for s in srcs) - \
                    self.count(d, "evwait", ev.name, state)
                if self.backend == "nvidia" and pending >= 2:
                    return ("phase aliasing", ev,
                            f"event '{ev.name}' is signalled twice before {self.label(d)} "
                            f"waits; its mbarrier flips parity twice and the parity wait cannot tell "
                            f"phase k from phase k+2")
                if self.backend == "ascend" and pending > ASCEND_FLAG_MAX_PENDING:
                    return ("flag overflow", ev,
                            f"event '{ev.name}' has {pending} sets pending for "
                            f"{self.label(d)}; an Ascend flag counts at most "
                            f"{ASCEND_FLAG_MAX_PENDING}")
        if self.backend == "nvidia":
            for bar in self.kernel.barriers:
                counts = [self.count(j, "bar_arrive", bar.name, state) for j in self._members(bar)]
                if counts and max(counts) - min(counts) >= 2:
                    return ("phase aliasing", bar,
                            f"a member of barrier '{bar.name}' arrives twice while another has not "
                            f"arrived; a hardware named barrier would mix the two meetings")
        return None

    def leftovers(self, state) -> list[str]:
        out = []
        for p in self.kernel.pipes:
            for d in self.by_role[p.dst]:
                (src,) = self.channel(p, d, "dst")
                c = self.count(src, "commit", p.name, state)
                w = self.count(d, "wait", p.name, state)
                r = self.count(d, "release", p.name, state)
                if c > w:
                    out.append(f"pipe '{p.name}': {c - w} committed slot(s) never waited by "
                               f"{self.label(d)}")
                if w > r:
                    out.append(f"pipe '{p.name}': {w - r} slot(s) waited by {self.label(d)} "
                               f"never released (a missing release)")
            for s in self.by_role[p.src]:
                a = self.count(s, "acquire", p.name, state)
                c = self.count(s, "commit", p.name, state)
                if a > c:
                    out.append(f"pipe '{p.name}': {a - c} slot(s) acquired by {self.label(s)} "
                               f"never committed")
        for ev in self.kernel.events:
            for d in self.by_role[ev.dst]:
                srcs = self.channel(ev, d, "dst")
                sig = min(self.count(s, "signal", ev.name, state) for s in srcs)
                w = self.count(d, "evwait", ev.name, state)
                if sig > w:
                    out.append(f"event '{ev.name}': {sig - w} signal(s) never waited by "
                               f"{self.label(d)}")
        return out

    # ---------------------------------------------------------------- search
    def search(self) -> tuple[int, bool]:
        size = 1
        for prog in self.programs:
            size *= len(prog) + 1
        self.used_confluence = size > MAX_STATES
        if not self.used_confluence:
            return self.search_all()
        return self.search_confluent(), True

    def enabled(self, i, state) -> bool:
        return state[i] < len(self.programs[i]) and self.blocked_reason(i, state) is None

    def run_to_fixpoint(self, state, parent, hold=None):
        """Advance every instance except ``hold`` while any can move (checking limits)."""
        moved = True
        while moved:
            moved = False
            for i in range(len(self.insts)):
                while i != hold and self.enabled(i, state):
                    nxt = state[:i] + (state[i] + 1,) + state[i + 1:]
                    parent.setdefault(nxt, (state, i))
                    state = nxt
                    moved = True
                    violation = self.state_violation(state)
                    if violation:
                        self._raise_violation(state, parent, violation)
        return state

    def search_confluent(self) -> int:
        start = (0,) * len(self.insts)
        ends = tuple(len(p) for p in self.programs)
        # Largest leads: hold each waiting instance back as long as the others can move.
        holds = {i for ev in self.kernel.events if self.placement.crosses(ev)
                 for i, _ in self.by_role[ev.dst]}
        if self.backend == "nvidia":
            holds |= {i for bar in self.kernel.barriers for i, _ in self._members(bar)}
        visited = 0
        for hold in sorted(holds):
            state, parent = start, {start: None}
            while True:
                state = self.run_to_fixpoint(state, parent, hold)
                if not self.enabled(hold, state):
                    break
                nxt = state[:hold] + (state[hold] + 1,) + state[hold + 1:]
                parent.setdefault(nxt, (state, hold))
                state = nxt
            visited += len(parent)
        parent = {start: None}
        final = self.run_to_fixpoint(start, parent)
        if final != ends:
            self._raise_deadlock(final, parent)
        left = self.leftovers(final)
        if left:
            self._raise_leftovers(final, parent, left)
        return visited + len(parent)

    def search_all(self) -> tuple[int, bool]:
        n = len(self.insts)
        start = (0,) * n
        ends = tuple(len(p) for p in self.programs)
        parent = {start: None}
        queue = deque([start])
        while queue:
            state = queue.popleft()
            violation = self.state_violation(state)
            if violation:
                self._raise_violation(state, parent, violation)
            moved = False
            for i in range(n):
                if state[i] >= ends[i] or self.blocked_reason(i, state) is not None:
                    continue
                moved = True
                nxt = state[:i] + (state[i] + 1,) + state[i + 1:]
                if nxt not in parent:
                    parent[nxt] = (state, i)
                    queue.append(nxt)
            if not moved:
                if state == ends:
                    left = self.leftovers(state)
                    if left:
                        self._raise_leftovers(state, parent, left)
                else:
                    self._raise_deadlock(state, parent)
            if len(parent) > MAX_STATES:
                return len(parent), False
        return len(parent), True

    def _path(self, state, parent) -> list[tuple[int, Step]]:
        out = []
        while parent[state] is not None:
            prev, i = parent[state]
            out.append((i, self.programs[i][prev[i]]))
            state = prev
        return out[::-1]

    def _format_path(self, path) -> str:
        if not path:
            return "  (before any agent moves)\n"
        width = max(len(inst.label) for inst in self.insts)
        lines = []
        for k, (i, step) in enumerate(path, 1):
            lines.append(f"  {k:3d}. {self.insts[i].label:<{width}}  {_verb_text(step.action)}"
                         f"   line {step.action.loc.line}{_iter_note(step, inline=True)}")
        return "\n".join(lines) + "\n"

    def _positions(self, state) -> str:
        width = max(len(inst.label) for inst in self.insts)
        lines = []
        for i, inst in enumerate(self.insts):
            prog = self.programs[i]
            if state[i] >= len(prog):
                lines.append(f"  {inst.label:<{width}}  finished")
                continue
            step = prog[state[i]]
            why = self.blocked_reason(i, state) or f"ready to {_verb_text(step.action)}"
            lines.append(f"  {inst.label:<{width}}  {step.action.loc}{_iter_note(step, inline=True)}: {why}")
        return "\n".join(lines) + "\n"

    def _raise_deadlock(self, state, parent):
        path = self._path(state, parent)
        stuck = [i for i in range(len(self.insts)) if state[i] < len(self.programs[i])]
        first = self.programs[stuck[0]][state[stuck[0]]].action
        objs = sorted({self.programs[i][state[i]].action.obj for i in stuck})
        roles = sorted({self.programs[i][state[i]].action.role for i in stuck})
        fix = _deadlock_fix(self, state, stuck)
        err = DeadlockError(
            f"deadlock on the {self.backend} placement: {', '.join(self.insts[i].label for i in stuck)} "
            f"wait(s) forever",
            loc=first.loc, objects=tuple(roles + objs), fix=fix,
            details=(self._trip_note() + f"shortest interleaving ({len(path)} steps):\n"
                     + self._format_path(path) + "then:\n" + self._positions(state)))
        # The counterexample itself, for tools that draw it (xsync trace).
        err.counterexample = Counterexample(self, state, tuple(path))
        raise err

    def _raise_leftovers(self, state, parent, left):
        path = self._path(state, parent)
        obj = self.kernel.sync_object(left[0].split("'")[1])
        raise ProtocolError(
            "the protocol ends with unconsumed synchronization: " + left[0],
            loc=obj.loc, objects=(obj.name,),
            fix=("make every loop that signals/commits run as many times as the loop that "
                 "waits/releases (compute the bound in unannotated code, shared by all roles), "
                 "and release every slot you wait for"),
            details=self._trip_note() + "\n".join(left[1:]) + ("\n" if left[1:] else "")
            + f"an interleaving that ends this way ({len(path)} steps):\n" + self._format_path(path))

    def _raise_violation(self, state, parent, violation):
        kind, obj, what = violation
        path = self._path(state, parent)
        fix = ("add back-pressure: an event in the other direction, or a pipe with stages "
               "so the signaller waits for a free slot")
        raise ProtocolError(f"{kind} on the {self.backend} placement: {what}", loc=obj.loc,
                            objects=(obj.name,), fix=fix,
                            details=self._trip_note() + f"reached after ({len(path)} steps):\n"
                            + self._format_path(path))


def _verb_text(a) -> str:
    return {"acquire": f"{a.obj}.acquire()", "commit": f"{a.obj}.commit()",
            "wait": f"{a.obj}.wait()", "release": f"{a.obj}.release()",
            "signal": f"xs.signal({a.obj})", "evwait": f"xs.wait({a.obj})",
            "bar_arrive": f"{a.obj}.arrive", "bar_wait": f"{a.obj}.sync"}[a.verb] + f" [{a.role}]"


def _iter_note(step: Step, inline=False) -> str:
    if not step.iters:
        return ""
    it = ", ".join(f"{v}={n}" for v, n in step.iters)
    return f" ({it})" if inline else f"at iteration {it}\n"


def _deadlock_fix(model: _Model, state, stuck) -> str:
    verbs = {model.programs[i][state[i]].action.verb for i in stuck}
    for i in stuck:
        a = model.programs[i][state[i]].action
        obj = model.kernel.sync_object(a.obj)
        other = [] if isinstance(obj, ir.Barrier) else \
            model.by_role[obj.dst if a.role == obj.src else obj.src]
        if other and all(state[j] >= len(model.programs[j]) for j, _ in other) and model.trips:
            return (f"'{model.label(other[0])}' finished while '{model.insts[i].label}' still "
                    f"needs it on '{a.obj}': the loops around the two sides run different trip "
                    f"counts; compute the bound once in unannotated code and loop over it in both")
    if len(stuck) == 1:
        i = stuck[0]
        a = model.programs[i][state[i]].action
        obj = model.kernel.sync_object(a.obj)
        if a.verb == "acquire":
            return (f"release the slots of pipe '{a.obj}' in role '{obj.dst}' after reading them, "
                    f"or raise stages")
        if a.verb in ("wait", "evwait"):
            who = obj.src
            return (f"'{who}' must {'commit' if a.verb == 'wait' else 'signal'} as many times as "
                    f"'{obj.dst}' waits; check the loop bounds and branches around both")
    for i in stuck:
        a = model.programs[i][state[i]].action
        if a.verb != "acquire":
            continue
        pipe = model.kernel.sync_object(a.obj)
        for d in model.channel(pipe, (i, a.replica), "src"):
            held = model.count(d, "wait", a.obj, state) - model.count(d, "release", a.obj, state)
            if held > 0 and state[d[0]] < len(model.programs[d[0]]):
                return (f"'{model.label(d)}' still holds {held} slot(s) of pipe '{a.obj}' it waited "
                        f"for and never released, while '{model.insts[i].label}' needs a free slot: "
                        f"call {a.obj}.release() after every {a.obj}.wait() once the slot is read "
                        f"(on every path), or raise stages")
    if verbs == {"acquire"} or "acquire" in verbs:
        return ("a cycle of waits: some consumer never releases, or stages are too few for the "
                "order in which roles wait on each other; release earlier or add stages")
    return ("the listed agents wait on each other in a cycle; reorder the waits so that every "
            "signal/commit a role needs is issued before it blocks")
