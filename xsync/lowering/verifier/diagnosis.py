"""What a finding says: the messages of the verifier's errors (the scalar values, the
interleaving that leads there, where each agent stands and why), the fix each names
(``diagnose``: which agent to blame for a deadlock, and why), and the errors themselves."""
from __future__ import annotations

from xsync.errors import DeadlockError, LeftoverError, SlotOrderError, XSyncError
from xsync.lowering.cluster_protocol import (CLUSTER_FIX, ClusterSkeleton, cluster_blame, cluster_loop_text,
                                             cluster_text)
from xsync.lowering.ir import Verb
from xsync.lowering.verifier.candidates import Scalars
from xsync.lowering.verifier.counterexample import Counterexample
from xsync.lowering.verifier.forms import CutVar
from xsync.lowering.verifier.tables import INF, MEETING, Lead
from xsync.lowering.verifier.unroll import Step


def scalar_name(n, sc: Scalars | None = None) -> str:
    """How a report or message names a free scalar (``n = 3``, the iteration count of a loop)."""
    line = sc.episode_trip_lines.get(getattr(n, "key", None)) if sc is not None else None
    if line is not None:
        return f"the iteration count of the loop at line {line}"
    if isinstance(n, tuple):
        return f"xs.program_id{n[1]}/xs.num_programs{n[1]}"
    if isinstance(n, CutVar):
        return n.name
    return getattr(n, "key", str(n))


# ---------------------------------------------------------------- messages
def slot_order_error(run, i, k) -> SlotOrderError:
    st = run.progs[i][k]
    a = st.action
    pair = Verb.ACQUIRE if a.verb is Verb.COMMIT else Verb.WAIT
    done = run.total((a.endpoint, pair, a.obj))
    return SlotOrderError(
        f"{a.verb} on pipe '{a.obj}' without a slot from {pair}: "
        f"{run.skel.who(a.endpoint)} holds no slot here",
        loc=a.loc, objects=(a.obj, a.endpoint.role),
        fix=(f"every {a.obj}.{a.verb}() must follow its own "
             f"{a.obj}.{pair}() in role '{a.endpoint.role}' on the same path "
             f"(check the loop bounds and branches around both)"),
        details=scalar_note(run, ) + iter_note(st)
        + f"{run.skel.who(a.endpoint)} does {done} {pair}(s) of "
          f"'{a.obj}' in all\n")


def scalar_note(run) -> str:
    """``with n = 3: loop at line 13 `range(0, n, 1)` runs 3 time(s)``."""
    parts = []
    used = used_scalars(run, )
    if used:
        parts.append(", ".join(f"{k} = {v}" for k, v in used))
    loops = []
    for o, v in run.obs.items():
        if o.kind == "trip" and v is not None:
            t = v[0] if isinstance(v, tuple) else v
            facts = run.sc.loops.get(o.loop_line)
            key = cluster_loop_text(run.skel, o.form) or (facts.key if facts else "?")
            loops.append((o.loop_line, f"loop at line {o.loop_line} `{key}` runs {t} time(s)"))
        elif o.kind == "cond" and v is not None and o in run.sc.branches:
            line, cond = run.sc.branches[o]
            loops.append((line, f"`if {cond}` at line {line} is {'true' if v else 'false'}"))
    for key, kind in sorted(run.sc.opaque.items()):
        v = run.assignment.get(key)
        loops.append((0, f"{key} {'is ' + str(v) if kind == 'bool' else f'= {v}'} (not computable "
                         f"from the scalars: tried as a free value)"))
    text = "; ".join(t for _, t in sorted(set(loops)))
    if not parts and not text:
        return ""
    head = "with " + (parts[0] if parts else "")
    return head + (": " if parts and text else "") + text + "\n"


def used_scalars(run) -> list[tuple[str, object]]:
    keys = {scalar_name(n) for n in run.sc.free()}
    out = []
    for k, v in run.assignment.values:
        if k in keys or k.startswith("xs.program_id") or k.startswith("xs.num_programs"):
            if k in run.sc.opaque:
                continue
            out.append((cluster_text(run.skel, k), v))
    return out


def instance_label(run, i) -> str:
    return run.skel.instances[i].label


def why_blocked(run, i, state) -> str:
    a = run.progs[i][state[i]].action
    label = run.skel.who
    if a.verb is Verb.ACQUIRE:
        link = run.links[a.obj]
        ch = link.channel_of(a.endpoint)
        held = run.count((a.endpoint, Verb.ACQUIRE, a.obj), state)
        worst = min(ch.consumers, key=lambda d: run.count((d, Verb.RELEASE, a.obj), state))
        rel = run.count((worst, Verb.RELEASE, a.obj), state)
        return (f"acquire on pipe '{a.obj}': all {link.capacity} slot(s) in use ({held} acquired, "
                f"{rel} released by {label(worst)}{finished_note(run, worst.instance, state)})")
    if a.verb is Verb.WAIT and not a.event:
        prods = run.links[a.obj].channel_of(a.endpoint).producers
        waited = run.count((a.endpoint, Verb.WAIT, a.obj), state)
        late = [p for p in prods if run.count((p, Verb.COMMIT, a.obj), state) <= waited] or prods[:1]
        sent = ", ".join(f"{run.count((p, Verb.COMMIT, a.obj), state)} committed by {label(p)}"
                         f"{finished_note(run, p.instance, state)}" for p in late)
        return f"wait on pipe '{a.obj}': slot {waited} not committed yet ({sent})"
    if a.event_wait:
        ch = run.links[a.obj].channel_of(a.endpoint)
        waited = run.count((a.endpoint, Verb.WAIT, a.obj), state)
        late = [s for s in ch.producers if run.count((s, Verb.SIGNAL, a.obj), state) <= waited]
        sent = ", ".join(f"{run.count((s, Verb.SIGNAL, a.obj), state)} sent by {label(s)}"
                         f"{finished_note(run, s.instance, state)}" for s in late)
        return f"wait on event '{a.obj}': signal {waited + 1} not sent yet ({sent})"
    if a.meeting:
        mine = run.count((i, MEETING, a.obj), state)
        late = [j for j in run.skel.membership(a.obj, i).members
                if j != i and run.count((j, MEETING, a.obj), state) < mine]
        verb = a.verb      # sync, or arrive (which does not wait)
        return (f"{verb} on barrier '{a.obj}' (meeting {mine}): waiting for "
                + ", ".join(f"{instance_label(run, j)}{finished_note(run, j, state)}" for j in late))
    return "ready"


def finished_note(run, j, state) -> str:
    return ", which has finished" if state[j] >= run.lens[j] else ""


def positions_text(run, state) -> str:
    width = max(len(i.label) for i in run.skel.instances)
    lines = []
    for i, inst in enumerate(run.skel.instances):
        if state[i] >= run.lens[i]:
            lines.append(f"  {inst.label:<{width}}  finished")
            continue
        st = run.progs[i][state[i]]
        why = why_blocked(run, i, state) if not run.enabled(i, state) else \
            f"ready to {verb_text(st.action)}"
        lines.append(f"  {inst.label:<{width}}  {st.action.loc}{iter_note(st, inline=True)}: {why}")
    return "\n".join(lines) + "\n"


def format_path(run, path) -> str:
    if not path:
        return "  (before any agent moves)\n"
    width = max(len(i.label) for i in run.skel.instances)
    lines = []
    shown = path if len(path) <= 40 else path[:8] + [None] + path[-30:]
    for k, item in enumerate(shown, 1):
        if item is None:
            lines.append(f"  ... ({len(path) - 38} steps)")
            continue
        i, p = item
        st = run.progs[i][p]
        n = k if len(path) <= 40 or k <= 8 else len(path) - (len(shown) - k)
        lines.append(f"  {n:3d}. {instance_label(run, i):<{width}}  {verb_text(st.action)}"
                     f"   line {st.action.loc.line}{iter_note(st, inline=True)}")
    return "\n".join(lines) + "\n"


def placement_notes(run, objects) -> str:
    notes = run.skel.notes_for(objects)
    return "".join(f"placement: {n}\n" for n in notes)


# ---------------------------------------------------------------- errors
def deadlock_error(run, final) -> DeadlockError:
    path: list = []
    state = run.greedy([0] * len(run.ids), path=path)
    stuck = [i for i in range(len(run.ids)) if state[i] < run.lens[i]]
    culprit, fix, objects = diagnose(run, state, stuck)
    blame = cluster_blame(run, state, stuck)    # a multicast slot between programs of a cluster
    if blame:
        fix = f"{blame}: {CLUSTER_FIX}; {fix}"
    a = run.progs[culprit][state[culprit]].action
    roles = sorted({run.progs[i][state[i]].action.endpoint.role for i in stuck})
    objs = sorted({run.progs[i][state[i]].action.obj for i in stuck} | set(objects))
    err = DeadlockError(
        f"deadlock on the {run.skel.backend} placement: "
        f"{', '.join(instance_label(run, i) for i in stuck)} wait(s) forever",
        loc=a.loc, objects=tuple(roles + objs), fix=fix,
        details=(scalar_note(run, ) + (f"cluster: {blame}\n" if blame else "") + placement_notes(run, roles + objs)
                 + f"shortest interleaving ({len(path)} steps):\n" + format_path(run, path)
                 + "then:\n" + positions_text(run, state)))
    err.counterexample = Counterexample.of(run, state, path, lambda i: why_blocked(run, i, state),
                                            scalar_note(run))
    return err


def leftover_error(run, left) -> LeftoverError:
    obj, what, st = left[0]
    objects = sorted({o for o, _, _ in left})
    where = ""
    loc = object_loc(run, obj)
    if st is not None:
        where = f"the first one: line {st.action.loc.line}{iter_note(st, inline=True)}\n"
    fix = _leftover_fix(run, left)
    if _programs_differ(run, left):
        fix = f"{CLUSTER_FIX}; {fix}"     # a cluster's programs run its multicast pipes in step
    path: list = []
    run.greedy([0] * len(run.ids), path=path)
    return LeftoverError(
        "the protocol ends with unconsumed synchronization: " + what,
        loc=loc, objects=tuple(objects), fix=fix,
        details=(scalar_note(run, ) + where + "".join(w + "\n" for _, w, _ in left[1:])
                 + placement_notes(run, objects)
                 + f"an interleaving that ends this way ({len(path)} steps):\n"
                 + format_path(run, path)))


def _programs_differ(run, left) -> bool:
    """Whether the programs of a cluster commit, wait or release a multicast pipe that is left
    with slots over different numbers of times."""
    skel = run.skel
    if not isinstance(skel, ClusterSkeleton):
        return False
    for obj in {o for o, _, _ in left if o in skel.multicast}:
        link = run.links[obj]
        for verb in (Verb.COMMIT, Verb.WAIT, Verb.RELEASE):
            counts: dict = {}
            for ch in link.channels:
                for e in (ch.producers if verb is Verb.COMMIT else ch.consumers):
                    p = skel.program_of(e.instance)
                    counts[p] = counts.get(p, 0) + run.total((e, verb, obj))
            if len(set(counts.values())) > 1:
                return True
    return False


def object_loc(run, obj):
    for x in run.skel.links:
        if x.obj == obj:
            return x.loc
    return run.skel.barrier(obj).loc


def limit_error(run, s: Lead, state, path, lead) -> XSyncError:
    limit = s.limit
    label = run.skel.who
    if s.kind == "event":
        who = ", ".join(label(k[0]) for k in s.minuends)
        waiter = label(s.subtrahend[0])
        what = (f"event '{s.obj}' has {lead} {limit.unit} pending for {waiter} (signalled by "
                f"{who}); {limit.why}")
    elif s.kind == "gather":
        what = (f"event '{s.obj}': {label(s.minuends[0][0])} signals {lead} time(s) more than "
                f"{label(s.subtrahend[0])}; {limit.why}")
    else:
        what = (f"a member of barrier '{s.obj}' ({instance_label(run, s.minuends[0][0])}) arrives {lead} "
                f"meeting(s) ahead of {instance_label(run, s.subtrahend[0])}; {limit.why}")
    obj_loc = object_loc(run, s.obj)
    fix = ("add back-pressure: an event in the other direction, or a pipe with stages so the "
           "signaller waits for a free slot" if s.kind != "barrier" else
           f"use {s.obj}.sync() (which waits) instead of arrive() in the member that runs "
           f"ahead, or add back-pressure from the member that lags")
    err = limit.error(f"{limit.kind} on the {run.skel.backend} placement: {what}",
                      loc=obj_loc, objects=(s.obj,), fix=fix,
                      details=(scalar_note(run, ) + f"reached after ({len(path)} steps):\n"
                               + format_path(run, path)))
    return err


def diagnose(run: Run, state, stuck) -> tuple[int, str, list]:
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
        if a.verb is Verb.ACQUIRE:
            link = run.links[a.obj]
            for d in ch.consumers:
                w, r = run.total((d, Verb.WAIT, a.obj)), run.total((d, Verb.RELEASE, a.obj))
                if w > r:
                    return i, _missing_release_fix(run, a, d, w, r), []
            short = [d for d in ch.consumers if run.total((d, Verb.RELEASE, a.obj)) <= c - link.capacity]
            return i, _trip_fix(run, a, short, Verb.RELEASE, "acquires (beyond the free slots)"), []
        if a.verb is Verb.WAIT and not a.event:
            short = [q for q in ch.producers if run.total((q, Verb.COMMIT, a.obj)) <= c] or ch.producers
            if run.links[a.obj].gather_pipe and len(short) == len(ch.producers):
                return i, _gather_wait_fix(run, a, ch), []
            return i, _trip_fix(run, a, short, Verb.COMMIT, "waits"), []
        if a.event_wait:
            short = [q for q in ch.producers if run.total((q, Verb.SIGNAL, a.obj)) <= c]
            return i, _trip_fix(run, a, short, Verb.SIGNAL, "waits"), []
        if a.meeting:
            bar = a.obj
            return i, (f"every member of barrier '{bar}' must meet it the same number of times: "
                       f"{instance_label(run, i)} meets it more often than "
                       f"{', '.join(instance_label(run, j) for j, _ in never)} (compare the loops and "
                       f"branches around {bar}.sync()/arrive() in each member role)"), []
    # 2. a wait on itself: two roles in one agent, in the wrong order
    for i in stuck:
        a = run.progs[i][state[i]].action
        if any(j == i and state[j] < t for j, t in run.reqs[i][state[i]]):
            return i, _ring_self_wait_fix(run, a, state) or _self_wait_fix(run, i, a), []
    # 3. a cycle: slots held and never released, too few stages, or crossed waits
    for i in stuck:
        a = run.progs[i][state[i]].action
        if a.verb is not Verb.ACQUIRE:
            continue
        link = run.links[a.obj]
        for d in link.channel_of(a.endpoint).consumers:
            held = run.count((d, Verb.WAIT, a.obj), state) - run.count((d, Verb.RELEASE, a.obj), state)
            if held > 0 and state[d.instance] < run.lens[d.instance]:
                w, r = run.total((d, Verb.WAIT, a.obj)), run.total((d, Verb.RELEASE, a.obj))
                if w > r:
                    return i, _missing_release_fix(run, a, d, w, r), []
                if link.register_handoff:
                    return i, _one_agent_pipe_fix(run, link), []
                growth = _hold_growth(run, d, a.obj, state)
                if growth:
                    var, gain = growth
                    return i, (f"'{d.role}' ends every iteration of its loop over `{var}` holding {gain} "
                               f"more slot(s) of pipe '{a.obj}' than it began with (each iteration of this "
                               f"run waits there more often than it releases): what it holds grows with "
                               f"the trip count, so more stages only move the deadlock to a later `{var}`; "
                               f"release inside the loop as often as it waits (a hold may span a fixed "
                               f"number of slots: docs/tutorial.md §14)"), []
                return i, (f"'{d.role}' holds {held} slot(s) of pipe '{a.obj}' and waits for "
                           f"another before it releases one, while '{a.endpoint.role}' needs a "
                           f"free slot to commit it: release each slot as soon as it is read, or "
                           f"raise stages to at least {_enough(link, held)} so the "
                           f"producer can run that far ahead"), []
    # 4. an arrive that waits on this target (no arrive-only barrier)
    for i in stuck:
        a = run.progs[i][state[i]].action
        if a.meeting and a.waits and not a.source_waits:
            others = [j for j, t in run.reqs[i][state[i]] if state[j] < t]
            names = ", ".join(instance_label(run, j) for j in others)
            return i, (f"on the {skel.backend} placement {a.obj}.arrive() is {skel.target.barrier}, "
                       f"which waits like {a.obj}.sync(): '{a.endpoint.role}' blocks at line "
                       f"{a.loc.line} until {names} meet the barrier, and they first wait for "
                       f"'{a.endpoint.role}'; call {a.obj}.arrive() after the signals and commits "
                       f"the other members wait for before they meet"), []
    if len(stuck) >= 1:
        return stuck[0], ("the listed agents wait on each other in a cycle; reorder the waits so that "
                          "every signal/commit a role needs is issued before it blocks"), []
    return 0, "", []


def _hold_growth(run, d, obj, state) -> tuple[str, int] | None:
    """(loop variable, slots gained per iteration) where every iteration of the innermost loop
    consumer ``d`` is stopped in runs the same waits and releases of ``obj`` (the same source
    lines, in this run's whole unrolled program) and ends holding more than it began with; None
    otherwise -- a hold that grows only in some iterations may be bounded, and stages cure it."""
    steps, p = run.progs[d.instance], state[d.instance]
    if p >= len(steps) or not steps[p].iters:
        return None
    outer, (var, _) = steps[p].iters[:-1], steps[p].iters[-1]

    def same_loop(st) -> bool:
        return len(st.iters) > len(outer) and st.iters[:len(outer)] == outer and st.iters[len(outer)][0] == var

    def trip(k) -> int:
        return steps[k].iters[len(outer)][1]

    # the steps of this run of the loop: a later loop over the same name starts its count again
    first, last = p, p
    while first > 0 and same_loop(steps[first - 1]) and trip(first - 1) <= trip(first):
        first -= 1
    while last + 1 < len(steps) and same_loop(steps[last + 1]) and trip(last + 1) >= trip(last):
        last += 1
    trips: dict = {}       # iteration -> (source lines of its waits/releases, slots gained)
    for st in steps[first:last + 1]:
        a = st.action
        if a.obj == obj and a.endpoint == d and a.verb in (Verb.WAIT, Verb.RELEASE):
            lines, gain = trips.get(st.iters[len(outer)][1], ((), 0))
            trips[st.iters[len(outer)][1]] = (lines + ((a.verb, a.loc.line),),
                                              gain + (1 if a.verb is Verb.WAIT else -1))
    shapes = set(trips.values())
    if len(trips) < 3 or len(shapes) != 1:
        return None
    gain = shapes.pop()[1]
    return (var, gain) if gain > 0 else None


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
    if link is not None and link.register_handoff:
        return _one_agent_pipe_fix(run, link)
    if link is not None:
        other = link.src if a.endpoint.role == link.dst else link.dst
        return (f"'{a.endpoint.role}' and '{other}' share agent '{agent}' on the {skel.backend} "
                f"placement, which runs them in source order: '{a.endpoint.role}' waits at line "
                f"{a.loc.line} for '{other}', whose part comes later in the same agent; put the "
                f"block of '{other}' before the block of '{a.endpoint.role}' in the loop")
    return (f"agent '{agent}' waits on itself at line {a.loc.line}: its roles run in source order; "
            f"move the meeting after the work it waits for")


def _ring_self_wait_fix(run, a, state) -> str | None:
    """An acquire on a pipe kept in memory inside one agent (``Link.in_memory``) that needs a
    release its own agent would only reach later: what the consumer does with its slots."""
    link = run.links.get(a.obj)
    if link is None or not link.in_memory or a.verb is not Verb.ACQUIRE:
        return None
    for d in link.channel_of(a.endpoint).consumers:
        w, r = run.total((d, Verb.WAIT, a.obj)), run.total((d, Verb.RELEASE, a.obj))
        if w > r:
            return _missing_release_fix(run, a, d, w, r)
        held = run.count((d, Verb.WAIT, a.obj), state) - run.count((d, Verb.RELEASE, a.obj), state)
        if run.total((a.endpoint, Verb.ACQUIRE, a.obj)) > r + link.capacity:
            return _trip_fix(run, a, [d], Verb.RELEASE, "acquires (beyond the free slots)")
        if held > 0:
            return (f"'{d.role}' holds {held} slot(s) of pipe '{a.obj}' and waits for another "
                    f"before it releases one: release each slot as soon as it is read, or raise "
                    f"stages to at least {_enough(link, held)}")
    agent = run.skel.instances[link.channels[0].producers[0].instance].agent
    where = (f"pipe '{link.obj}' runs from '{link.src}' to '{link.dst}', which share agent '{agent}' "
             f"on the {run.skel.backend} placement, and the agent runs its roles in source order")
    in_a_row = _acquires_in_a_row(run, a, state)
    if in_a_row > link.capacity:
        pairs = f" (interleave={link.interleave}: {link.capacity} per replica pair)" if link.interleave > 1 else ""
        return (f"{where}: '{link.src}' acquires {in_a_row} slots in a row before '{link.dst}' takes "
                f"one, and the ring has {link.capacity}{pairs}. Raise stages to at least "
                f"{in_a_row * link.interleave} (now {link.stages}), or move the `with {link.dst}:` "
                f"block that reads a slot between the acquires")
    pair = " a replica pair" if link.interleave > 1 else ""
    return (f"{where}: it is a ring of {link.capacity} slot(s){pair}, so '{link.src}' cannot "
            f"run more than {link.capacity} step(s) ahead. Put both roles' steps in one shared loop "
            f"(`for ...: with {link.src}: ... {link.obj}.commit()` then `with {link.dst}: ... "
            f"{link.obj}.wait() ... {link.obj}.release()`)")


def _acquires_in_a_row(run, a, state) -> int:
    """How many acquires of ``a``'s pipe its agent runs from the last release before the stuck
    one to the next wait after it (the slots the producer fills before the consumer, later in
    source order, frees one), counting the slots the consumer still holds there; 0 where they
    span iterations of a loop the wait is not in (per-role loops)."""
    i = a.endpoint.instance
    steps, p = run.progs[i], state[i]
    ends = {a.endpoint, *run.links[a.obj].channel_of(a.endpoint).consumers}     # this ring's two ends

    def mine(st, verb) -> bool:
        return st.action.obj == a.obj and st.action.verb is verb and st.action.endpoint in ends
    k = p
    while k > 0 and not mine(steps[k - 1], Verb.RELEASE):
        k -= 1
    held = sum(1 if mine(st, Verb.WAIT) else -1 if mine(st, Verb.RELEASE) else 0 for st in steps[:k])
    n = k
    while n < len(steps) and not mine(steps[n], Verb.WAIT):
        n += 1
    acquires = [st for st in steps[k:n] if mine(st, Verb.ACQUIRE)]
    # only within one iteration of the loops around the wait: acquires over several of them
    # come from a loop of the producer's own, which more stages do not mend
    if n == len(steps) or any(st.iters[:len(steps[n].iters)] != steps[n].iters for st in acquires):
        return 0
    return held + len(acquires)


def _gather_wait_fix(run, a, ch) -> str:
    """The consumer of an N -> 1 pipe waits more often than every producer replica commits."""
    n, got = len(ch.producers), run.total((a.endpoint, Verb.WAIT, a.obj))
    each = run.total((ch.producers[0], Verb.COMMIT, a.obj))
    return (f"pipe '{a.obj}' gathers {n} replicas of '{ch.producers[0].role}' into "
            f"'{a.endpoint.role}': one {a.obj}.wait() takes a slot of every replica's ring (read "
            f"them as slot[0].field ... slot[{n - 1}].field), so '{a.endpoint.role}' waits once "
            f"per round, as often as each replica commits ({each} time(s) here; it waits {got} "
            f"time(s)): do not wait once per replica")


def _one_agent_pipe_fix(run, link) -> str:
    agent = run.skel.instances[link.channels[0].producers[0].instance].agent
    target = run.skel.target
    own = (f"; or give '{link.dst}' {target.own_agent}, where the pipe is a ring of {link.stages} "
           f"slot(s) that may hold several (tutorial §14)" if target.own_agent else "")
    return (f"pipe '{link.obj}' runs from '{link.src}' to '{link.dst}', which share agent '{agent}' "
            f"on the {run.skel.backend} placement: there it holds one value at a time (so no slot "
            f"is held while another is waited) and the agent runs its roles in source order, so "
            f"stages do not help. Let the producer run at most one step ahead: put both roles' steps "
            f"in one shared loop (`for ...: with {link.src}: ... {link.obj}.commit()` then `with "
            f"{link.dst}: ... {link.obj}.wait() ... {link.obj}.release()`), and release each slot "
            f"before the next acquire{own}")


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


def verb_text(a) -> str:
    """The call an action stands for, with its role: ``kv.wait() [mma]``, ``xs.signal(done) [load]``."""
    if a.meeting:
        return f"{a.obj}.{'sync' if a.waits else 'arrive'}() [{a.endpoint.role}]"
    if a.event:
        return f"xs.{a.verb}({a.obj}) [{a.endpoint.role}]"
    return f"{a.obj}.{a.verb}() [{a.endpoint.role}]"


def iter_note(step: Step, inline=False) -> str:
    if not step.iters:
        return ""
    it = ", ".join(f"{v}={n}" for v, n in step.iters)
    return f" ({it})" if inline else f"at iteration {it}\n"


def _enough(link, held: int) -> str:
    """The stages that let one consumer hold ``held`` slots and the producer fill one more."""
    if link.interleave > 1:
        n = link.interleave
        return (f"{(held + 1) * n} (now {link.stages}: interleave={n} gives each replica pair "
                f"{link.capacity} of them)")
    return f"{held + 1} (now {link.stages})"
