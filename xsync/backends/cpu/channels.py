"""CPU emulator sync objects of one program: the channels of pipes and events, barrier counts,
the monitor that blocks agents under one condition variable (the stall watchdog), and the
errors they report (stall, leftover).

The objects are built from the protocol's skeleton (``xsync.lowering.protocol``): each pipe
and event is a set of channels (1 -> N broadcast, N -> N paired, N -> 1 gather: a gather pipe
is a ring per producer replica that the consumer waits and releases together), each barrier a
count over its member instances -- the same objects the verifier reasons about, never
re-derived here.
"""
from __future__ import annotations

import threading

from xsync.errors import LeftoverError, SourceLoc, StallError


class Aborted(Exception):
    """Raised in agents when another agent failed or the program stalled."""


def at_text(at) -> str:
    return (" (" + ", ".join(f"{k}={v}" for k, v in at.items()) + ")") if at else ""


def stall_error(kernel_name, file, status, scalars, verdict: str | None = None) -> StallError:
    """status: label -> "done" | (what, line, at) for every instance. verdict: what the
    verifier said about this kernel (``run_time_verdict``; None: verification was off)."""
    lines, first_line, objects = [], None, []
    width = max(len(k) for k in status)
    for label, st in status.items():
        if st == "done":
            lines.append(f"{label:<{width}}  finished")
            continue
        what, line, at = st
        first_line = first_line or line
        lines.append(f"{label:<{width}}  line {line}{at_text(at)}: {what}")
        objects.append(label)
    return StallError(
        f"kernel '{kernel_name}' stalled on the CPU emulator: every live agent waits "
        f"and no signal can arrive", loc=SourceLoc(file, first_line or 0, kernel_name),
        objects=tuple(objects), details=scalars + "\n".join(lines),
        fix=("run `python -m xsync check module:kernel` for the counterexample; the verifier "
             "was off (XSYNC_VERIFY=0) or the stall depends on run-time values" if verdict is None
             else f"run `python -m xsync check module:kernel` for the protocol; {verdict}"))


class Monitor:
    """Threads scheduler: one condition variable for every sync object of a program."""

    def __init__(self, kernel_name: str, file: str, labels: list[str], scalars: str = "",
                 verdict: str | None = None):
        self.cond = threading.Condition()
        self.kernel_name = kernel_name
        self.file = file
        self.scalars = scalars
        self.verdict = verdict
        self.status = {label: "running" for label in labels}
        self.failure: BaseException | None = None

    def block_until(self, label: str, ready, describe, line: int, at: dict | None):
        """Wait (holding the lock) until ready(); raise StallError if nobody can move."""
        while not ready():
            if self.failure is not None:
                raise Aborted()
            self.status[label] = ("blocked", describe(), line, at)
            live = [s for s in self.status.values() if s != "done"]
            if live and all(isinstance(s, tuple) for s in live):
                self.failure = stall_error(self.kernel_name, self.file, {
                    lb: ("done" if st == "done" else st[1:]) for lb, st in self.status.items()},
                    self.scalars, self.verdict)
                self.cond.notify_all()
                raise Aborted()
            self.cond.wait(timeout=0.25)
        self.status[label] = "running"

    def changed(self):
        """A counter moved: every blocked agent must re-check before anyone calls a stall."""
        for label, s in self.status.items():
            if isinstance(s, tuple):
                self.status[label] = "woken"
        self.cond.notify_all()

    def finish(self, label: str):
        with self.cond:
            self.status[label] = "done"
            self.changed()

    def fail(self, exc: BaseException):
        with self.cond:
            if self.failure is None:
                self.failure = exc
            self.cond.notify_all()


# ---------------------------------------------------------------- sync objects
class Sites:
    """Where each counted action happened: (line, iteration) per index, for leftovers."""

    __slots__ = ("items",)

    def __init__(self):
        self.items: list = []

    def add(self, line, at):
        self.items.append((line, dict(at) if at else None))

    def get(self, k):
        return self.items[k] if k < len(self.items) else (None, None)


class PipeChannel:
    """One channel of a pipe: a ring of ``stages`` slots from one producer to its consumers
    (several for a broadcast: a slot is free once every consumer released it)."""

    def __init__(self, name, stages, producer, consumers):
        self.name, self.stages = name, stages
        self.producer, self.consumers = producer, tuple(consumers)
        self.acquired = self.committed = 0
        self.waited = {c: 0 for c in self.consumers}
        self.released = {c: 0 for c in self.consumers}
        self.ring = [{} for _ in range(stages)]
        self.acquire_sites, self.commit_sites = Sites(), Sites()
        self.wait_sites = {c: Sites() for c in self.consumers}

    def can_acquire(self) -> bool:
        return all(self.acquired - self.released[c] < self.stages for c in self.consumers)

    def why_acquire(self, labels) -> str:
        low = min(self.consumers, key=lambda c: self.released[c])
        return (f"acquire on pipe '{self.name}': all {self.stages} slot(s) in use ({self.acquired} "
                f"acquired, {self.released[low]} released by {labels(low)})")

    def can_wait(self, c) -> bool:
        return self.waited[c] < self.committed

    def why_wait(self, c, labels) -> str:
        return (f"wait on pipe '{self.name}': slot {self.waited[c]} not committed ({self.committed} "
                f"committed by {labels(self.producer)})")


class GatherChannel:
    """The consumer's side of an N -> 1 pipe: one ring (a :class:`PipeChannel`) per producer
    replica, waited and released together. The k-th wait needs the k-th commit of every ring
    and returns slot k of each, in replica order; the rings share the consumer's counts."""

    def __init__(self, name, stages, producers, consumer, ring=PipeChannel):
        self.name, self.stages = name, stages
        self.consumers = (consumer,)
        self.rings = [ring(name, stages, p, (consumer,)) for p in producers]
        self.waited, self.released = self.rings[0].waited, self.rings[0].released
        self.wait_sites = self.rings[0].wait_sites
        for r in self.rings[1:]:
            r.waited, r.released, r.wait_sites = self.waited, self.released, self.wait_sites
        self.ring = [[r.ring[s] for r in self.rings] for s in range(stages)]

    def can_wait(self, c) -> bool:
        return all(r.can_wait(c) for r in self.rings)

    def why_wait(self, c, labels) -> str:
        return next(r.why_wait(c, labels) for r in self.rings if not r.can_wait(c))


class EventChannel:
    """One channel of an event: the k-th wait of a consumer needs the k-th signal of every
    producer (several for a gather)."""

    def __init__(self, name, producers, consumers):
        self.name = name
        self.producers, self.consumers = tuple(producers), tuple(consumers)
        self.signals = {p: 0 for p in self.producers}
        self.waits = {c: 0 for c in self.consumers}
        self.signal_sites = {p: Sites() for p in self.producers}

    def can_wait(self, c) -> bool:
        return self.waits[c] < min(self.signals.values())

    def why_wait(self, c, labels) -> str:
        sent = min(self.signals.values())
        return f"wait on event '{self.name}': signal {self.waits[c] + 1} not sent ({sent} sent)"


class BarrierRT:
    """A barrier over its member instances (each counts once per meeting)."""

    def __init__(self, name, members):
        self.name = name
        self.arrivals = {m: 0 for m in members}
        self.sites = {m: Sites() for m in members}

    def met(self, mine) -> bool:
        return min(self.arrivals.values()) >= mine

    def why(self, mine) -> str:
        return (f"sync on barrier '{self.name}' (meeting {mine}): waiting for "
                + ", ".join(m for m, n in self.arrivals.items() if n < mine))


class MulticastRing(PipeChannel):
    """One program's ring of a multicast pipe's channel in a cluster (``xs.cluster``): its own
    slots, which its producer fills with its copy of the tile every program receives, counted
    against the rings of every program: a slot is free for this producer once every program's
    consumers released it, and full for this program's consumers once every program's
    producer committed it (as TMA multicast with cluster-scope mbarriers)."""

    def __init__(self, name, stages, producer, consumers):
        super().__init__(name, stages, producer, consumers)
        self.peers: list[MulticastRing] = [self]      # the channel's rings, one per program

    def can_acquire(self) -> bool:
        return all(self.acquired - r.released[c] < self.stages for r in self.peers for c in r.consumers)

    def why_acquire(self, labels) -> str:
        ring, low = min(((r, c) for r in self.peers for c in r.consumers), key=lambda rc: rc[0].released[rc[1]])
        return (f"acquire on multicast pipe '{self.name}': all {self.stages} slot(s) in use ({self.acquired} "
                f"acquired, {ring.released[low]} released by {labels(low)})")

    def can_wait(self, c) -> bool:
        return self.waited[c] < min(r.committed for r in self.peers)

    def why_wait(self, c, labels) -> str:
        low = min(self.peers, key=lambda r: r.committed)
        return (f"wait on multicast pipe '{self.name}': slot {self.waited[c]} not committed "
                f"({low.committed} committed by {labels(low.producer)})")


def _multicast_channel(skel, link, ch) -> tuple[list[MulticastRing], dict]:
    """A multicast channel's rings (one per program of the cluster; of a gather pipe one per
    producer replica of each program) and the channel each endpoint uses."""
    rings, uses = [], {}
    for p in range(skel.cluster):
        prods = [e for e in ch.producers if skel.program_of(e.instance) == p]
        cons = [e for e in ch.consumers if skel.program_of(e.instance) == p]
        if link.gather_pipe:
            gather = GatherChannel(link.obj, link.capacity, prods, cons[0], ring=MulticastRing)
            rings += gather.rings
            uses[cons[0]] = gather
            uses.update(zip(prods, gather.rings))
        else:
            rings.append(MulticastRing(link.obj, link.capacity, prods[0], cons))
            uses.update({e: rings[-1] for e in prods + cons})
    for r in rings:
        r.peers = rings
    return rings, uses


class Program:
    """The sync objects of one program (or of the programs of a cluster that share a multicast
    pipe: ``xsync.lowering.cluster_protocol``), built from the skeleton."""

    def __init__(self, skel, labels):
        self.skel, self.labels = skel, labels
        self.channels: dict[tuple, object] = {}    # (object, endpoint) -> channel
        self.pipes, self.events, self.barriers = [], [], {}
        multicast = getattr(skel, "multicast", ())
        for link in skel.links:
            for ch in link.channels:
                if link.obj in multicast:
                    rings, uses = _multicast_channel(skel, link, ch)
                    self.pipes += rings
                    self.channels.update({(link.obj, e): rt for e, rt in uses.items()})
                    continue
                if link.gather_pipe:
                    rt = GatherChannel(link.obj, link.capacity, ch.producers, ch.consumers[0])
                    self.pipes += rt.rings
                    self.channels[(link.obj, ch.consumers[0])] = rt
                    for e, ring in zip(ch.producers, rt.rings):
                        self.channels[(link.obj, e)] = ring
                    continue
                if link.kind == "pipe":
                    rt = PipeChannel(link.obj, link.capacity, ch.producers[0], ch.consumers)
                    self.pipes.append(rt)
                else:
                    rt = EventChannel(link.obj, ch.producers, ch.consumers)
                    self.events.append(rt)
                for e in ch.producers + ch.consumers:
                    self.channels[(link.obj, e)] = rt
        self._barrier_of: dict[tuple, BarrierRT] = {}   # (barrier, instance) -> its meetings
        for b in skel.barriers:
            rt = BarrierRT(b.obj, [labels[m] for m in b.members])
            self.barriers[(b.obj, b.members)] = rt
            for m in b.members:
                self._barrier_of[(b.obj, m)] = rt
        self.adds: dict[int, list] = {}            # agent instance -> its queued ordered adds

    def queue_add(self, instance: int, add: tuple) -> None:
        """An ordered reduce-add of ``instance`` (each instance appends only to its own list)."""
        self.adds.setdefault(instance, []).append(add)

    def flush_adds(self) -> None:
        """Apply the queued ordered reduce-adds: instance by instance, each in program order."""
        from xsync.backends.cpu.tile_ops import store_add

        for instance in sorted(self.adds):
            for tensor, offsets, value, bounds in self.adds[instance]:
                store_add(tensor, offsets, value, bounds)
        self.adds.clear()

    def barrier(self, obj: str, instance: int) -> BarrierRT:
        """The meetings of barrier ``obj`` that ``instance`` takes part in."""
        return self._barrier_of[(obj, instance)]

    def label(self, ep) -> str:
        return self.skel.endpoint_label(ep)

    def leftovers(self) -> list[tuple[str, str, int | None, dict | None]]:
        """(object, what, line, iteration) of everything left unconsumed at the end."""
        out, lab = [], self.label
        for ch in self.pipes:
            for c in ch.consumers:
                if ch.committed > ch.waited[c]:
                    line, at = ch.commit_sites.get(ch.waited[c])
                    out.append((ch.name, f"pipe '{ch.name}': slot {ch.waited[c]} committed by "
                                         f"{lab(ch.producer)} was never waited by {lab(c)} "
                                         f"({ch.committed - ch.waited[c]} left)", line, at))
                if ch.waited[c] > ch.released[c]:
                    line, at = ch.wait_sites[c].get(ch.released[c])
                    out.append((ch.name, f"pipe '{ch.name}': slot {ch.released[c]} waited by {lab(c)} "
                                         f"was never released ({ch.waited[c] - ch.released[c]} held: a "
                                         f"missing release)", line, at))
            if ch.acquired > ch.committed:
                line, at = ch.acquire_sites.get(ch.committed)
                out.append((ch.name, f"pipe '{ch.name}': slot {ch.committed} acquired by "
                                     f"{lab(ch.producer)} was never committed", line, at))
        for ch in self.events:
            for c in ch.consumers:
                for p in ch.producers:
                    if ch.signals[p] > ch.waits[c]:
                        line, at = ch.signal_sites[p].get(ch.waits[c])
                        out.append((ch.name, f"event '{ch.name}': signal {ch.waits[c] + 1} of "
                                             f"{lab(p)} was never waited by {lab(c)} "
                                             f"({ch.signals[p] - ch.waits[c]} left)", line, at))
        for b in self.barriers.values():
            counts = b.arrivals
            if len(set(counts.values())) > 1:
                lo = min(counts.values())
                ahead = next(m for m, n in counts.items() if n > lo)
                line, at = b.sites[ahead].get(lo)
                behind = ", ".join(m for m, n in counts.items() if n == lo)
                out.append((b.name, f"barrier '{b.name}': meeting {lo + 1} is left incomplete "
                                    f"({ahead} arrived, {behind} did not)", line, at))
        return out


def leftover_error(kernel, file, left, scalars, verdict: str | None = None) -> LeftoverError:
    obj, what, line, at = left[0]
    more = "".join(f"{w} at line {ln}{at_text(a)}\n" for _, w, ln, a in left[1:])
    return LeftoverError(
        f"kernel '{kernel}' ended on the CPU emulator with unconsumed synchronization: {what}",
        loc=SourceLoc(file, line or 0, kernel), objects=tuple(dict.fromkeys(o for o, _, _, _ in left)),
        details=scalars + (f"the first one: line {line}{at_text(at)}\n" if line else "") + more,
        fix=("make every loop that signals/commits run as many times as the loop that "
             "waits/releases, and release every slot you wait for; " +
             ("`python -m xsync check` finds this before running (the verifier was off, "
              "XSYNC_VERIFY=0)" if verdict is None else verdict)))
