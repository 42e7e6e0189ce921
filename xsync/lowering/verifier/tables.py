"""Per skeleton: every action's counter and what it waits for, as small integers
(``Tables``), and the leads between counters that the target bounds (``Leads``)."""
from __future__ import annotations

from dataclasses import dataclass

from xsync.lowering.ir import Verb
from xsync.lowering.protocol import Skeleton
from xsync.lowering.verifier.candidates import Scalars

INF = 1 << 60
# the tag of a barrier's counter (one per instance): every meeting is an arrival (sync
# arrives, then waits)
MEETING = Verb.ARRIVE


@dataclass(frozen=True)
class Lead:
    """``max(minuends) - subtrahend`` (or min for arrival-counting) must stay <= limit.lead."""

    kind: str                 # "event" | "gather" | "barrier"
    obj: str
    limit: object             # placement.Limit
    minuends: tuple           # counter keys
    subtrahend: tuple         # counter key
    hold: int                 # instance of the subtrahend
    use_min: bool             # pending phases of an arrival-counting mbarrier: min over sources


class Leads:
    """The leads the target bounds, per skeleton."""

    def __init__(self, skel: Skeleton):
        t = skel.target
        specs = []
        for link in skel.links:
            if link.kind != "event" or not link.crosses:
                continue
            for ch in link.channels:
                for d in ch.consumers:
                    sub = (d, Verb.WAIT, link.obj)
                    if t.event_limit is not None:
                        if t.gather_limit is not None or len(ch.producers) == 1:
                            mins = tuple((s, Verb.SIGNAL, link.obj) for s in ch.producers)
                            specs.append(Lead("event", link.obj, t.event_limit, mins, sub,
                                               d.instance, True))
                        else:
                            for s in ch.producers:
                                specs.append(Lead("event", link.obj, t.event_limit,
                                                   ((s, Verb.SIGNAL, link.obj),), sub, d.instance, False))
                if t.gather_limit is not None and len(ch.producers) > 1:
                    for s1 in ch.producers:
                        for s2 in ch.producers:
                            if s1.instance != s2.instance:
                                specs.append(Lead("gather", link.obj, t.gather_limit,
                                                   ((s1, Verb.SIGNAL, link.obj),),
                                                   (s2, Verb.SIGNAL, link.obj), s2.instance, False))
        if t.barrier_limit is not None:
            for b in skel.barriers:
                for j1 in b.members:
                    for j2 in b.members:
                        if j1 != j2:
                            specs.append(Lead("barrier", b.obj, t.barrier_limit,
                                               ((j1, MEETING, b.obj),), (j2, MEETING, b.obj), j2, False))
        self.specs = tuple(specs)
        self.holds = sorted({s.hold for s in specs})


class Tables:
    """Per skeleton: every action's counter and what it waits for, as small integers."""

    def __init__(self, skel: Skeleton, sc: Scalars):
        self.sc = sc
        links = {x.obj: x for x in skel.links}
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
            if a.meeting:
                self.kid.append(kid((inst, MEETING, a.obj), inst))
            else:
                self.kid.append(kid((a.endpoint, a.verb, a.obj), a.endpoint.instance))
        for aid, a in enumerate(sc.acts):
            inst = sc.act_inst[aid]
            tpl = ()
            if a.verb is Verb.ACQUIRE:
                link = links[a.obj]
                tpl = tuple((kid((d, Verb.RELEASE, a.obj), d.instance), d.instance, 1, link.capacity)
                            for d in link.channel_of(a.endpoint).consumers)
            elif a.verb is Verb.WAIT and not a.event:
                # every producer replica's commit (several for a gather pipe: one ring each)
                tpl = tuple((kid((p, Verb.COMMIT, a.obj), p.instance), p.instance, 1, 0)
                            for p in links[a.obj].channel_of(a.endpoint).producers)
            elif a.event_wait:
                tpl = tuple((kid((q, Verb.SIGNAL, a.obj), q.instance), q.instance, 1, 0)
                            for q in links[a.obj].channel_of(a.endpoint).producers)
            elif a.meeting and a.waits:
                tpl = tuple((kid((j, MEETING, a.obj), j), j, 0, 0) for j in skel.membership(a.obj, inst).members if j != inst)
            self.tpl.append(tpl)
            held = None
            if a.verb in (Verb.ACQUIRE, Verb.COMMIT):
                held = (kid((a.endpoint, "held-acquire", a.obj), inst), 1 if a.verb is Verb.ACQUIRE else -1)
            elif a.verb in (Verb.WAIT, Verb.RELEASE) and not a.event:
                held = (kid((a.endpoint, "held-wait", a.obj), inst), 1 if a.verb is Verb.WAIT else -1)
            self.slot.append(held)
        self.keys = keys
        self.nkeys = len(keys)
        self.meet_key = [k[1] is MEETING for k in keys]
        # Slot order from the positions (``Run.slot_order``): per held slot (an endpoint's
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
        for idx, spec in enumerate(Leads(skel).specs):
            mins = tuple(kid(m, m[0] if m[1] is MEETING else m[0].instance) for m in spec.minuends)
            sub = kid(spec.subtrahend, spec.hold)
            self.holds.setdefault(spec.hold, []).append(
                (idx, spec, mins, sub, spec.use_min, spec.limit.lead))
        self.nkeys = len(keys)
        self.meet_key = [k[1] is MEETING for k in keys]

    def key(self, key) -> int | None:
        return self.keys.get(key)
