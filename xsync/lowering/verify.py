"""Verifier: the protocol of a kernel under a placement, for every trip count.

"Accepted" means: for every value of the kernel's free run-time scalars, no interleaving
of the agents deadlocks, the protocol ends with nothing left unconsumed (no committed
slot never waited, no waited slot never released, no signal never waited, no barrier
meeting left incomplete), no commit or release happens without its slot, and no counter
runs further ahead than the target's hardware tells apart (Hopper: an mbarrier or named
barrier two phases ahead of its waiter -- phase aliasing; Ascend: more than 15 sets
pending on a flag -- flag overflow). It does not prove the absence of data races on
payloads, anything about timing or performance, or anything about trip counts that
depend on tensor data in ways the scalars cannot express (see ``xsync.lowering.scalars``:
such a bound is assumed to take one value per expression). docs/verifier.md has the
same argument with examples.

How one scalar assignment is checked
-----------------------------------
Each agent instance runs its unrolled list of sync actions. Every action waits only for
counts that other actions raise, and counts only grow: the k-th wait of a consumer
needs the k-th commit of its producer, the k-th acquire needs release k - capacity of
every consumer of its channel, the k-th wait of an event the k-th signal of every source,
meeting m of a barrier the m-th arrival of every member. So an enabled action stays
enabled until its agent takes it: the system is persistent and every maximal interleaving
ends in the same state (confluence). Deadlock and leftovers are therefore decided by one
greedy run, and the largest lead of one counter over another (a signaller over its
waiter) by a run that holds the second one's agent back as long as the others can move
and then lets it take one step at a time. (``verify(..., exhaustive=True)`` also searches
every interleaving of small runs state by state and checks that it agrees.)

Why finitely many trip counts suffice
-------------------------------------
Take a loop L with a run-time trip count n. The body depends on its counter only through
conditions with constant moduli and thresholds (``j % 8 == 7``, ``i > 0``,
``i == n - 1``): after the threshold T (the iterations it takes the counter to pass every
compared constant, at both ends) the body repeats with period P (the lcm of the moduli,
in iterations). Per period every channel either balances (as many commits as waits and
releases, signals as waits, arrivals per member) or not.

* Not balanced: the counts at the end differ by an affine function of the number of
  periods, so they differ -- a leftover, or a wait that can never be satisfied -- for every
  n but at most one per residue modulo P. Two periods past T find it.
* Balanced: take a deadlocked state of a run. Each stuck agent waits for a count that a
  stuck agent has not reached; following that relation gives a cycle of at most I agents
  (I: instances). Along one hop the two agents are at most (capacity of the object on that
  hop, counted in periods) + 1 periods apart, plus the lead one side had when L started
  (bounded by the actions on those objects outside L). So the whole deadlock lies within
  W = C + I + O periods of L, where C is the total capacity of the objects used in L (pipe
  stages -- 1 inside one agent -- plus one per event and barrier) and O counts their
  actions outside L. Removing one period of L outside that window leaves the same
  deadlock (the dependencies are shift-invariant in the periodic part), adding one
  keeps it. So the verdict for n equals the verdict for n - P once n >= T + P * (W + 2):
  checking every n up to that bound, plus one period, covers all n.
* Leads: the largest lead of a counter over another either stops growing (bounded by the
  capacities on the way back from the waiter to the signaller: the verdict repeats as
  above) or grows with n. The second case is an unbounded lead: with no back-pressure the
  signaller can run ahead without limit. On a target whose counters are bounded it is
  reported whatever the trip counts: the verifier pumps the scalar by one period, sees the
  lead grow, and keeps pumping until it passes the limit (n >= 16 for an Ascend flag
  signalled once per iteration), which gives a concrete counterexample.

Nested loops: the argument applies to each loop with the others fixed, so each loop is
checked up to its own bound while the others take all of theirs (the product). Several
free scalars: all their candidate values are combined (``xsync.lowering.scalars``), so
loops bounded by different scalars are checked in every combination. Loops whose body
does not repeat (a nested bound that grows with the counter, a value carried across
iterations, a period beyond 64) are checked up to the same bound with the period taken
as 1, and the report names them as not proven for larger trip counts.
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, field

from xsync.errors import (VerifierLimitError, DeadlockError, LeftoverError, ProtocolError, SlotOrderError,
                          XSyncError)
from xsync.lowering import ir
from xsync.lowering.placement import Placement
from xsync.lowering.protocol import Skeleton, derive
from xsync.lowering.scalars import (COMPILE_AFTER, EPISODE_TRIPS, EVALUATION_FAILS, Assignment, episode_loops,
                                    CutVar, Scalars, Step, tile_loops, trip)
from xsync.lowering.scalars import _free as _free_of

INF = 1 << 60
MAX_STATES = 200_000        # exhaustive cross-check: state cap per run
CROSS_CHECK_STATES = 20_000  # exhaustive cross-check: runs with at most this many states
MAX_RUNS = 4096             # scalar assignments checked at most
MAX_STEPS = 20_000_000      # actions executed at most (then the report says what was not checked)
LOOK_FURTHER = 48           # assignments checked for a worse bug after the first one found
TRACE_TRIAL = 64            # assignments over which tracing must pay (_check)


@dataclass(frozen=True)
class VerifyReport:
    backend: str
    assignments: int            # scalar assignments checked
    states: int                 # actions executed over all runs
    scalars: tuple[str, ...]    # free scalars enumerated
    loops: tuple[tuple[int, str, int, int], ...]   # (line, range text, bound, period)
    complete: bool              # False: some loop is checked only up to its bound
    unproven: tuple[str, ...] = ()
    cross_checked: int = 0      # runs also searched interleaving by interleaving (exhaustive=True)
    episodes: tuple[int, ...] = ()   # loops whose iterations are independent (scalars.episode_loops)
    # episode loops that hold every action: one iteration stands for any number (_check)
    repeated: tuple[int, ...] = ()
    # assignments whose programs were simulated; the others unrolled to programs already run,
    # or to a clean run's programs repeated (_repeats_clean). Not part of the verdict.
    simulated: int = field(default=0, compare=False, repr=False)

    @property
    def trip_values(self) -> tuple[int, ...]:
        return tuple(range(0, max((b for _, _, b, _ in self.loops), default=0) + 1))

    def summary(self) -> str:
        what = "no deadlock, leftover, unpaired slot or counter overflow"
        # an incomplete check must not read as a proof: say which values it covers
        every = "for the values tried of" if self.unproven else "for every value of"
        scal = f"{every} {', '.join(self.scalars)}" if self.scalars else "(no run-time scalar)"
        loops = "; ".join(
            f"the loop at line {ln} `{key}` for any number of iterations, each of them for every "
            f"tile its counter reaches (its iterations are independent and hold every action, so "
            f"one stands for more)" if ln in self.repeated else
            f"the loop at line {ln} `{key}` up to {b} iterations, each of them for every tile "
            f"its counter reaches (its iterations are independent)" if ln in self.episodes else
            f"the loop at line {ln} `{key}` up to {b} iterations, beyond which its "
            f"verdict repeats with period {p}" for ln, key, b, p in self.loops)
        bounded = " up to the bounds below, not for every trip count" if self.unproven else ""
        out = (f"verified for {self.backend}{bounded}: {what} {scal} ({self.assignments} scalar "
               f"assignment(s) checked, {self.states} steps" + (f"; {loops}" if loops else "") + ")")
        if self.unproven:
            out += "; not proven beyond the bound: " + "; ".join(self.unproven)
        return out


# ---------------------------------------------------------------- entry point
def verify(kernel: ir.KernelIR, placement: Placement, skeleton: Skeleton | None = None,
           exhaustive: bool = False) -> VerifyReport:
    """Raise a ProtocolError (DeadlockError, LeftoverError, SlotOrderError,
    PhaseAliasingError, FlagOverflowError) for the worst bug at the smallest scalar values
    that show it; return a report otherwise."""
    skel = skeleton or derive(kernel, placement)
    candidates = episode_loops(skel)
    general = None
    # A persistent tile loop (tile_loops) is checked iteration by iteration first: the
    # general check would combine the program ids with every scalar its tiles read, which
    # it cannot do for every value. Other kernels get the general check first where every
    # candidate loop repeats, the per-iteration one where one does not.
    if not tile_loops(skel, candidates):
        general = Scalars(kernel, skel, episodes=False)
        if not any(not general.loops[ln].periodic for ln in candidates):
            try:
                return _check(kernel, placement, skel, general, exhaustive)
            except VerifierLimitError:
                if not candidates:
                    raise
    # Iteration by iteration (scalars.episode_loops): its body grows with its counter, or its
    # scalars are too many to combine. That check assumes every iteration ends with its
    # channels empty; a kernel that hands slots from one iteration to the next fails it and
    # gets the general check, whose verdict stands where it is complete (where the general
    # check cannot run, or proves only up to its bounds, the per-iteration verdict is
    # reported).
    try:
        return _check(kernel, placement, skel, Scalars(kernel, skel, episodes=True), exhaustive)
    except ProtocolError as per_iteration:
        try:
            report = _check(kernel, placement, skel, general or Scalars(kernel, skel, episodes=False),
                            exhaustive)
        except VerifierLimitError:
            raise per_iteration from None
        if not report.complete:
            # the general check accepts only up to its bounds: the per-iteration finding is a
            # run it has not excluded, so it stands
            raise per_iteration from None
        return report


def _check(kernel, placement, skel, sc: Scalars, exhaustive: bool, one_copy: bool = True) -> VerifyReport:
    leads = _Leads(skel)
    # Programs that repeat, c times over, programs whose run found nothing at all (every
    # instance runs the same block c times: a persistent tile loop checked for c tiles) are
    # clean as well where the target bounds no lead (docs/verifier.md, "Repeated programs"):
    # not run again, their steps are one per action, as their run would count them.
    repeats = not leads.specs and not exhaustive
    bounds, periods, unproven = loop_bounds(sc, skel)
    unproven = unproven + [f"{key} depends on tile data: tried as one free value for every "
                           f"evaluation" for key in sorted(sc.opaque)]
    # An episode loop that holds every action (Scalars.repeating_episode): its programs at c
    # iterations are c copies of those at one, the other scalars equal, so by the same
    # argument they are clean where those are. Only 0 and 1 iterations are checked; where
    # that finds a bug the check runs again over every count, so the bug reported is the one
    # the full check reports.
    copies_of = sc.repeating_episode() if repeats and one_copy else None
    reach = {ln: b + periods[ln] for ln, b in bounds.items()}
    if copies_of is not None:
        reach[sc.episode_trip_lines[copies_of]] = 1
    found, names = sc.enumerate(reach, fixed={copies_of: (0, 1)} if copies_of else None)
    if copies_of is not None and found:
        # at 0 iterations every program is empty, whatever the other scalars: one stands for all
        none = {k for k, (a, _) in enumerate(found) if a.get(copies_of) == 0}
        none.discard(min(none, default=None))
        found = [x for k, x in enumerate(found) if k not in none]
    complete = not unproven
    if found is None:
        found, names = _coarse(sc, bounds)
        complete = False
        unproven = unproven + ["the scalar candidates were thinned (too many combinations)"]
    if found is None:
        scalars = ", ".join(_scalar_name(n, sc) for n in names)
        raise VerifierLimitError(
            f"{kernel.name}: too many combinations of the run-time scalars ({scalars}) to "
            f"verify the protocol on the {placement.backend} placement",
            loc=kernel.loc,
            fix=("let fewer independent scalars decide trip counts and conditions (compute one "
                 "from another, or move a persistent tile loop around the whole kernel so its "
                 "iterations are verified one at a time), or skip the check with "
                 "xsync.options(verify=False) / XSYNC_VERIFY=0 at your own risk"))
    if len(found) > MAX_RUNS:
        found = found[:MAX_RUNS]
        complete = False
        unproven = unproven + [f"only the {MAX_RUNS} smallest scalar assignments were checked"]
    tables = _Tables(skel, sc)
    worst = None          # (severity, run, build) of the worst finding so far
    steps = 0
    results = []
    after = 0             # assignments checked since the first finding
    # Assignments that unroll to the same programs (they differ in a value no sync action
    # depends on) have the same runs: a run that found nothing is not repeated (its steps are
    # counted again, so the report reads as if it had been). Whether the leads were measured
    # changes the steps, so it is part of the key.
    clean: dict[tuple, _Run] = {}
    fully_clean: dict[tuple, set] = {}      # program lengths -> programs of clean runs
    # Programs are interned (programs -> a small id: the keys above hash an id, not every
    # action), and where there are many assignments found by their control decisions
    # (Scalars.tracer: equal decisions, equal programs) -- only a new trace is unrolled.
    # Tracing costs about half an unroll: it stops where, over the first TRACE_TRIAL
    # assignments, fewer than half repeat a trace. None of this changes what is run.
    interned: dict[tuple, int] = {}
    traced: dict[tuple, tuple] = {}         # trace -> (ids, programs, program id)
    repeated: set[int] = set()              # program ids _repeats_clean said yes to
    trace = sc.tracer() if len(found) > COMPILE_AFTER else None
    hits = 0
    faulted = 0           # assignments where a bound or condition cannot be evaluated
    simulated = 0
    for n_done, (assignment, obs) in enumerate(found):
        # only look for bugs worse than the worst one found (at smaller scalar values), and
        # only among the next LOOK_FURTHER assignments: a hang found soon after a leftover
        # is the one to report
        below = worst[0] if worst else 4
        got = None
        if trace is not None and n_done == TRACE_TRIAL and 2 * hits < n_done:
            trace = None
        try:
            if trace is not None:
                decisions = trace(assignment)
                got = traced.get(decisions)
                hits += got is not None
            if got is None:
                ids = sc.unroll(assignment)
                programs = tuple(map(tuple, ids))
                got = (ids, programs, interned.setdefault(programs, len(interned)))
                if trace is not None:
                    traced[decisions] = got
        except EVALUATION_FAILS:
            # a loop bound or condition cannot be evaluated at these values (a division by
            # zero, or it reads a value whose definition failed): no run gets past it there
            faulted += 1
            continue
        ids, programs, pid = got
        key = (pid, below > 1)
        run = clean.get(key)
        # fully_clean only grows: a yes stays a yes
        if run is None and repeats and (pid in repeated or _repeats_clean(programs, fully_clean)):
            repeated.add(pid)
            run = _Repeated(sum(map(len, programs)))
            found_here = None
            # clean at any threshold: copies of these are clean too
            fully_clean.setdefault(tuple(map(len, programs)), set()).add(programs)
        elif run is None:
            run = _Run(skel, sc, assignment, obs, leads, tables, ids)
            found_here = run.find(below, exhaustive)
            simulated += 1
            if found_here is None:
                clean[key] = run
                if below == 4:
                    fully_clean.setdefault(tuple(map(len, programs)), set()).add(programs)
        else:
            # the same programs found nothing at a threshold at least as high (the threshold
            # only falls): nothing below this one either
            found_here = None
        steps += run.steps
        results.append((assignment, obs, run))
        if found_here is not None:
            worst = found_here
            if worst[0] == 0:
                break
        if worst is not None:
            after += 1
            if after > LOOK_FURTHER:
                break
        if steps > MAX_STEPS:
            complete = False
            unproven = unproven + [f"the search stopped after {steps} steps (larger trip counts "
                                   f"were not checked)"]
            break
    if worst is not None:
        if copies_of is not None:
            return _check(kernel, placement, skel, sc, exhaustive, one_copy=False)
        raise worst[1].error(worst)
    if faulted or not found:
        if faulted == len(found):       # (no assignment at all: every combination failed)
            raise VerifierLimitError(
                f"{kernel.name}: a loop bound or branch condition cannot be evaluated for any "
                f"value of the run-time scalars tried (a division or modulo by zero, or a value "
                f"whose definition fails), so no run of the protocol could be checked on the "
                f"{placement.backend} placement",
                loc=kernel.loc,
                fix="guard the division (compute the divisor as xs.maximum(d, 1), or test it "
                    "before the loop) so that every bound and condition has a value")
        complete = False
        unproven = unproven + [f"{faulted} scalar assignment(s) skipped: a loop bound or "
                               f"condition cannot be evaluated there (a division or modulo by "
                               f"zero, or a value whose definition fails)"]
    if leads.specs:
        err = _growth(skel, sc, results, leads, bounds, periods, tables)
        if err is not None:
            raise err
    shown = tuple(_scalar_name(n, sc) for n in names)
    runtime = {o.loop_line for o in sc.observations if o.kind == "trip" and _free_of(o.form)}
    loops = tuple((ln, sc.loops[ln].key, bounds[ln], periods[ln]) for ln in sorted(bounds)
                  if ln in runtime)
    return VerifyReport(placement.backend, len(found), steps, shown, loops, complete,
                        tuple(unproven), sum(r[2].cross_checked for r in results),
                        tuple(sorted(sc.episodes)),
                        (sc.episode_trip_lines[copies_of],) if copies_of is not None else (), simulated)


@dataclass(frozen=True)
class _Repeated:
    """The run of programs that repeat a clean run's programs (``_repeats_clean``)."""

    steps: int
    cross_checked: int = 0


def _repeats_clean(programs: tuple, fully_clean: dict) -> bool:
    """Whether every instance's program is, for one c >= 2, c copies of its program in a run
    that found nothing (no deadlock, leftover or slot out of order; no lead is bounded).

    Such a run ends with every channel balanced: as many commits as waits as releases per
    consumer, acquires as commits, signals as waits per source, arrivals per member. Running
    the clean run's interleaving c times in a row is then an interleaving of the repeated
    programs: in copy r every action waits for the same action of copy r as in the clean
    run (the counts of the copies before balance), or for one of an earlier copy, already
    done. So the repeated programs finish (by confluence every maximal run does), their
    slots pair up copy by copy and they end balanced."""
    lens = [len(p) for p in programs]
    g = math.gcd(*lens)
    for c in _divisors(g):
        clean = fully_clean.get(tuple(n // c for n in lens))
        if not clean:
            continue
        base = tuple(p[:len(p) // c] for p in programs)
        if base in clean and all(p == q * c for p, q in zip(programs, base)):
            return True
    return False


def _divisors(g: int) -> list[int]:
    """The divisors of ``g`` from 2 up, smallest first."""
    out = set()
    d = 1
    while d * d <= g:
        if g % d == 0:
            out |= {d, g // d}
        d += 1
    return sorted(out - {1})


def loop_bounds(sc: Scalars, skel: Skeleton):
    """Per loop line: the trip count beyond which the verdict repeats (T + P * (W + 2), see
    the module docstring), its period, and the loops whose body does not repeat."""
    bounds, periods, unproven = {}, {}, []
    instances = len(skel.instances)
    links = {x.obj: x for x in skel.links}
    for line, facts in sc.loops.items():
        cap = 0
        for obj in facts.objects:
            link = links.get(obj)
            cap += link.capacity if link is not None and link.kind == "pipe" else 1
        outside = sc.outside_actions(line, facts.objects)
        window = cap + instances + outside
        period = facts.period if facts.periodic else 1
        bounds[line] = min(512, 2 * facts.threshold + period * (window + 2))
        periods[line] = period
        if line in sc.episodes:
            # iterations are independent episodes (scalars.episode_loops): one decides
            # deadlock and leftovers, the others leads across iteration boundaries
            bounds[line] = min(bounds[line], EPISODE_TRIPS)
        if not facts.periodic:
            unproven.append(f"loop at line {line} ({facts.why})")
    return bounds, periods, unproven


def _coarse(sc, bounds):
    """Fewer candidates when the full product is too large (loops up to half their bound)."""
    for shrink in (2, 4, 8, 16):
        found, names = sc.enumerate({ln: max(2, b // shrink) for ln, b in bounds.items()})
        if found is not None:
            return found, names
    return sc.enumerate({ln: 2 for ln in bounds}, limit=10 ** 7)


def _scalar_name(n, sc: Scalars | None = None) -> str:
    line = sc.episode_trip_lines.get(getattr(n, "key", None)) if sc is not None else None
    if line is not None:
        return f"the iteration count of the loop at line {line}"
    if isinstance(n, tuple):
        return f"xs.program_id{n[1]}/xs.num_programs{n[1]}"
    if isinstance(n, CutVar):
        return n.name
    return getattr(n, "key", str(n))


def _severity(err: XSyncError) -> int:
    """Which bug to report first: hangs, then counter limits, then order, then leftovers."""
    from xsync.errors import CounterLimitError

    if isinstance(err, DeadlockError):
        return 0
    if isinstance(err, CounterLimitError):
        return 1
    if isinstance(err, SlotOrderError):
        return 2
    return 3


# ---------------------------------------------------------------- leads to bound
@dataclass(frozen=True)
class _Lead:
    """``max(minuends) - subtrahend`` (or min for arrival-counting) must stay <= limit.lead."""

    kind: str                 # "event" | "gather" | "barrier"
    obj: str
    limit: object             # placement.Limit
    minuends: tuple           # counter keys
    subtrahend: tuple         # counter key
    hold: int                 # instance of the subtrahend
    use_min: bool             # pending phases of an arrival-counting mbarrier: min over sources


class _Leads:
    """The leads the target bounds, per skeleton."""

    def __init__(self, skel: Skeleton):
        t = skel.target
        specs = []
        for link in skel.links:
            if link.kind != "event" or not link.crosses:
                continue
            for ch in link.channels:
                for d in ch.consumers:
                    sub = (d, "evwait", link.obj)
                    if t.event_limit is not None:
                        if t.gather_limit is not None or len(ch.producers) == 1:
                            mins = tuple((s, "signal", link.obj) for s in ch.producers)
                            specs.append(_Lead("event", link.obj, t.event_limit, mins, sub,
                                               d.instance, True))
                        else:
                            for s in ch.producers:
                                specs.append(_Lead("event", link.obj, t.event_limit,
                                                   ((s, "signal", link.obj),), sub, d.instance, False))
                if t.gather_limit is not None and len(ch.producers) > 1:
                    for s1 in ch.producers:
                        for s2 in ch.producers:
                            if s1.instance != s2.instance:
                                specs.append(_Lead("gather", link.obj, t.gather_limit,
                                                   ((s1, "signal", link.obj),),
                                                   (s2, "signal", link.obj), s2.instance, False))
        if t.barrier_limit is not None:
            for b in skel.barriers:
                for j1 in b.members:
                    for j2 in b.members:
                        if j1 != j2:
                            specs.append(_Lead("barrier", b.obj, t.barrier_limit,
                                               ((j1, "meet", b.obj),), (j2, "meet", b.obj), j2, False))
        self.specs = tuple(specs)
        self.holds = sorted({s.hold for s in specs})


# ---------------------------------------------------------------- one assignment
class _Tables:
    """Per skeleton: every action's counter and what it waits for, as small integers."""

    def __init__(self, skel: Skeleton, sc: Scalars):
        self.sc = sc
        links = {x.obj: x for x in skel.links}
        bars = {b.obj: b for b in skel.barriers}
        keys: dict[tuple, int] = {}
        self.key_inst: list[int] = []

        def kid(key, inst):
            if key not in keys:
                keys[key] = len(keys)
                self.key_inst.append(inst)
            return keys[key]

        self.kid, self.tpl, self.slot = [], [], []
        for aid, a in enumerate(sc.acts):
            inst = sc.act_inst[aid]
            if a.verb == "meet":
                self.kid.append(kid((inst, "meet", a.obj), inst))
            else:
                self.kid.append(kid((a.endpoint, a.verb, a.obj), a.endpoint.instance))
        for aid, a in enumerate(sc.acts):
            inst = sc.act_inst[aid]
            tpl = ()
            if a.verb == "acquire":
                link = links[a.obj]
                tpl = tuple((kid((d, "release", a.obj), d.instance), d.instance, 1, link.capacity)
                            for d in link.channel_of(a.endpoint).consumers)
            elif a.verb == "wait":
                (p,) = links[a.obj].channel_of(a.endpoint).producers
                tpl = ((kid((p, "commit", a.obj), p.instance), p.instance, 1, 0),)
            elif a.verb == "evwait":
                tpl = tuple((kid((q, "signal", a.obj), q.instance), q.instance, 1, 0)
                            for q in links[a.obj].channel_of(a.endpoint).producers)
            elif a.verb == "meet" and a.waits:
                tpl = tuple((kid((j, "meet", a.obj), j), j, 0, 0) for j in bars[a.obj].members if j != inst)
            self.tpl.append(tpl)
            held = None
            if a.verb in ("acquire", "commit"):
                held = (kid((a.endpoint, "held-acquire", a.obj), inst), 1 if a.verb == "acquire" else -1)
            elif a.verb in ("wait", "release"):
                held = (kid((a.endpoint, "held-wait", a.obj), inst), 1 if a.verb == "wait" else -1)
            self.slot.append(held)
        self.keys = keys
        self.nkeys = len(keys)
        self.meet_key = [k[1] == "meet" for k in keys]
        # Slot order from the positions (``_Run.slot_order``): per held slot (an endpoint's
        # acquire/commit or wait/release of one pipe), the counters that take and give it
        # back. That reading needs every counter's actions to lie in one instance's program
        # (they do: a counter is one endpoint's or, for a meeting, one instance's).
        self.local = all(self.key_inst[self.kid[aid]] == sc.act_inst[aid] for aid in range(len(sc.acts)))
        sides: dict[int, dict[int, int]] = {}
        for aid, held in enumerate(self.slot):
            if held is not None:
                sides.setdefault(held[0], {})[held[1]] = self.kid[aid]
        self.slot_pairs = [(self.key_inst[next(iter(v.values()))], v.get(1), v[-1])
                           for _, v in sorted(sides.items()) if -1 in v]
        # leads the target bounds, as counter ids: (spec, minuend ids, subtrahend id, use_min)
        self.holds: dict[int, list] = {}
        for idx, spec in enumerate(_Leads(skel).specs):
            mins = tuple(kid(m, m[0] if m[1] == "meet" else m[0].instance) for m in spec.minuends)
            sub = kid(spec.subtrahend, spec.hold)
            self.holds.setdefault(spec.hold, []).append(
                (idx, spec, mins, sub, spec.use_min, spec.limit.lead))
        self.nkeys = len(keys)
        self.meet_key = [k[1] == "meet" for k in keys]

    def key(self, key) -> int | None:
        return self.keys.get(key)


class _Run:
    def __init__(self, skel: Skeleton, sc: Scalars, assignment: Assignment, obs: dict,
                 leads: _Leads, tables: _Tables, ids: list[list[int]] | None = None):
        self.skel, self.sc, self.assignment, self.obs, self.leads = skel, sc, assignment, obs, leads
        self.tables = tables
        self.ids: list[list[int]] = sc.unroll(assignment) if ids is None else ids
        self.lens = [len(p) for p in self.ids]
        self.links = {x.obj: x for x in skel.links}
        self.bars = {b.obj: b for b in skel.barriers}
        self.steps = 0
        self._progs = None
        self._max_lead: dict = {}
        self.cross_checked = 0
        # pos[counter] = positions of its actions; occ[i][k] = which occurrence of its counter
        # the k-th action of instance i is (what it waits for follows from these)
        kid = tables.kid
        pos: list[list[int]] = [[] for _ in range(tables.nkeys)]
        occ = []
        for prog in self.ids:
            mine = []
            for k, aid in enumerate(prog):
                at = pos[kid[aid]]
                mine.append(len(at))
                at.append(k)
            occ.append(mine)
        self.pos, self.occ = pos, occ

    def req(self, i, k) -> tuple:
        """(instance j, position t): action k of instance i waits until j has reached t."""
        c, pos = self.occ[i][k], self.pos
        out = []
        for pk, pi, off, shift in self.tables.tpl[self.ids[i][k]]:
            idx = c - shift
            if idx < 0:
                continue
            at = pos[pk]
            out.append((pi, at[idx] + off) if idx < len(at) else (pi, INF))
        return tuple(out)

    @property
    def reqs(self):
        return _Reqs(self)

    @property
    def progs(self) -> list[list[Step]]:
        """Steps with their loop iterations (for messages; unrolled again on demand)."""
        if self._progs is None:
            self._progs = self.sc.unroll(self.assignment, iters=True)
        return self._progs

    def act(self, i, k):
        return self.sc.acts[self.ids[i][k]]

    @property
    def max_lead(self) -> dict:
        return self._max_lead

    # ------------------------------------------------------------ counting
    def count(self, key, state) -> int:
        """Actions of ``key`` done in ``state`` (meetings: arrived, i.e. reached)."""
        kid = self.tables.key(key)
        if kid is None:
            return 0
        at = self.pos[kid]
        if not at:
            return 0
        inst = self.tables.key_inst[kid]
        if key[1] == "meet":
            return bisect_right(at, state[inst]) if state[inst] < self.lens[inst] else len(at)
        return bisect_left(at, state[inst])

    def total(self, key) -> int:
        kid = self.tables.key(key)
        return 0 if kid is None else len(self.pos[kid])

    def enabled(self, i, state) -> bool:
        k = state[i]
        if k >= self.lens[i]:
            return False
        for j, t in self.req(i, k):
            if state[j] < t:
                return False
        return True

    def greedy(self, state: list, hold=None, path=None):
        """Advance every instance except ``hold`` while any can move."""
        self.waiters = [[] for _ in self.ids]
        self.propagate(state, [i for i in range(len(self.ids)) if i != hold], hold, path)
        return state

    def propagate(self, state, work, hold, path):
        """Worklist form of the greedy run: an instance blocked on j is looked at again only
        when j moves (``self.waiters``). Without a path it is ``_propagate``, a copy of this
        loop with the path's bookkeeping left out (the verifier's innermost loop)."""
        lens, waiters, pos, tpl = self.lens, self.waiters, self.pos, self.tables.tpl
        if path is None:
            return self._propagate(state, work, hold)
        while work:
            i = work.pop()
            if i == hold:
                continue
            k, size, ids, occ = state[i], lens[i], self.ids[i], self.occ[i]
            start = k
            while k < size:
                blocked = -1
                for pk, pi, off, shift in tpl[ids[k]]:
                    idx = occ[k] - shift
                    if idx < 0:
                        continue
                    at = pos[pk]
                    if state[pi] < (at[idx] + off if idx < len(at) else INF):
                        blocked = pi
                        break
                if blocked >= 0:
                    waiters[blocked].append(i)
                    break
                path.append((i, k))
                k += 1
                state[i] = k
            if k != start:
                self.steps += k - start
                if waiters[i]:
                    work.extend(waiters[i])
                    waiters[i] = []

    def _propagate(self, state, work, hold):
        """``propagate`` without a path: the same moves in the same order."""
        lens, waiters, pos, tpl = self.lens, self.waiters, self.pos, self.tables.tpl
        steps = 0
        while work:
            i = work.pop()
            if i == hold:
                continue
            k, size, ids, occ = state[i], lens[i], self.ids[i], self.occ[i]
            start = k
            while k < size:
                for pk, pi, off, shift in tpl[ids[k]]:
                    idx = occ[k] - shift
                    if idx < 0:
                        continue
                    at = pos[pk]
                    if state[pi] < (at[idx] + off if idx < len(at) else INF):
                        waiters[pi].append(i)
                        break
                else:
                    k += 1
                    state[i] = k
                    continue
                break
            if k != start:
                steps += k - start
                if waiters[i]:
                    work.extend(waiters[i])
                    waiters[i] = []
        self.steps += steps

    # ------------------------------------------------------------ the check
    def check(self, exhaustive=False) -> XSyncError | None:
        """The worst bug of this assignment, as an error (None: none)."""
        found = self.find(4, exhaustive)
        return None if found is None else self.error(found)

    def find(self, below: int, exhaustive=False):
        """(severity, run, build) of the worst bug of severity < ``below``, or None. The
        message is built only for the finding that gets reported (``error``)."""
        final = self.greedy([0] * len(self.ids))
        if final != self.lens:
            return (0, self, lambda: self.deadlock_error(final))
        if below > 1:
            hit = self.limits()
            if hit is not None:
                return (1, self, lambda: self.limit_error(*hit))
        if below > 2:
            bad = self.slot_order()
            if bad is not None:
                return (2, self, lambda: self.slot_order_error(*bad))
        if below > 3:
            left = self.leftovers(final)
            if left:
                return (3, self, lambda: self.leftover_error(left))
        if exhaustive:
            self.cross_check()
        return None

    def error(self, found) -> XSyncError:
        err = found[2]()
        # the scalar values of the counterexample (free scalar / named value -> value)
        err.scalars = dict(self.assignment.values)
        return err

    def slot_order(self):
        """(instance, position) of a commit without a slot from acquire or a release without a
        slot from wait, or None."""
        if self.tables.local:
            # the j-th give-back (commit, release) needs the j-th take (acquire, wait) before
            # it: the first one without is where a scan of the program would stop
            first = [INF] * len(self.ids)
            pos = self.pos
            for inst, take, give in self.tables.slot_pairs:
                took, gave = (pos[take] if take is not None else ()), pos[give]
                bad = gave[len(took)] if len(gave) > len(took) else INF
                for t, g in zip(took, gave):
                    if g < t:
                        bad = g
                        break
                if bad < first[inst]:
                    first[inst] = bad
            for i, k in enumerate(first):
                if k < INF:
                    return i, k
            return None
        slot = self.tables.slot
        for i, prog in enumerate(self.ids):
            held = [0] * self.tables.nkeys
            for k, aid in enumerate(prog):
                op = slot[aid]
                if op is None:
                    continue
                key, d = op
                if d < 0 and held[key] == 0:
                    return i, k
                held[key] += d
        return None

    def slot_order_error(self, i, k) -> SlotOrderError:
        st = self.progs[i][k]
        a = st.action
        pair = "acquire" if a.verb == "commit" else "wait"
        done = self.total((a.endpoint, pair, a.obj))
        return SlotOrderError(
            f"{a.verb} on pipe '{a.obj}' without a slot from {pair}: "
            f"{self.skel.who(a.endpoint)} holds no slot here",
            loc=a.loc, objects=(a.obj, a.endpoint.role),
            fix=(f"every {a.obj}.{a.verb}() must follow its own "
                 f"{a.obj}.{pair}() in role '{a.endpoint.role}' on the same path "
                 f"(check the loop bounds and branches around both)"),
            details=self.scalar_note() + _iter_note(st)
            + f"{self.skel.who(a.endpoint)} does {done} {pair}(s) of "
              f"'{a.obj}' in all\n")

    # ------------------------------------------------------------ limits
    def limits(self):
        """Largest leads: hold the subtrahend's instance h back; the others run as far as they
        can. A lead only grows while h stands still, so it is measured where h is about to
        take a counted action (or finished), with every other instance at its fixpoint."""
        T = self.tables
        for h in self.leads.holds:
            specs = T.holds[h]
            counted = {sp[3] for sp in specs}
            stops = [k for k, aid in enumerate(self.ids[h]) if T.kid[aid] in counted]
            state = [0] * len(self.ids)
            path: list = []
            size = self.lens[h]
            self.greedy(state, hold=h, path=path)
            for stop in stops + [size]:
                while self.advance(state, h, stop, path):
                    work, self.waiters[h] = self.waiters[h], []
                    self.propagate(state, work, h, path)
                count, best = self.count_kid, self._max_lead
                for idx, spec, mins, sub, use_min, limit in specs:
                    if len(mins) == 1:
                        top = count(mins[0], state)
                    else:
                        counts = [count(k, state) for k in mins]
                        top = min(counts) if use_min else max(counts)
                    lead = top - count(sub, state)
                    if lead > best.get(idx, -INF):
                        best[idx] = lead
                    if lead > limit:
                        return spec, list(state), list(path), lead
                if state[h] < stop or state[h] >= size:
                    break          # h is blocked before the counted action, or finished
        return None

    def advance(self, state, i, stop, path) -> bool:
        """Move instance ``i`` alone up to position ``stop`` (exclusive) while it can."""
        k, moved = state[i], False
        while k < stop:
            for j, t in self.req(i, k):
                if state[j] < t:
                    state[i] = k
                    return moved
            if path is not None:
                path.append((i, k))
            k += 1
            self.steps += 1
            moved = True
        state[i] = k
        return moved

    def count_kid(self, kid, state) -> int:
        at = self.pos[kid]
        if not at:
            return 0
        inst = self.tables.key_inst[kid]
        if self.tables.meet_key[kid]:
            return bisect_right(at, state[inst]) if state[inst] < self.lens[inst] else len(at)
        return bisect_left(at, state[inst])

    def lead(self, s: _Lead, state) -> int:
        counts = [self.count(k, state) for k in s.minuends]
        top = min(counts) if s.use_min else max(counts)
        return top - self.count(s.subtrahend, state)

    # ------------------------------------------------------------ leftovers
    def leftovers(self, state) -> list[tuple]:
        """(object, message, (line, iteration) of the first unconsumed action) at the end."""
        out = []
        label = self.skel.who
        for link in self.skel.links:
            for ch in link.channels:
                if link.kind == "pipe":
                    (p,) = ch.producers
                    c = self.total((p, "commit", link.obj))
                    a = self.total((p, "acquire", link.obj))
                    for d in ch.consumers:
                        w = self.total((d, "wait", link.obj))
                        r = self.total((d, "release", link.obj))
                        if c > w:
                            out.append((link.obj, f"pipe '{link.obj}': {c - w} committed slot(s) never "
                                                  f"waited by {label(d)}", self.site((p, "commit", link.obj), w)))
                        if w > r:
                            out.append((link.obj, f"pipe '{link.obj}': {w - r} slot(s) waited by "
                                                  f"{label(d)} never released (a missing release)",
                                        self.site((d, "wait", link.obj), r)))
                    if a > c:
                        out.append((link.obj, f"pipe '{link.obj}': {a - c} slot(s) acquired by "
                                              f"{label(p)} never committed", self.site((p, "acquire", link.obj), c)))
                else:
                    for d in ch.consumers:
                        w = self.total((d, "evwait", link.obj))
                        for s in ch.producers:
                            n = self.total((s, "signal", link.obj))
                            if n > w:
                                out.append((link.obj, f"event '{link.obj}': {n - w} signal(s) never "
                                                      f"waited by {label(d)} (sent by {label(s)})",
                                            self.site((s, "signal", link.obj), w)))
        for b in self.skel.barriers:
            counts = {j: self.total((j, "meet", b.obj)) for j in b.members}
            if counts and len(set(counts.values())) > 1:
                lo = min(counts.values())
                ahead = [j for j, n in counts.items() if n > lo]
                behind = [j for j, n in counts.items() if n == lo]
                out.append((b.obj, f"barrier '{b.obj}': meeting {lo + 1} is left incomplete: "
                                   f"{', '.join(self.skel.instances[j].label for j in ahead)} arrived "
                                   f"{max(counts.values())} time(s), "
                                   f"{', '.join(self.skel.instances[j].label for j in behind)} {lo}",
                            self.site((ahead[0], "meet", b.obj), lo)))
        return out

    def site(self, key, index):
        """The Step of the index-th action of ``key``."""
        kid = self.tables.key(key)
        if kid is None or index >= len(self.pos[kid]):
            return None
        return self.progs[self.tables.key_inst[kid]][self.pos[kid][index]]

    # ------------------------------------------------------------ messages
    def scalar_note(self) -> str:
        """``with n = 3: loop at line 13 `range(0, n, 1)` runs 3 time(s)``."""
        parts = []
        used = self.used_scalars()
        if used:
            parts.append(", ".join(f"{k} = {v}" for k, v in used))
        loops = []
        for o, v in self.obs.items():
            if o.kind == "trip" and v is not None:
                t = v[0] if isinstance(v, tuple) else v
                facts = self.sc.loops.get(o.loop_line)
                key = facts.key if facts else "?"
                loops.append((o.loop_line, f"loop at line {o.loop_line} `{key}` runs {t} time(s)"))
        for key, kind in sorted(self.sc.opaque.items()):
            v = self.assignment.get(key)
            loops.append((0, f"{key} {'is ' + str(v) if kind == 'bool' else f'= {v}'} (not computable "
                             f"from the scalars: tried as a free value)"))
        text = "; ".join(t for _, t in sorted(set(loops)))
        if not parts and not text:
            return ""
        head = "with " + (parts[0] if parts else "")
        return head + (": " if parts and text else "") + text + "\n"

    def used_scalars(self) -> list[tuple[str, object]]:
        keys = {_scalar_name(n) for n in self.sc.free()}
        out = []
        for k, v in self.assignment.values:
            if k in keys or k.startswith("xs.program_id") or k.startswith("xs.num_programs"):
                if k in self.sc.opaque:
                    continue
                out.append((k, v))
        return out

    def label(self, i) -> str:
        return self.skel.instances[i].label

    def why_blocked(self, i, state) -> str:
        a = self.progs[i][state[i]].action
        label = self.skel.who
        if a.verb == "acquire":
            link = self.links[a.obj]
            ch = link.channel_of(a.endpoint)
            held = self.count((a.endpoint, "acquire", a.obj), state)
            worst = min(ch.consumers, key=lambda d: self.count((d, "release", a.obj), state))
            rel = self.count((worst, "release", a.obj), state)
            return (f"acquire on pipe '{a.obj}': all {link.capacity} slot(s) in use ({held} acquired, "
                    f"{rel} released by {label(worst)}{self.finished_note(worst.instance, state)})")
        if a.verb == "wait":
            (p,) = self.links[a.obj].channel_of(a.endpoint).producers
            waited = self.count((a.endpoint, "wait", a.obj), state)
            committed = self.count((p, "commit", a.obj), state)
            return (f"wait on pipe '{a.obj}': slot {waited} not committed yet ({committed} committed by "
                    f"{label(p)}{self.finished_note(p.instance, state)})")
        if a.verb == "evwait":
            ch = self.links[a.obj].channel_of(a.endpoint)
            waited = self.count((a.endpoint, "evwait", a.obj), state)
            late = [s for s in ch.producers if self.count((s, "signal", a.obj), state) <= waited]
            sent = ", ".join(f"{self.count((s, 'signal', a.obj), state)} sent by {label(s)}"
                             f"{self.finished_note(s.instance, state)}" for s in late)
            return f"wait on event '{a.obj}': signal {waited + 1} not sent yet ({sent})"
        if a.verb == "meet":
            mine = self.count((i, "meet", a.obj), state)
            late = [j for j in self.bars[a.obj].members
                    if j != i and self.count((j, "meet", a.obj), state) < mine]
            verb = "sync" if a.waits else "arrive"
            return (f"{verb} on barrier '{a.obj}' (meeting {mine}): waiting for "
                    + ", ".join(f"{self.label(j)}{self.finished_note(j, state)}" for j in late))
        return "ready"

    def finished_note(self, j, state) -> str:
        return ", which has finished" if state[j] >= self.lens[j] else ""

    def positions(self, state) -> str:
        width = max(len(i.label) for i in self.skel.instances)
        lines = []
        for i, inst in enumerate(self.skel.instances):
            if state[i] >= self.lens[i]:
                lines.append(f"  {inst.label:<{width}}  finished")
                continue
            st = self.progs[i][state[i]]
            why = self.why_blocked(i, state) if not self.enabled(i, state) else \
                f"ready to {_verb_text(st.action)}"
            lines.append(f"  {inst.label:<{width}}  {st.action.loc}{_iter_note(st, inline=True)}: {why}")
        return "\n".join(lines) + "\n"

    def format_path(self, path) -> str:
        if not path:
            return "  (before any agent moves)\n"
        width = max(len(i.label) for i in self.skel.instances)
        lines = []
        shown = path if len(path) <= 40 else path[:8] + [None] + path[-30:]
        for k, item in enumerate(shown, 1):
            if item is None:
                lines.append(f"  ... ({len(path) - 38} steps)")
                continue
            i, p = item
            st = self.progs[i][p]
            n = k if len(path) <= 40 or k <= 8 else len(path) - (len(shown) - k)
            lines.append(f"  {n:3d}. {self.label(i):<{width}}  {_verb_text(st.action)}"
                         f"   line {st.action.loc.line}{_iter_note(st, inline=True)}")
        return "\n".join(lines) + "\n"

    def notes(self, objects) -> str:
        notes = self.skel.notes_for(objects)
        return "".join(f"placement: {n}\n" for n in notes)

    # ------------------------------------------------------------ errors
    def deadlock_error(self, final) -> DeadlockError:
        path: list = []
        state = self.greedy([0] * len(self.ids), path=path)
        stuck = [i for i in range(len(self.ids)) if state[i] < self.lens[i]]
        culprit, fix, objects = _diagnose(self, state, stuck)
        a = self.progs[culprit][state[culprit]].action
        roles = sorted({self.progs[i][state[i]].action.endpoint.role for i in stuck})
        objs = sorted({self.progs[i][state[i]].action.obj for i in stuck} | set(objects))
        err = DeadlockError(
            f"deadlock on the {self.skel.backend} placement: "
            f"{', '.join(self.label(i) for i in stuck)} wait(s) forever",
            loc=a.loc, objects=tuple(roles + objs), fix=fix,
            details=(self.scalar_note() + self.notes(roles + objs)
                     + f"shortest interleaving ({len(path)} steps):\n" + self.format_path(path)
                     + "then:\n" + self.positions(state)))
        err.counterexample = Counterexample.of(self, state, path)
        return err

    def leftover_error(self, left) -> LeftoverError:
        obj, what, st = left[0]
        objects = sorted({o for o, _, _ in left})
        where = ""
        loc = self.skel_loc(obj)
        if st is not None:
            where = f"the first one: line {st.action.loc.line}{_iter_note(st, inline=True)}\n"
        fix = _leftover_fix(self, left)
        path: list = []
        self.greedy([0] * len(self.ids), path=path)
        return LeftoverError(
            "the protocol ends with unconsumed synchronization: " + what,
            loc=loc, objects=tuple(objects), fix=fix,
            details=(self.scalar_note() + where + "".join(w + "\n" for _, w, _ in left[1:])
                     + self.notes(objects)
                     + f"an interleaving that ends this way ({len(path)} steps):\n"
                     + self.format_path(path)))

    def skel_loc(self, obj):
        for x in self.skel.links:
            if x.obj == obj:
                return x.loc
        return self.skel.barrier(obj).loc

    def limit_error(self, s: _Lead, state, path, lead) -> XSyncError:
        limit = s.limit
        label = self.skel.who
        if s.kind == "event":
            who = ", ".join(label(k[0]) for k in s.minuends)
            waiter = label(s.subtrahend[0])
            what = (f"event '{s.obj}' has {lead} {limit.unit} pending for {waiter} (signalled by "
                    f"{who}); {limit.why}")
        elif s.kind == "gather":
            what = (f"event '{s.obj}': {label(s.minuends[0][0])} signals {lead} time(s) more than "
                    f"{label(s.subtrahend[0])}; {limit.why}")
        else:
            what = (f"a member of barrier '{s.obj}' ({self.label(s.minuends[0][0])}) arrives {lead} "
                    f"meeting(s) ahead of {self.label(s.subtrahend[0])}; {limit.why}")
        obj_loc = self.skel_loc(s.obj)
        fix = ("add back-pressure: an event in the other direction, or a pipe with stages so the "
               "signaller waits for a free slot" if s.kind != "barrier" else
               f"use {s.obj}.sync() (which waits) instead of arrive() in the member that runs "
               f"ahead, or add back-pressure from the member that lags")
        err = limit.error(f"{limit.kind} on the {self.skel.backend} placement: {what}",
                          loc=obj_loc, objects=(s.obj,), fix=fix,
                          details=(self.scalar_note() + f"reached after ({len(path)} steps):\n"
                                   + self.format_path(path)))
        return err

    # ------------------------------------------------------------ cross-check
    def cross_check(self):
        """Every interleaving (small runs): one terminal state, the greedy one."""
        n = len(self.ids)
        size = 1
        for k in self.lens:
            size *= k + 1
        if size > CROSS_CHECK_STATES:
            return
        self.cross_checked = 1
        start = tuple([0] * n)
        seen = {start}
        queue = deque([start])
        ends = set()
        while queue:
            st = queue.popleft()
            moved = False
            for i in range(n):
                if self.enabled(i, st):
                    moved = True
                    nxt = st[:i] + (st[i] + 1,) + st[i + 1:]
                    if nxt not in seen:
                        seen.add(nxt)
                        queue.append(nxt)
            if not moved:
                ends.add(st)
            if len(seen) > MAX_STATES:
                return
        assert ends == {tuple(self.lens)}, f"interleavings end in {ends}, greedy in {self.lens}"


class _Reqs:
    """``run.reqs[i][k]``: what action k of instance i waits for (computed on demand)."""

    def __init__(self, run):
        self.run = run

    def __getitem__(self, i):
        run = self.run
        return _ReqRow(run, i)


class _ReqRow:
    def __init__(self, run, i):
        self.run, self.i = run, i

    def __getitem__(self, k):
        return self.run.req(self.i, k)


# ---------------------------------------------------------------- diagnosis
def _diagnose(run: _Run, state, stuck) -> tuple[int, str, list]:
    """(instance to blame, fix, extra objects) for a deadlocked state."""
    skel = run.skel
    # 1. a wait for a partner action that never comes (the other side ran out)
    for i in stuck:
        a = run.progs[i][state[i]].action
        never = [(j, t) for j, t in run.reqs[i][state[i]] if t >= INF]
        if not never:
            continue
        ch = run.links[a.obj].channel_of(a.endpoint) if a.obj in run.links else None
        c = run.count((a.endpoint, a.verb, a.obj), state) if ch is not None else 0
        if a.verb == "acquire":
            link = run.links[a.obj]
            for d in ch.consumers:
                w, r = run.total((d, "wait", a.obj)), run.total((d, "release", a.obj))
                if w > r:
                    return i, _missing_release_fix(run, a, d, w, r), []
            short = [d for d in ch.consumers if run.total((d, "release", a.obj)) <= c - link.capacity]
            return i, _trip_fix(run, a, short, "release", "acquires (beyond the free slots)"), []
        if a.verb == "wait":
            return i, _trip_fix(run, a, ch.producers, "commit", "waits"), []
        if a.verb == "evwait":
            short = [q for q in ch.producers if run.total((q, "signal", a.obj)) <= c]
            return i, _trip_fix(run, a, short, "signal", "waits"), []
        if a.verb == "meet":
            bar = a.obj
            return i, (f"every member of barrier '{bar}' must meet it the same number of times: "
                       f"{run.label(i)} meets it more often than "
                       f"{', '.join(run.label(j) for j, _ in never)} (compare the loops and "
                       f"branches around {bar}.sync()/arrive() in each member role)"), []
    # 2. a wait on itself: two roles in one agent, in the wrong order
    for i in stuck:
        a = run.progs[i][state[i]].action
        if any(j == i and state[j] < t for j, t in run.reqs[i][state[i]]):
            return i, _self_wait_fix(run, i, a), []
    # 3. a cycle: slots held and never released, too few stages, or crossed waits
    for i in stuck:
        a = run.progs[i][state[i]].action
        if a.verb != "acquire":
            continue
        link = run.links[a.obj]
        for d in link.channel_of(a.endpoint).consumers:
            held = run.count((d, "wait", a.obj), state) - run.count((d, "release", a.obj), state)
            if held > 0 and state[d.instance] < run.lens[d.instance]:
                w, r = run.total((d, "wait", a.obj)), run.total((d, "release", a.obj))
                if w > r:
                    return i, _missing_release_fix(run, a, d, w, r), []
                if not link.crosses:
                    return i, _one_agent_pipe_fix(run, link), []
                return i, (f"'{d.role}' holds {held} slot(s) of pipe '{a.obj}' and waits for "
                           f"another before it releases one, while '{a.endpoint.role}' needs a "
                           f"free slot to commit it: release each slot as soon as it is read, or "
                           f"raise stages to at least {held + 1} (now {link.stages}) so the "
                           f"producer can run that far ahead"), []
    # 4. an arrive that waits on this target (no arrive-only barrier)
    for i in stuck:
        a = run.progs[i][state[i]].action
        if a.verb == "meet" and a.waits and not a.source_waits:
            others = [j for j, t in run.reqs[i][state[i]] if state[j] < t]
            names = ", ".join(run.label(j) for j in others)
            return i, (f"on the {skel.backend} placement {a.obj}.arrive() is {skel.target.barrier}, "
                       f"which waits like {a.obj}.sync(): '{a.endpoint.role}' blocks at line "
                       f"{a.loc.line} until {names} meet the barrier, and they first wait for "
                       f"'{a.endpoint.role}'; call {a.obj}.arrive() after the signals and commits "
                       f"the other members wait for before they meet"), []
    if len(stuck) >= 1:
        return stuck[0], ("the listed agents wait on each other in a cycle; reorder the waits so that "
                          "every signal/commit a role needs is issued before it blocks"), []
    return 0, "", []


def _missing_release_fix(run, a, d, waits, releases) -> str:
    return (f"'{run.skel.replica_name(d)}' waits for {waits} slot(s) of pipe '{a.obj}' and releases "
            f"{releases}: call {a.obj}.release() after every {a.obj}.wait() once the slot is read, on "
            f"every path (check the branches between them)")


def _trip_fix(run, a, others, verb, mine) -> str:
    who = " and ".join(f"'{run.skel.replica_name(e)}'" for e in others) or "the other side"
    me = run.skel.replica_name(a.endpoint)
    done = ", ".join(f"{run.skel.replica_name(e)} {verb}s {run.total((e, verb, a.obj))} time(s)"
                     for e in others)
    return (f"{who} must {verb} as many times as '{me}' {mine} ({done} here): the loops or "
            f"branches around the two sides run different trip counts for these scalar values; "
            f"compute the bound once in unannotated code and loop over it in both roles")


def _self_wait_fix(run, i, a) -> str:
    skel = run.skel
    link = run.links.get(a.obj)
    agent = skel.instances[i].agent
    if link is not None and link.kind == "pipe" and not link.crosses:
        return _one_agent_pipe_fix(run, link)
    if link is not None:
        other = link.src if a.endpoint.role == link.dst else link.dst
        return (f"'{a.endpoint.role}' and '{other}' share agent '{agent}' on the {skel.backend} "
                f"placement, which runs them in source order: '{a.endpoint.role}' waits at line "
                f"{a.loc.line} for '{other}', whose part comes later in the same agent; put the "
                f"block of '{other}' before the block of '{a.endpoint.role}' in the loop")
    return (f"agent '{agent}' waits on itself at line {a.loc.line}: its roles run in source order; "
            f"move the meeting after the work it waits for")


def _one_agent_pipe_fix(run, link) -> str:
    agent = run.skel.instances[link.channels[0].producers[0].instance].agent
    return (f"pipe '{link.obj}' runs from '{link.src}' to '{link.dst}', which share agent '{agent}' "
            f"on the {run.skel.backend} placement: there it holds one value at a time and the agent "
            f"runs its roles in source order, so stages do not help. Let the producer run at most one "
            f"step ahead: put both roles' steps in one shared loop (`for ...: with {link.src}: ... "
            f"{link.obj}.commit()` then `with {link.dst}: ... {link.obj}.wait() ... "
            f"{link.obj}.release()`), and release each slot before the next acquire")


def _leftover_fix(run, left) -> str:
    texts = " ".join(w for _, w, _ in left)
    if "missing release" in texts and "never waited" not in texts:
        return ("release every slot you wait for, on every path: call release() after each wait() "
                "once the slot is read")
    if "left incomplete" in texts:
        return ("every member must meet the barrier as often as the others: compare the loops and "
                "branches around its sync()/arrive() calls")
    return ("make every loop that signals/commits run as many times as the loop that "
            "waits/releases (compute the bound in unannotated code, shared by all roles), and "
            "release every slot you wait for")


def _verb_text(a) -> str:
    if a.verb == "meet":
        return f"{a.obj}.{'sync' if a.waits else 'arrive'}() [{a.endpoint.role}]"
    return {"acquire": f"{a.obj}.acquire()", "commit": f"{a.obj}.commit()",
            "wait": f"{a.obj}.wait()", "release": f"{a.obj}.release()",
            "signal": f"xs.signal({a.obj})", "evwait": f"xs.wait({a.obj})"}[a.verb] + f" [{a.endpoint.role}]"


def _iter_note(step: Step, inline=False) -> str:
    if not step.iters:
        return ""
    it = ", ".join(f"{v}={n}" for v, n in step.iters)
    return f" ({it})" if inline else f"at iteration {it}\n"


# ---------------------------------------------------------------- unbounded leads
def _growth(skel, sc: Scalars, results, leads: _Leads, bounds, periods, tables) -> XSyncError | None:
    """An unbounded lead: pump each free scalar by one period; if a bounded lead grows, keep
    pumping until it passes the limit (a concrete counterexample)."""
    if not results:
        return None
    free = sc.free()
    for var in free:
        if isinstance(var, tuple) or getattr(var, "kind", "int") in ("pid", "np"):
            continue
        loops = [ln for ln in bounds if _loop_depends(sc, ln, var)]
        if sc._carried:          # a carried value may bound any loop
            loops = list(bounds)
        if not loops:
            continue
        period = 1
        for ln in loops:
            period = period * periods[ln] // math.gcd(period, periods[ln])
        delta = max(1, sc.unit(var)) * period
        base = max(results, key=lambda r: _depth(r[1], loops))
        assignment, obs, run = base
        before = dict(run.max_lead)
        for k in range(1, 40):
            pumped = sc.pumped(assignment, var, delta * k)
            try:
                r = _Run(skel, sc, pumped, _pumped_obs(sc, pumped), leads, tables)
            except EVALUATION_FAILS:
                break            # no run at these values (see _check)
            err = r.check()
            if err is not None:
                return err
            after = r.max_lead
            if k == 1 and not any(after.get(i, 0) > before.get(i, 0) for i in range(len(leads.specs))):
                break
    return None


def _loop_depends(sc: Scalars, line, var) -> bool:
    from xsync.lowering.scalars import _free
    for o in sc.observations:
        if o.kind == "trip" and o.loop_line == line and any(var in _free(x) for x in o.form):
            return True
    return False


def _depth(obs, loops) -> int:
    total = 0
    for o, v in obs.items():
        if o.kind == "trip" and o.loop_line in loops and v is not None:
            total += v[0] if isinstance(v, tuple) else v
    return total


def _pumped_obs(sc: Scalars, a: Assignment) -> dict:
    """Observation values of a pumped assignment (for messages)."""
    from xsync.lowering.scalars import _py, Atom, Named, Opaque
    values = dict(a.values)
    out = {}
    for o in sc.observations:
        def var(x):
            if isinstance(x, Atom):
                return repr(values.get(x.key, 0))
            if isinstance(x, CutVar):
                return repr(values.get(x.name, 0))
            if isinstance(x, Opaque):
                return repr(values.get(x.key))
            if isinstance(x, Named):
                return _py(x.value, var)
            raise TypeError(x)
        try:
            ok = all(bool(eval(_py(g, var), {})) == pol for g, pol in o.guard)  # noqa: S307
            if not ok:
                out[o] = None
            elif o.kind == "trip":
                s0, s1, s2 = (eval(_py(x, var), {}) for x in o.form)  # noqa: S307
                out[o] = trip(s0, s1, s2)
            else:
                out[o] = eval(_py(o.form, var), {})  # noqa: S307
        except Exception:  # noqa: BLE001
            out[o] = None
    return out


# ---------------------------------------------------------------- counterexamples
@dataclass(frozen=True)
class CounterexampleStep:
    lane: int
    verb: str                 # acquire commit wait release signal evwait sync arrive
    obj: str
    role: str
    line: int
    iters: tuple[tuple[str, int], ...]
    enabled_by: tuple[int, ...]   # indices of earlier steps that let this one through


@dataclass(frozen=True)
class StuckLane:
    lane: int
    verb: str
    obj: str
    role: str
    line: int
    iters: tuple[tuple[str, int], ...]
    why: str
    waits_on: tuple[int, ...]     # lanes it waits for


@dataclass(frozen=True)
class Counterexample:
    """A deadlock the verifier found, for tools that draw it (``xsync trace``)."""

    backend: str
    lanes: tuple[str, ...]
    lane_info: tuple[str, ...]
    scalars: str
    steps: tuple[CounterexampleStep, ...]
    stuck: tuple[StuckLane, ...]
    finished: tuple[int, ...]

    @staticmethod
    def of(run: _Run, state, path) -> "Counterexample":
        skel = run.skel
        index: dict[tuple, int] = {}
        steps = []
        for n, (i, k) in enumerate(path):
            st = run.progs[i][k]
            a = st.action
            by = []
            for j, t in run.reqs[i][k]:
                src = index.get((j, t - (0 if a.verb == "meet" else 1)))
                if src is not None:
                    by.append(src)
            index[(i, k)] = n
            steps.append(CounterexampleStep(i, _draw_verb(a), a.obj, a.endpoint.role, a.loc.line,
                                            st.iters, tuple(by)))
        stuck = []
        for i in range(len(run.ids)):
            if state[i] >= run.lens[i]:
                continue
            st = run.progs[i][state[i]]
            a = st.action
            waits = tuple(sorted({j for j, t in run.reqs[i][state[i]] if state[j] < t and j != i}))
            stuck.append(StuckLane(i, _draw_verb(a), a.obj, a.endpoint.role, a.loc.line, st.iters,
                                   run.why_blocked(i, state), waits))
        finished = tuple(i for i in range(len(run.ids)) if state[i] >= run.lens[i])
        info = tuple(f"{inst.hardware}: {', '.join(inst.roles)}" for inst in skel.instances)
        return Counterexample(skel.backend, tuple(i.label for i in skel.instances), info,
                              run.scalar_note().strip().removeprefix("with "), tuple(steps),
                              tuple(stuck), finished)


def _draw_verb(a) -> str:
    if a.verb == "meet":
        return "sync" if a.waits else "arrive"
    return a.verb
