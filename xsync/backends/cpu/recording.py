"""The CPU emulator's opt-in event recorder (``xsync trace`` draws what it records)."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from xsync.backends.cpu.agents import Agent
from xsync.backends.cpu.channels import Monitor, at_text
from xsync.errors import LaunchError, SourceLoc
from xsync.trace.timeline import OpKind



# ---------------------------------------------------------------- opt-in event recorder
# ``with record() as tr: kernel[grid](...)`` records, per agent instance, every sync op
# (with the time it spent blocked) and the work spans between them, and pairs each wait
# with the commit/signal that satisfied it. Off by default: without an active recorder
# the launcher builds the plain Agent/Monitor and no per-op code runs.
_RECORDING = threading.local()
MAX_OPS = 20_000          # sync ops one recording keeps: more is neither drawn in bounded time nor read
_ARRIVAL = "arrival"     # the pairing class of a barrier arrival, whether sync or arrive
_BARRIER_KINDS = (OpKind.SYNC, OpKind.ARRIVE)
_SATISFIED_KINDS = (OpKind.WAIT, OpKind.EVENT_WAIT, OpKind.ACQUIRE, OpKind.SYNC)  # ops let through


@dataclass
class Op:
    """One recorded span of one agent instance (times in ns since the trace started).

    kind: ACQUIRE COMMIT WAIT RELEASE (pipes), SIGNAL EVENT_WAIT (events), SYNC ARRIVE
    (barriers), or WORK for the computation between two sync ops. ``seq`` is this
    instance's k-th such op on ``obj`` (for barriers: its k-th arrival, sync or arrive).
    ``blocked_ns`` is when the op found it could not proceed (None: it never blocked);
    ``waits_on`` the runtime's account of what it waited for; ``stuck`` marks an op that
    never completed (the program stalled or failed while it waited).
    """

    label: str
    kind: OpKind
    obj: str | None
    line: int | None
    iteration: dict
    t_start: int
    t_end: int
    seq: int = 0
    blocked_ns: int | None = None
    waits_on: str = ""
    stuck: bool = False
    program: int = 0

    @property
    def stalled_ns(self) -> int:
        return 0 if self.blocked_ns is None else self.t_end - self.blocked_ns


@dataclass
class SyncObjectInfo:
    name: str
    kind: str                   # pipe | event | barrier
    src: list[str]              # producer labels (barrier: members)
    dst: list[str]              # consumer labels (barrier: members)
    stages: int = 0
    channels: tuple = ()        # ((producer labels), (consumer labels)) per skeleton channel


@dataclass
class ProgramTrace:
    pid: tuple[int, ...]
    labels: list[str]
    objects: dict[str, SyncObjectInfo]
    ops: list[Op] = field(default_factory=list)
    pairs: list[tuple[int, int]] = field(default_factory=list)  # (satisfier, satisfied) op indices
    error: BaseException | None = None


class Trace:
    """What :func:`record` collected: one ProgramTrace per program, in launch order."""

    def __init__(self):
        self.t0 = time.perf_counter_ns()
        self.programs: list[ProgramTrace] = []
        self.kernel_name = ""
        self.file = ""
        self.grid: tuple[int, ...] = ()
        self.ops_left = MAX_OPS

    def now(self) -> int:
        return time.perf_counter_ns() - self.t0


@contextmanager
def record():
    """Record every CPU-emulated launch in this thread while the block runs."""
    prev = getattr(_RECORDING, "trace", None)
    tr = Trace()
    _RECORDING.trace = tr
    try:
        yield tr
    finally:
        _RECORDING.trace = prev


def _partners(objects: dict, op: Op) -> list[tuple]:
    """Keys (obj, class, label, seq) of the ops that let ``op`` complete.

    The pairing is the skeleton's channels: the k-th wait of a consumer follows the k-th
    commit of its channel's producer (every producer for a gather event or pipe); acquire j of a
    producer follows release j - stages of each consumer of its channel; barrier meeting m
    of one member follows arrival m of every other member."""
    info = objects[op.obj]
    if op.kind is OpKind.SYNC:
        return [(op.obj, "arrival", m, op.seq) for m in info.src if m != op.label]
    for prods, cons in info.channels:
        if op.kind is OpKind.WAIT and op.label in cons:
            return [(op.obj, OpKind.COMMIT, p, op.seq) for p in prods]
        if op.kind is OpKind.EVENT_WAIT and op.label in cons:
            return [(op.obj, OpKind.SIGNAL, q, op.seq) for q in prods]
        if op.kind is OpKind.ACQUIRE and op.label in prods:
            if op.seq < info.stages:
                return []
            return [(op.obj, OpKind.RELEASE, d, op.seq - info.stages) for d in cons]
    return []


def link_pairs(prog: ProgramTrace):
    index = {}
    for i, op in enumerate(prog.ops):
        if op.obj is None or op.kind is OpKind.WORK:
            continue
        cls = _ARRIVAL if op.kind in _BARRIER_KINDS else op.kind
        index[(op.obj, cls, op.label, op.seq)] = i
    for i, op in enumerate(prog.ops):
        if op.obj is None or op.kind not in _SATISFIED_KINDS or op.stuck:
            continue
        for key in _partners(prog.objects, op):
            j = index.get(key)
            if j is not None:
                prog.pairs.append((j, i))


class RecordingMonitor(Monitor):
    def __init__(self, *args, trace: Trace):
        super().__init__(*args)
        self.trace = trace
        self.blocked: dict[str, tuple[int, str]] = {}   # label -> (since, what it waits on)

    def block_until(self, label, ready, describe, line, at):
        if not ready():
            self.blocked[label] = (self.trace.now(), describe())
        super().block_until(label, ready, describe, line, at)


class RecordingAgent(Agent):
    """Agent that logs its sync ops and the work between them (recording mode only)."""

    def __init__(self, *args, trace: Trace, program_index: int):
        super().__init__(*args)
        self.trace, self.program_index = trace, program_index
        self.ops: list[Op] = []
        self.counts: dict[tuple[str, str], int] = {}
        self.t_last = trace.now()
        self.line_last: int | None = None
        self.aborted = False

    def begin(self):
        self.t_last = self.trace.now()

    def end(self):
        if not self.aborted:
            self._work(self.trace.now(), None)

    def _work(self, t, line):
        if t > self.t_last:
            lines = {k: v for k, v in (("from", self.line_last), ("to", line)) if v is not None}
            self.ops.append(Op(self.label, OpKind.WORK, None, None, lines, self.t_last, t,
                               program=self.program_index))

    def _op(self, kind, obj, line, at, call):
        kline = line or None
        self.trace.ops_left -= 1
        if self.trace.ops_left < 0:
            raise LaunchError(
                f"kernel '{self.kernel}': the recording passed {MAX_OPS} sync ops (xsync trace "
                f"draws at most that many)", loc=SourceLoc(self.file, kline, self.kernel) if kline else None,
                objects=(self.label, obj), details=f"at {self.label}{at_text(at)}",
                fix="trace a small launch: fewer programs and short loops (--set the sizes down, "
                    "e.g. --set K=64)")
        iteration = dict(at or {})
        t0 = self.trace.now()
        self._work(t0, kline)
        cls = _ARRIVAL if kind in _BARRIER_KINDS else kind
        seq = self.counts.get((obj, cls), 0)
        self.counts[(obj, cls)] = seq + 1
        op = Op(self.label, kind, obj, kline, iteration, t0, t0, seq, program=self.program_index)
        try:
            result = call()
        except BaseException:
            op.t_end = self.trace.now()
            blocked = self.monitor.blocked.pop(self.label, None)
            if blocked is not None:
                op.blocked_ns, op.waits_on = blocked
                op.stuck = True
            self.ops.append(op)
            self.aborted = True
            raise
        op.t_end = self.trace.now()
        blocked = self.monitor.blocked.pop(self.label, None)
        if blocked is not None:
            op.blocked_ns, op.waits_on = blocked
        self.ops.append(op)
        self.t_last, self.line_last = op.t_end, kline
        return result

    def acquire(self, pipe, line=0, at=None):
        return self._op(OpKind.ACQUIRE, pipe, line, at, lambda: Agent.acquire(self, pipe, line, at))

    def commit(self, pipe, line=0, at=None):
        return self._op(OpKind.COMMIT, pipe, line, at, lambda: Agent.commit(self, pipe, line, at))

    def wait(self, pipe, line=0, at=None):
        return self._op(OpKind.WAIT, pipe, line, at, lambda: Agent.wait(self, pipe, line, at))

    def release(self, pipe, line=0, at=None):
        return self._op(OpKind.RELEASE, pipe, line, at, lambda: Agent.release(self, pipe, line, at))

    def signal(self, event, line=0, at=None):
        return self._op(OpKind.SIGNAL, event, line, at, lambda: Agent.signal(self, event, line, at))

    def wait_event(self, event, line=0, at=None):
        return self._op(OpKind.EVENT_WAIT, event, line, at, lambda: Agent.wait_event(self, event, line, at))

    def sync(self, barrier, line=0, at=None):
        return self._op(OpKind.SYNC, barrier, line, at, lambda: Agent.sync(self, barrier, line, at))

    def arrive(self, barrier, line=0, at=None):
        return self._op(OpKind.ARRIVE, barrier, line, at, lambda: Agent.arrive(self, barrier, line, at))


def object_infos(skel) -> dict[str, SyncObjectInfo]:
    """Labels of each object's ends, from the skeleton (instance labels)."""
    label = skel.endpoint_label
    out = {}
    for link in skel.links:
        chans = tuple((tuple(label(e) for e in ch.producers), tuple(label(e) for e in ch.consumers))
                      for ch in link.channels)
        src = list(dict.fromkeys(lb for p, _ in chans for lb in p))
        dst = list(dict.fromkeys(lb for _, c in chans for lb in c))
        out[link.obj] = SyncObjectInfo(link.obj, link.kind, src, dst, link.capacity if link.kind == "pipe" else 0,
                                       chans)
    for b in skel.barriers:
        members = [skel.instances[m].label for m in b.members]
        out[b.obj] = SyncObjectInfo(b.obj, "barrier", members, members)
    return out


def active_trace():
    """The :class:`Trace` recording launches from this thread (None: not recording)."""
    return getattr(_RECORDING, "trace", None)
