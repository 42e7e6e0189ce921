"""Verifier: the protocol of a kernel under a placement, for every trip count.

"Accepted" means: for every value of the kernel's free run-time scalars, no interleaving
of the agents deadlocks, the protocol ends with nothing left unconsumed (no committed
slot never waited, no waited slot never released, no signal never waited, no barrier
meeting left incomplete), no commit or release happens without its slot, and no counter
runs further ahead than the target's hardware tells apart (Hopper: an mbarrier or named
barrier two phases ahead of its waiter -- phase aliasing; Ascend: more than 15 sets
pending on a flag -- flag overflow). It does not prove the absence of data races on
payloads, anything about timing or performance, or anything about trip counts that
depend on tensor data in ways the scalars cannot express (see ``xsync.lowering.verifier.candidates``:
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
free scalars: all their candidate values are combined (``xsync.lowering.verifier.candidates``), so
loops bounded by different scalars are checked in every combination. Loops whose body
does not repeat (a nested bound that grows with the counter, a value carried across
iterations, a period beyond 64) are checked up to the same bound with the period taken
as 1, and the report names them as not proven for larger trip counts.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from xsync.errors import ProtocolError, VerifierLimitError, XSyncError
from xsync.lowering import ir
from xsync.lowering.cluster_protocol import cluster_text, expand
from xsync.lowering.placement import Placement
from xsync.lowering.protocol import Skeleton, derive
from xsync.lowering.verifier.candidates import Scalars
from xsync.lowering.verifier.diagnosis import scalar_name
from xsync.lowering.verifier.episodes import EPISODE_TRIPS, episode_loops, tile_loops
from xsync.lowering.verifier.forms import EVALUATION_FAILS, Atom, CutVar, Named, Opaque, free_scalars, to_python, trip
from xsync.lowering.verifier.observations import Assignment
from xsync.lowering.verifier.run import Run
from xsync.lowering.verifier.tables import Leads, Tables
from xsync.lowering.verifier.unroll import COMPILE_AFTER

MAX_RUNS = 4096             # scalar assignments checked at most
MAX_STEPS = 20_000_000      # actions executed at most (then the report says what was not checked)
LOOK_FURTHER = 48           # assignments checked for a worse bug after the first one found
TRACE_TRIAL = 64            # assignments over which tracing must pay (check_scalars)


class Gap(str):
    """One thing a bounded verdict did not cover (the text the report prints), with ``hint``:
    how the kernel's author can help the verifier prove it."""

    hint: str

    def __new__(cls, text: str, hint: str = ""):
        gap = super().__new__(cls, text)
        gap.hint = hint
        return gap

    def __reduce__(self):
        return (Gap, (str(self), self.hint))


SCALARS_HINT = ("let fewer independent run-time scalars decide trip counts and conditions "
                "(compute one from another, or make one a constexpr)")
LOOP_HINT = ("compute the loop's bound before the loop from the kernel's scalars, and compare its "
             "counter only with constants (`i % 8 == 7`, `i > 0`, `i == n - 1`)")
TILE_DATA_HINT = "compute the bound from run-time scalars or xs.load_scalar, not from tile data"
STEPS_HINT = ("verify a smaller specialization (fewer STAGES or replicas, larger blocks) or let "
              "fewer run-time scalars decide trip counts")
FAULT_HINT = ("guard the division (compute the divisor as xs.maximum(d, 1), or test it before the "
              "loop) so that every bound and condition has a value")


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
    episodes: tuple[int, ...] = ()   # loops whose iterations are independent (episodes.episode_loops)
    # episode loops that hold every action: one iteration stands for any number (_check)
    repeated: tuple[int, ...] = ()
    # assignments whose programs were simulated; the others unrolled to programs already run,
    # or to a clean run's programs repeated (repeats_clean). Not part of the verdict.
    simulated: int = field(default=0, compare=False, repr=False)
    # who accepted a verdict that is not proven (the accept_bounded option, as it was set):
    # the summary then says so first
    accepted_by: str = ""
    # named values taken as free integers of their own (Scalars.relax): the runs checked
    # include every run the kernel can make
    relaxed: tuple[str, ...] = ()

    @property
    def proven(self) -> bool:
        """For every trip count and scalar value (not only up to the bounds)."""
        return not self.unproven

    @property
    def status(self) -> str:
        """proven | bounded (not proven, accepted by ``accepted_by``) | not proven."""
        return "proven" if self.proven else "bounded" if self.accepted_by else "not proven"

    def accepted(self, by: str) -> "VerifyReport":
        """This report, a bounded verdict accepted by ``by`` (e.g. ``XSYNC_ACCEPT_BOUNDED=1``)."""
        return replace(self, accepted_by=by)

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
        if self.relaxed:
            out += (f"; {', '.join(self.relaxed)} taken as free values of their own (every value "
                    f"each can take, whatever the other scalars are: more runs than the kernel can make)")
        if self.unproven:
            out += "; not proven beyond the bound: " + "; ".join(self.unproven)
            if self.accepted_by:
                out = f"NOT PROVEN — accepted bounded by {self.accepted_by}: {out}"
        return out


ACCEPT_BOUNDED = ("@xs.kernel(accept_bounded=True), xsync.options(accept_bounded=True), "
                  "XSYNC_ACCEPT_BOUNDED=1 or `xsync check/lower --accept-bounded`")


def not_proven_error(kernel: ir.KernelIR, report: VerifyReport) -> VerifierLimitError:
    """The error for a verdict that is not proven (``report.unproven``): what was not covered,
    how to help the verifier, and the explicit opt-in."""
    gaps = "\n".join(f"- {gap}" + (f" (to help: {gap.hint})" if getattr(gap, "hint", "") else "")
                     for gap in report.unproven)
    hints = list(dict.fromkeys(gap.hint for gap in report.unproven if getattr(gap, "hint", "")))
    return VerifierLimitError(
        f"{kernel.name}: the protocol is not proven on the {report.backend} placement: the "
        f"verifier checked it only up to bounds, not for every trip count and scalar value",
        loc=kernel.loc, report=report,
        details=f"not covered:\n{gaps}\nchecked: {report.summary()}",
        fix="; ".join(hints + [f"or accept the bounded check explicitly (the report then says NOT "
                               f"PROVEN): {ACCEPT_BOUNDED}"]))


def run_time_verdict(lowered) -> str | None:
    """What the verifier said about a kernel that then stalled or ended with synchronization
    left at run time (the emulator's and the simulator's reports), from the compiled kernel's
    lowering (``compiled.lowered``; None where it has none): None where verification was off
    (the caller says so in its own words), else one sentence."""
    if lowered is None:
        return "this compiled kernel carries no verifier verdict"
    report = lowered.report
    if report is None:
        return None
    if report.proven:
        return (f"the verifier proved this kernel's protocol on the {report.backend} placement for "
                f"every trip count and scalar value, so this is outside what it checks or a bug in "
                f"xsync: please report it with this message")
    return (f"the verifier checked this kernel only up to bounds (not proven: "
            f"{'; '.join(report.unproven)}) and it runs because {report.accepted_by} accepted "
            f"that: these run-time values lie beyond what was checked (its VerifierLimitError says "
            f"how to help it prove the kernel)")


# ---------------------------------------------------------------- entry point
def verify(kernel: ir.KernelIR, placement: Placement, skeleton: Skeleton | None = None,
           exhaustive: bool = False) -> VerifyReport:
    """Raise a ProtocolError (DeadlockError, LeftoverError, SlotOrderError,
    PhaseAliasingError, FlagOverflowError) for the worst bug at the smallest scalar values
    that show it; return a report otherwise."""
    # a cluster with a multicast pipe: its programs checked together (cluster_protocol)
    skel = expand(kernel, skeleton or derive(kernel, placement))
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
    # Iteration by iteration (episodes.episode_loops): its body grows with its counter, or its
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
    leads = Leads(skel)
    # Programs that repeat, c times over, programs whose run found nothing at all (every
    # instance runs the same block c times: a persistent tile loop checked for c tiles) are
    # clean as well where the target bounds no lead (docs/verifier.md, "Repeated programs"):
    # not run again, their steps are one per action, as their run would count them.
    repeats = not leads.specs and not exhaustive
    bounds, periods, unproven = loop_bounds(sc, skel)
    unproven = unproven + [Gap(f"{key} depends on tile data: tried as one free value for every "
                               f"evaluation", TILE_DATA_HINT) for key in sorted(sc.opaque)]
    # An episode loop that holds every action (Scalars.repeating_episode): its programs at c
    # iterations are c copies of those at one, the other scalars equal, so by the same
    # argument they are clean where those are. Only 0 and 1 iterations are checked; where
    # that finds a bug the check runs again over every count, so the bug reported is the one
    # the full check reports.
    copies_of = sc.repeating_episode() if repeats and one_copy else None
    found, names, complete, unproven = _assignments(kernel, placement, skel, sc, bounds, periods, unproven, copies_of)
    tables = Tables(skel, sc)
    runs = _Runs(skel, sc, leads, tables, repeats, exhaustive, found)
    complete, unproven = runs.run(found, complete, unproven)
    worst, steps, results, faulted, simulated = runs.worst, runs.steps, runs.results, runs.faulted, runs.simulated
    if worst is not None:
        if copies_of is not None:
            return _check(kernel, placement, skel, sc, exhaustive, one_copy=False)
        if sc.relaxed:
            # a run of the relaxed values: real only where some values of the kernel's own
            # scalars reach a bug
            raise falsify(kernel, placement, skel, sc.episodes_wanted, bounds, periods, exhaustive,
                          smallest=True) or _unrealized(kernel, placement, sc, worst)
        raise worst[1].error(worst)
    if faulted or not found:
        if faulted == len(found):       # (no assignment at all: every combination failed)
            raise VerifierLimitError(
                f"{kernel.name}: a loop bound or branch condition cannot be evaluated for any "
                f"value of the run-time scalars tried (a division or modulo by zero, or a value "
                f"whose definition fails), so no run of the protocol could be checked on the "
                f"{placement.backend} placement",
                loc=kernel.loc,
                fix=FAULT_HINT)
        complete = False
        unproven = unproven + [Gap(f"{faulted} scalar assignment(s) skipped: a loop bound or "
                                   f"condition cannot be evaluated there (a division or modulo by "
                                   f"zero, or a value whose definition fails)", FAULT_HINT)]
    if leads.specs:
        err = _growth(skel, sc, results, leads, bounds, periods, tables)
        if err is not None:
            raise err
    if unproven and not exhaustive:
        # checked only up to bounds: look for a bug among values the smallest ones leave out
        err = falsify(kernel, placement, skel, sc.episodes_wanted, bounds, periods, exhaustive)
        if err is not None:
            raise err
    shown = tuple(cluster_text(skel, scalar_name(n, sc)) for n in names)
    runtime = {o.loop_line for o in sc.observations if o.kind == "trip" and free_scalars(o.form)}
    loops = tuple((ln, cluster_text(skel, sc.loops[ln].key), bounds[ln], periods[ln]) for ln in sorted(bounds)
                  if ln in runtime)
    return VerifyReport(placement.backend, len(found), steps, shown, loops, complete,
                        tuple(unproven), sum(r[2].cross_checked for r in results),
                        tuple(sorted(sc.episodes)),
                        (sc.episode_trip_lines[copies_of],) if copies_of is not None else (), simulated,
                        relaxed=tuple(name for name, _ in sc.relaxed))


def _assignments(kernel, placement, skel, sc: Scalars, bounds, periods, unproven, copies_of, relax=True):
    """(assignments with their observations, the scalars they name, complete, unproven): the
    scalar assignments to check, smallest first (thinned where they are too many)."""
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
    if (found is None or len(found) > MAX_RUNS) and relax:
        # too many combinations: take named values as free integers of their own, largest
        # first, until the candidates combine (a clean verdict is then a proof; a bug found is
        # checked for values that reach it: _check)
        while (found is None or len(found) > MAX_RUNS) and sc.relax() is not None:
            found, names = sc.enumerate(reach, fixed={copies_of: (0, 1)} if copies_of else None)
        if found is not None and copies_of is not None:
            none = {k for k, (a, _) in enumerate(found) if a.get(copies_of) == 0}
            none.discard(min(none, default=None))
            found = [x for k, x in enumerate(found) if k not in none]
    if found is None:
        found, names = _coarse(sc, bounds)
        complete = False
        unproven = unproven + [Gap("the scalar candidates were thinned (too many combinations)",
                                   SCALARS_HINT)]
    if found is None:
        # refused as too many: a bug at values of the kernel's scalars is still worth naming
        err = falsify(kernel, placement, skel, sc.episodes_wanted, bounds, periods, False)
        if err is not None:
            raise err
        scalars = ", ".join(scalar_name(n, sc) for n in names)
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
        unproven = unproven + [Gap(f"only the {MAX_RUNS} smallest scalar assignments were checked",
                                   SCALARS_HINT)]
    return found, names, complete, unproven


class _Runs:
    """The runs of one check's assignments, in order, with what makes them cheap: the
    programs of an assignment looked up by its control decisions, a clean run's programs not
    run again, and programs that repeat a clean run's not run at all."""

    def __init__(self, skel, sc: Scalars, leads: Leads, tables: Tables, repeats: bool, exhaustive: bool, found):
        self.skel, self.sc, self.leads, self.tables = skel, sc, leads, tables
        self.repeats, self.exhaustive = repeats, exhaustive
        self.worst = None          # (severity, run, build) of the worst finding so far
        self.steps = 0
        self.results = []
        self.after = 0             # assignments checked since the first finding
        # Assignments that unroll to the same programs (they differ in a value no sync action
        # depends on) have the same runs: a run that found nothing is not repeated (its steps are
        # counted again, so the report reads as if it had been). Whether the leads were measured
        # changes the steps, so it is part of the key.
        self.clean: dict[tuple, Run] = {}
        self.fully_clean: dict[tuple, set] = {}      # program lengths -> programs of clean runs
        # Programs are interned (programs -> a small id: the keys above hash an id, not every
        # action), and where there are many assignments found by their control decisions
        # (Scalars.tracer: equal decisions, equal programs) -- only a new trace is unrolled.
        # Tracing costs about half an unroll: it stops where, over the first TRACE_TRIAL
        # assignments, fewer than half repeat a trace. None of this changes what is run.
        self.interned: dict[tuple, int] = {}
        self.traced: dict[tuple, tuple] = {}         # trace -> (ids, programs, program id)
        self.repeated: set[int] = set()              # program ids repeats_clean said yes to
        self.trace = sc.tracer() if len(found) > COMPILE_AFTER else None
        self.hits = 0
        self.budget = MAX_STEPS    # actions executed at most
        self.faulted = 0           # assignments where a bound or condition cannot be evaluated
        self.simulated = 0

    def run(self, found, complete, unproven):
        """Run the assignments of ``found`` in order until the worst finding is settled or the
        steps run out: (complete, unproven), updated where the search stopped early."""
        for n_done, (assignment, obs) in enumerate(found):
            # only look for bugs worse than the worst one found (at smaller scalar values), and
            # only among the next LOOK_FURTHER assignments: a hang found soon after a leftover
            # is the one to report
            below = self.worst[0] if self.worst else 4
            got = self.programs(assignment, n_done)
            if got is None:
                continue
            run, found_here = self.run_of(assignment, obs, got, below)
            self.steps += run.steps
            self.results.append((assignment, obs, run))
            if found_here is not None:
                self.worst = found_here
                if self.worst[0] == 0:
                    break
            if self.worst is not None:
                self.after += 1
                if self.after > LOOK_FURTHER:
                    break
            if self.steps > self.budget:
                complete = False
                unproven = unproven + [Gap(f"the search stopped after {self.steps} steps (larger trip "
                                           f"counts were not checked)", STEPS_HINT)]
                break
        return complete, unproven

    def programs(self, assignment, n_done: int):
        """(ids, programs, program id) of ``assignment``, or None where a loop bound or
        condition cannot be evaluated (counted in ``faulted``)."""
        got = None
        if self.trace is not None and n_done == TRACE_TRIAL and 2 * self.hits < n_done:
            self.trace = None
        trace = self.trace
        try:
            if trace is not None:
                decisions = trace(assignment)
                got = self.traced.get(decisions)
                self.hits += got is not None
            if got is None:
                ids = self.sc.unroll(assignment)
                programs = tuple(map(tuple, ids))
                got = (ids, programs, self.interned.setdefault(programs, len(self.interned)))
                if trace is not None:
                    self.traced[decisions] = got
        except EVALUATION_FAILS:
            # a loop bound or condition cannot be evaluated at these values (a division by
            # zero, or it reads a value whose definition failed): no run gets past it there
            self.faulted += 1
            return None
        return got

    def run_of(self, assignment, obs, got, below: int):
        """(the run of the programs ``got``, its finding of severity < ``below`` or None)."""
        ids, programs, pid = got
        key = (pid, below > 1)
        run = self.clean.get(key)
        fully_clean = self.fully_clean
        # fully_clean only grows: a yes stays a yes
        if run is None and self.repeats and (pid in self.repeated or repeats_clean(programs, fully_clean)):
            self.repeated.add(pid)
            run = _Repeated(sum(map(len, programs)))
            found_here = None
            # clean at any threshold: copies of these are clean too
            fully_clean.setdefault(tuple(map(len, programs)), set()).add(programs)
        elif run is None:
            run = Run(self.skel, self.sc, assignment, obs, self.leads, self.tables, ids)
            found_here = run.find(below, self.exhaustive)
            self.simulated += 1
            if found_here is None:
                self.clean[key] = run
                if below == 4:
                    fully_clean.setdefault(tuple(map(len, programs)), set()).add(programs)
        else:
            # the same programs found nothing at a threshold at least as high (the threshold
            # only falls): nothing below this one either
            found_here = None
        return run, found_here


@dataclass(frozen=True)
class _Repeated:
    """The run of programs that repeat a clean run's programs (``repeats_clean``)."""

    steps: int
    cross_checked: int = 0


def repeats_clean(programs: tuple, fully_clean: dict) -> bool:
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


# ---------------------------------------------------------------- bugs beyond the smallest values
FALSIFY_ROUNDS = 4          # random thinnings of the candidate sets tried
FALSIFY_LIMIT = 200_000     # the product of one thinning
FALSIFY_STEPS = 2_000_000   # actions executed at most over all rounds (a tenth of a full check)


def falsify(kernel, placement, skel, episodes: bool, bounds, periods, exhaustive,
            smallest: bool = False) -> ProtocolError | None:
    """A bug at values of the kernel's own scalars (no relaxed value): with ``smallest``, first
    among the smallest values (``_coarse``, for the smallest counterexample), then in a few random
    thinnings of the candidate sets: where the full product is too large, the smallest values
    alone leave out the ones that a bug needs (a window wider than two blocks). Never a proof:
    None where none is found."""
    reach = {ln: b + periods.get(ln, 1) for ln, b in bounds.items()}
    sc = Scalars(kernel, skel, episodes=episodes)
    leads = Leads(skel)
    tables = Tables(skel, sc)
    spent = 0
    for seed in range(-1 if smallest else 0, FALSIFY_ROUNDS):
        if spent >= FALSIFY_STEPS:
            break
        if seed < 0:
            found, _ = _coarse(sc, bounds)
            found = (found or [])[:MAX_RUNS]
        else:
            found, _ = sc.enumerate(reach, limit=FALSIFY_LIMIT, sample=random.Random(seed), keep=MAX_RUNS)
        if not found:
            continue
        runs = _Runs(skel, sc, leads, tables, False, exhaustive, found)
        runs.budget = FALSIFY_STEPS - spent
        runs.run(found, True, [])
        spent += runs.steps
        if runs.worst is not None:
            return runs.worst[1].error(runs.worst)
    return None


def _unrealized(kernel, placement, sc: Scalars, worst) -> VerifierLimitError:
    """Not proven: the relaxed check found a bug that no values tried of the kernel's scalars
    reach."""
    found = worst[1].error(worst)
    relaxed = ", ".join(name for name, _ in sc.relaxed)
    gap = Gap(f"with {relaxed} taken as free values of their own the check finds a run that fails "
              f"({type(found).__name__}: {found.what}), and no values tried of the kernel's scalars "
              f"reach it", SCALARS_HINT)
    return VerifierLimitError(
        f"{kernel.name}: the protocol is not proven on the {placement.backend} placement: its "
        f"run-time scalars are too many to combine, and with some named values taken as free "
        f"values of their own a run fails that may not be reachable",
        loc=kernel.loc, details=f"not covered:\n- {gap}",
        fix=f"{SCALARS_HINT}; or accept the bounded check explicitly: {ACCEPT_BOUNDED}")


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
            # iterations are independent episodes (episodes.episode_loops): one decides
            # deadlock and leftovers, the others leads across iteration boundaries
            bounds[line] = min(bounds[line], EPISODE_TRIPS)
        if not facts.periodic:
            unproven.append(Gap(f"loop at line {line} ({facts.why})", LOOP_HINT))
    return bounds, periods, unproven


def _coarse(sc, bounds):
    """Fewer candidates when the full product is too large (loops up to half their bound)."""
    for shrink in (2, 4, 8, 16):
        found, names = sc.enumerate({ln: max(2, b // shrink) for ln, b in bounds.items()})
        if found is not None:
            return found, names
    return sc.enumerate({ln: 2 for ln in bounds}, limit=10 ** 7)


# ---------------------------------------------------------------- unbounded leads
def _growth(skel, sc: Scalars, results, leads: Leads, bounds, periods, tables) -> XSyncError | None:
    """An unbounded lead: pump each free scalar by one period; if a bounded lead grows, keep
    pumping until it passes the limit (a concrete counterexample)."""
    if not results:
        return None
    free = sc.free()
    for var in free:
        if isinstance(var, tuple) or getattr(var, "kind", "int") in ("pid", "np"):
            continue
        loops = [ln for ln in bounds if _loop_depends(sc, ln, var)]
        if sc.carried:          # a carried value may bound any loop
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
                r = Run(skel, sc, pumped, _pumped_obs(sc, pumped), leads, tables)
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
    for o in sc.observations:
        if o.kind == "trip" and o.loop_line == line and any(var in free_scalars(x) for x in o.form):
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
                return to_python(x.value, var)
            raise TypeError(x)
        try:
            ok = all(bool(eval(to_python(g, var), {})) == pol for g, pol in o.guard)  # noqa: S307
            if not ok:
                out[o] = None
            elif o.kind == "trip":
                s0, s1, s2 = (eval(to_python(x, var), {}) for x in o.form)  # noqa: S307
                out[o] = trip(s0, s1, s2)
            else:
                out[o] = eval(to_python(o.form, var), {})  # noqa: S307
        except Exception:  # noqa: BLE001
            out[o] = None
    return out
