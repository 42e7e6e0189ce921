"""CPU emulator runtime: exact sync semantics, torch tile ops, stall watchdog, leftover check.

Every agent instance of a program runs the agent function the CPU renderer generated. The
sync objects are built from the protocol's skeleton (``xsync.lowering.protocol``): each
pipe and event is a set of channels (1 -> N broadcast, N -> N paired, N -> 1 gather),
each barrier a count over its member instances -- the same objects the verifier reasons
about, never re-derived here.

Two schedulers run the same semantics (``XSYNC_CPU_MODE``):

* ``threads`` (default): one thread per agent instance. All sync objects of a program
  share one condition variable, so the runtime always knows who waits on what: when every
  live agent is blocked, no signal can ever arrive, and the watchdog raises a StallError
  that names each agent, the object it waits on, the kernel line and the loop iteration --
  within milliseconds, instead of hanging.
* ``cooperative``: the agent functions are generators (``yield from ag.wait(...)``) run
  by one deterministic round-robin scheduler in the calling thread: no threads, no locks,
  the same StallError when a full round makes no progress. Protocols without heavy tile
  work run about 20x faster this way (the differential test of the verifier uses it).

Whatever the scheduler, the emulator reports what the verifier would: a commit or release
without its slot (:class:`SlotOrderError`, at the call), and at program end any slot or
signal left unconsumed or barrier meeting left incomplete (:class:`LeftoverError`), with
role, object, line and loop iteration.

``with record() as trace:`` turns on an event recorder for launches from this thread
(threads scheduler): each agent instance logs its sync ops (with the time spent blocked and
what it waited on) and the work spans between them, and every wait/acquire/barrier sync is
paired with the commit/signal/release/arrival that let it through (``xsync trace`` draws
this). Without an active recorder the launcher builds the plain Agent and Monitor: no
per-op cost.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from xsync.errors import LaunchError, LeftoverError, ProtocolError, SlotOrderError, SourceLoc, StallError

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                "int32": torch.int32, "int1": torch.bool}


class _Aborted(Exception):
    """Raised in agents when another agent failed or the program stalled."""


def _at_text(at) -> str:
    return (" (" + ", ".join(f"{k}={v}" for k, v in at.items()) + ")") if at else ""


def _stall_error(kernel_name, file, status, scalars) -> StallError:
    """status: label -> "done" | (what, line, at) for every instance."""
    lines, first_line, objects = [], None, []
    width = max(len(k) for k in status)
    for label, st in status.items():
        if st == "done":
            lines.append(f"{label:<{width}}  finished")
            continue
        what, line, at = st
        first_line = first_line or line
        lines.append(f"{label:<{width}}  line {line}{_at_text(at)}: {what}")
        objects.append(label)
    return StallError(
        f"kernel '{kernel_name}' stalled on the CPU emulator: every live agent waits "
        f"and no signal can arrive", loc=SourceLoc(file, first_line or 0, kernel_name),
        objects=tuple(objects), details=scalars + "\n".join(lines),
        fix=("run `python -m xsync check module:kernel` for the counterexample; the verifier "
             "was off (XSYNC_VERIFY=0) or the stall depends on run-time values"))


class Monitor:
    """Threads scheduler: one condition variable for every sync object of a program."""

    def __init__(self, kernel_name: str, file: str, labels: list[str], scalars: str = ""):
        self.cond = threading.Condition()
        self.kernel_name = kernel_name
        self.file = file
        self.scalars = scalars
        self.status = {label: "running" for label in labels}
        self.failure: BaseException | None = None

    def block_until(self, label: str, ready, describe, line: int, at: dict | None):
        """Wait (holding the lock) until ready(); raise StallError if nobody can move."""
        while not ready():
            if self.failure is not None:
                raise _Aborted()
            self.status[label] = ("blocked", describe(), line, at)
            live = [s for s in self.status.values() if s != "done"]
            if live and all(isinstance(s, tuple) for s in live):
                self.failure = _stall_error(self.kernel_name, self.file, {
                    lb: ("done" if st == "done" else st[1:]) for lb, st in self.status.items()},
                    self.scalars)
                self.cond.notify_all()
                raise _Aborted()
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
class _Sites:
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
        self.acquire_sites, self.commit_sites = _Sites(), _Sites()
        self.wait_sites = {c: _Sites() for c in self.consumers}

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


class EventChannel:
    """One channel of an event: the k-th wait of a consumer needs the k-th signal of every
    producer (several for a gather)."""

    def __init__(self, name, producers, consumers):
        self.name = name
        self.producers, self.consumers = tuple(producers), tuple(consumers)
        self.signals = {p: 0 for p in self.producers}
        self.waits = {c: 0 for c in self.consumers}
        self.signal_sites = {p: _Sites() for p in self.producers}

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
        self.sites = {m: _Sites() for m in members}

    def met(self, mine) -> bool:
        return min(self.arrivals.values()) >= mine

    def why(self, mine) -> str:
        return (f"sync on barrier '{self.name}' (meeting {mine}): waiting for "
                + ", ".join(m for m, n in self.arrivals.items() if n < mine))


class Program:
    """The sync objects of one program, built from the skeleton."""

    def __init__(self, skel, labels):
        self.skel, self.labels = skel, labels
        self.channels: dict[tuple, object] = {}    # (object, endpoint) -> channel
        self.pipes, self.events, self.barriers = [], [], {}
        for link in skel.links:
            for ch in link.channels:
                if link.kind == "pipe":
                    rt = PipeChannel(link.obj, link.capacity, ch.producers[0], ch.consumers)
                    self.pipes.append(rt)
                else:
                    rt = EventChannel(link.obj, ch.producers, ch.consumers)
                    self.events.append(rt)
                for e in ch.producers + ch.consumers:
                    self.channels[(link.obj, e)] = rt
        for b in skel.barriers:
            self.barriers[b.obj] = BarrierRT(b.obj, [labels[m] for m in b.members])

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


def _leftover_error(kernel, file, left, scalars) -> LeftoverError:
    obj, what, line, at = left[0]
    more = "".join(f"{w} at line {ln}{_at_text(a)}\n" for _, w, ln, a in left[1:])
    return LeftoverError(
        f"kernel '{kernel}' ended on the CPU emulator with unconsumed synchronization: {what}",
        loc=SourceLoc(file, line or 0, kernel), objects=tuple(dict.fromkeys(o for o, _, _, _ in left)),
        details=scalars + (f"the first one: line {line}{_at_text(at)}\n" if line else "") + more,
        fix=("make every loop that signals/commits run as many times as the loop that "
             "waits/releases, and release every slot you wait for; `python -m xsync check` "
             "finds this before running (the verifier was off, XSYNC_VERIFY=0)"))


class Agent:
    """What generated agent code calls: sync verbs for one agent instance, plus ids
    (threads scheduler: blocking calls under the program's condition variable)."""

    def __init__(self, label: str, replica: int, pid: tuple[int, ...], grid: tuple[int, ...],
                 program: Program, monitor, instance: int = 0, file: str = "", kernel: str = ""):
        self.label, self.replica, self.pid, self.grid = label, replica, pid, grid
        self.program, self.monitor, self.instance = program, monitor, instance
        self.file, self.kernel = file, kernel
        self.in_flight: list[tuple[int, tuple]] = []   # (mma id, slots it reads)
        self.mma_count = 0
        self.held: dict[str, list] = {}   # pipe -> slots waited and not yet released (FIFO)
        skel = program.skel
        inst = skel.instances[instance]
        # this instance's endpoint on every pipe/event it uses (one role per side)
        self.ends: dict[str, object] = {}
        for link in skel.links:
            for e in skel.endpoints:
                if e.instance == instance and e.role in (link.src, link.dst) and e.role in inst.roles:
                    self.ends[link.obj] = e
        self.objects = program.channels

    def tick(self):
        """Called at every loop iteration: an agent that computes without syncing still
        stops soon once the program has failed (a timeout, another agent's error)."""
        if self.monitor is not None and self.monitor.failure is not None:
            raise _Aborted()

    def program_id(self, axis):
        return self.pid[axis]

    def num_programs(self, axis):
        return self.grid[axis]

    def ch(self, obj):
        return self.program.channels[(obj, self.ends[obj])]

    def loc(self, line) -> SourceLoc:
        return SourceLoc(self.file, line, self.kernel)

    # the state changes (shared by both schedulers; callers hold the lock when threaded)
    def _acquire(self, ch, line, at):
        slot = ch.ring[ch.acquired % ch.stages]
        ch.acquired += 1
        ch.acquire_sites.add(line, at)
        return slot

    def _commit(self, ch, line, at):
        if ch.committed >= ch.acquired:
            raise self._unpaired(ch.name, "commit", "acquire", line, at, ch.acquired)
        ch.committed += 1
        ch.commit_sites.add(line, at)

    def _wait(self, ch, line, at):
        e = self.ends[ch.name]
        slot = ch.ring[ch.waited[e] % ch.stages]
        ch.waited[e] += 1
        ch.wait_sites[e].add(line, at)
        self.held.setdefault(ch.name, []).append(slot)
        return slot

    def _release(self, ch, line, at):
        """Release the oldest slot this agent waited for and still holds (FIFO, as on hardware)."""
        e = self.ends[ch.name]
        if ch.released[e] >= ch.waited[e]:
            raise self._unpaired(ch.name, "release", "wait", line, at, ch.waited[e])
        queue = self.held.get(ch.name)
        slot = queue.pop(0) if queue else None
        for _, reads in self.in_flight:
            if any(s is slot for s in reads):
                raise ProtocolError(
                    f"{self.label} releases a slot of pipe '{ch.name}' while an xs.mma that reads it "
                    f"is still in flight", loc=self.loc(line), objects=(ch.name, self.label),
                    fix="call xs.mma_wait(acc, pending=0) (or a pending count that retires that mma) "
                        "before releasing the slot")
        ch.released[e] += 1

    def _signal(self, ch, line, at):
        e = self.ends[ch.name]
        ch.signals[e] += 1
        ch.signal_sites[e].add(line, at)

    def _unpaired(self, obj, verb, pair, line, at, done) -> SlotOrderError:
        role = self.ends[obj].role
        return SlotOrderError(
            f"{verb} on pipe '{obj}' by {self.label} without a slot from {pair} (it did {done} "
            f"{pair}(s) and as many {verb}s) on the CPU emulator",
            loc=self.loc(line), objects=(obj, role),
            details=(f"at iteration {_at_text(at).strip()[1:-1]}\n" if at else ""),
            fix=f"every {obj}.{verb}() must follow its own {obj}.{pair}() in role '{role}' on the same path")

    # sync verbs -------------------------------------------------------
    def acquire(self, pipe, line=0, at=None):
        ch, mon = self.ch(pipe), self.monitor
        with mon.cond:
            mon.block_until(self.label, ch.can_acquire, lambda: ch.why_acquire(self.program.label), line, at)
            return self._acquire(ch, line, at)

    def commit(self, pipe, line=0, at=None):
        ch, mon = self.ch(pipe), self.monitor
        with mon.cond:
            self._commit(ch, line, at)
            mon.changed()

    def wait(self, pipe, line=0, at=None):
        ch, mon = self.ch(pipe), self.monitor
        e = self.ends[pipe]
        with mon.cond:
            mon.block_until(self.label, lambda: ch.can_wait(e),
                            lambda: ch.why_wait(e, self.program.label), line, at)
            return self._wait(ch, line, at)

    def release(self, pipe, line=0, at=None):
        ch, mon = self.ch(pipe), self.monitor
        with mon.cond:
            self._release(ch, line, at)
            mon.changed()

    def signal(self, event, line=0, at=None):
        ch, mon = self.ch(event), self.monitor
        with mon.cond:
            self._signal(ch, line, at)
            mon.changed()

    def wait_event(self, event, line=0, at=None):
        ch, mon = self.ch(event), self.monitor
        e = self.ends[event]
        with mon.cond:
            mon.block_until(self.label, lambda: ch.can_wait(e),
                            lambda: ch.why_wait(e, self.program.label), line, at)
            ch.waits[e] += 1

    def sync(self, barrier, line=0, at=None):
        b, mon = self.program.barriers[barrier], self.monitor
        with mon.cond:
            b.arrivals[self.label] += 1
            b.sites[self.label].add(line, at)
            mon.changed()
            mine = b.arrivals[self.label]
            mon.block_until(self.label, lambda: b.met(mine), lambda: b.why(mine), line, at)

    def arrive(self, barrier, line=0, at=None):
        b, mon = self.program.barriers[barrier], self.monitor
        with mon.cond:
            b.arrivals[self.label] += 1
            b.sites[self.label].add(line, at)
            mon.changed()

    # asynchronous mma bookkeeping ------------------------------------------
    def mma(self, a, b, acc=None, reads=()):
        out = torch.matmul(a.float(), b.float())
        if acc is not None:
            out = out + acc
        self.mma_count += 1
        self.in_flight.append((self.mma_count, tuple(reads)))
        return out

    def mma_wait(self, acc, pending=0):
        if pending < len(self.in_flight):
            self.in_flight = self.in_flight[len(self.in_flight) - pending:] if pending else []
        return acc


class CoopAgent(Agent):
    """Cooperative scheduler: every sync verb is a generator; a blocked verb yields what it
    waits for and checks again when the scheduler comes back to it."""

    def __init__(self, *args, scheduler=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.sched = scheduler

    def _block(self, ready, describe, line, at):
        while not ready():
            self.sched.blocked(self, describe, line, at)
            yield
        self.sched.running(self)

    def acquire(self, pipe, line=0, at=None):
        ch = self.ch(pipe)
        if not ch.can_acquire():
            yield from self._block(ch.can_acquire, lambda: ch.why_acquire(self.program.label), line, at)
        self.sched.moves += 1
        return self._acquire(ch, line, at)

    def commit(self, pipe, line=0, at=None):
        self._commit(self.ch(pipe), line, at)
        self.sched.moves += 1
        return
        yield

    def wait(self, pipe, line=0, at=None):
        ch, e = self.ch(pipe), self.ends[pipe]
        if not ch.can_wait(e):
            yield from self._block(lambda: ch.can_wait(e), lambda: ch.why_wait(e, self.program.label),
                                   line, at)
        self.sched.moves += 1
        return self._wait(ch, line, at)

    def release(self, pipe, line=0, at=None):
        self._release(self.ch(pipe), line, at)
        self.sched.moves += 1
        return
        yield

    def signal(self, event, line=0, at=None):
        self._signal(self.ch(event), line, at)
        self.sched.moves += 1
        return
        yield

    def wait_event(self, event, line=0, at=None):
        ch, e = self.ch(event), self.ends[event]
        if not ch.can_wait(e):
            yield from self._block(lambda: ch.can_wait(e), lambda: ch.why_wait(e, self.program.label),
                                   line, at)
        ch.waits[e] += 1
        self.sched.moves += 1

    def sync(self, barrier, line=0, at=None):
        b = self.program.barriers[barrier]
        b.arrivals[self.label] += 1
        b.sites[self.label].add(line, at)
        self.sched.moves += 1
        mine = b.arrivals[self.label]
        if not b.met(mine):
            yield from self._block(lambda: b.met(mine), lambda: b.why(mine), line, at)

    def arrive(self, barrier, line=0, at=None):
        b = self.program.barriers[barrier]
        b.arrivals[self.label] += 1
        b.sites[self.label].add(line, at)
        self.sched.moves += 1
        return
        yield


class _Scheduler:
    """Round-robin over generator agents; a round without a move is a stall."""

    def __init__(self):
        self.moves = 0
        self.status: dict = {}

    def blocked(self, ag, describe, line, at):
        self.status[ag.label] = (describe, line, at)

    def running(self, ag):
        self.status.pop(ag.label, None)


# ---------------------------------------------------------------- tile ops on torch
def cdiv(a, b):
    return -(-a // b)


def arange(start, end):
    return torch.arange(start, end, dtype=torch.int32)


def zeros(shape, dtype):
    return torch.zeros(list(shape), dtype=dtype)


def full(shape, value, dtype):
    return torch.full(list(shape), value, dtype=dtype)


def load(tensor, offsets, shape):
    """Tile of ``shape`` at ``offsets``; out-of-bounds elements read as 0 (TMA semantics)."""
    r0, c0 = (int(o) for o in offsets)
    rows, cols = shape
    out = torch.zeros((rows, cols), dtype=tensor.dtype)
    r1, c1 = min(r0 + rows, tensor.shape[0]), min(c0 + cols, tensor.shape[1])
    if r0 < r1 and c0 < c1 and r0 >= 0 and c0 >= 0:
        out[: r1 - r0, : c1 - c0] = tensor[r0:r1, c0:c1]
    return out


def load_scalar(tensor, index):
    return int(tensor[int(index)])


def store(tensor, offsets, value, bounds=None):
    """Write ``value`` at ``offsets``; parts outside the tensor or ``bounds`` are dropped."""
    r0, c0 = (int(o) for o in offsets)
    rows, cols = value.shape
    r_end, c_end = tensor.shape[0], tensor.shape[1]
    if bounds is not None:
        r_end, c_end = min(r_end, int(bounds[0])), min(c_end, int(bounds[1]))
    r1, c1 = min(r0 + rows, r_end), min(c0 + cols, c_end)
    if r0 < r1 and c0 < c1 and r0 >= 0 and c0 >= 0:
        tensor[r0:r1, c0:c1] = value[: r1 - r0, : c1 - c0].to(tensor.dtype)


def trans(x):
    return x.transpose(0, 1)


def reduce_max(x, axis):
    return torch.amax(x, dim=axis)


def reduce_sum(x, axis):
    return torch.sum(x, dim=axis)


def exp2(x):
    return torch.exp2(x)


def log2(x):
    return torch.log2(x)


def where(c, a, b):
    return torch.where(c, torch.as_tensor(a), torch.as_tensor(b))


def maximum(a, b):
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return a if a >= b else b
    return torch.maximum(torch.as_tensor(a), torch.as_tensor(b))


def minimum(a, b):
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return a if a <= b else b
    return torch.minimum(torch.as_tensor(a), torch.as_tensor(b))


# ---------------------------------------------------------------- the grid
_STOP_GRACE_S = 120.0      # one loop iteration's compute, at most, after a timeout

def run_grid(compiled, grid: tuple[int, ...], args: dict, join_timeout: float):
    """Run every program of ``grid`` (threads or the cooperative scheduler)."""
    import itertools

    run = _run_coop if getattr(compiled, "mode", "threads") == "cooperative" else _run_program
    for pid in itertools.product(*(range(g) for g in grid)):
        run(compiled, tuple(pid), grid, args, join_timeout)


def _scalar_note(k, args) -> str:
    shown = [f"{p.name} = {args[p.name]}" for p in k.params if p.kind == "scalar" and p.name in args]
    return ("with " + ", ".join(shown) + "\n") if shown else ""


def _run_coop(compiled, pid, grid, args, join_timeout):
    k, skel = compiled.kernel, compiled.skeleton
    labels = [inst.label for inst in skel.instances]
    program = Program(skel, labels)
    sched = _Scheduler()
    live = []
    for inst in skel.instances:
        ag = CoopAgent(inst.label, inst.replica, pid, grid, program, None, inst.index, k.file,
                       k.name, scheduler=sched)
        live.append((ag, compiled.agent_functions[inst.agent](ag, **args)))
    deadline = time.monotonic() + join_timeout
    done: set = set()
    while len(done) < len(live):
        before = sched.moves
        finished = False
        for ag, gen in live:
            if ag.label in done:
                continue
            try:
                next(gen)
            except StopIteration:
                done.add(ag.label)
                sched.running(ag)
                finished = True
        if sched.moves == before and not finished and len(done) < len(live):
            status = {ag.label: ("done" if ag.label in done else
                                 (sched.status[ag.label][0](),) + sched.status[ag.label][1:])
                      for ag, _ in live}
            raise _stall_error(k.name, k.file, status, _scalar_note(k, args))
        if time.monotonic() > deadline:
            raise LaunchError(f"kernel '{k.name}' program {pid} did not finish within "
                              f"{join_timeout:.0f} s on the CPU emulator",
                              fix="use smaller shapes, or raise XSYNC_CPU_TIMEOUT")
    left = program.leftovers()
    if left:
        raise _leftover_error(k.name, k.file, left, _scalar_note(k, args))


def _run_program(compiled, pid, grid, args, join_timeout):
    k, placement, skel = compiled.kernel, compiled.placement, compiled.skeleton
    labels = [inst.label for inst in skel.instances]
    scalars = _scalar_note(k, args)
    program = Program(skel, labels)
    trace = getattr(_RECORDING, "trace", None)
    if trace is None:
        mon = Monitor(k.name, k.file, labels, scalars)
    else:
        mon = _RecordingMonitor(k.name, k.file, labels, scalars, trace=trace)
        prog = ProgramTrace(pid, labels, _object_infos(skel))
        trace.programs.append(prog)
        trace.kernel_name, trace.file, trace.grid = k.name, k.file, grid

    # the agents compute in the caller's autograd mode (inference_mode, no_grad or not)
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def caller_mode():
        return torch.inference_mode() if inference else torch.set_grad_enabled(grad)

    threads, agents = [], []
    for inst in skel.instances:
        fn = compiled.agent_functions[inst.agent]
        if trace is None:
            ag = Agent(inst.label, inst.replica, pid, grid, program, mon, inst.index, k.file, k.name)
        else:
            ag = _RecordingAgent(inst.label, inst.replica, pid, grid, program, mon, inst.index,
                                 k.file, k.name, trace=trace, program_index=len(trace.programs) - 1)

        def body(fn=fn, ag=ag):
            try:
                if trace is not None:
                    ag.begin()
                with caller_mode():
                    fn(ag, **args)
            except _Aborted:
                pass
            except BaseException as exc:  # noqa: BLE001 - reported by the launcher
                mon.fail(exc)
            finally:
                if trace is not None:
                    ag.end()
                mon.finish(ag.label)
        threads.append(threading.Thread(target=body, name=f"xsync-{inst.label}", daemon=True))
        agents.append(ag)
    for t in threads:
        t.start()
    deadline = time.monotonic() + join_timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        mon.fail(LaunchError(
            f"kernel '{k.name}' program {pid} did not finish within {join_timeout:.0f} s on the CPU "
            f"emulator (agents still computing, none blocked)",
            fix="use smaller shapes, or raise XSYNC_CPU_TIMEOUT"))
        # every agent stops at its next loop iteration or sync call: wait for that, so no
        # thread still computes when the error reaches the caller (or the interpreter exits)
        for t in threads:
            t.join(_STOP_GRACE_S)
    if mon.failure is None:
        left = program.leftovers()
        if left:
            mon.failure = _leftover_error(k.name, k.file, left, scalars)
    if trace is not None:
        for ag in agents:
            prog.ops.extend(ag.ops)
        prog.ops.sort(key=lambda op: (op.t_start, op.t_end))
        prog.error = mon.failure
        _link(prog)
    if mon.failure is not None:
        raise mon.failure


# ---------------------------------------------------------------- opt-in event recorder
# ``with record() as tr: kernel[grid](...)`` records, per agent instance, every sync op
# (with the time it spent blocked) and the work spans between them, and pairs each wait
# with the commit/signal that satisfied it. Off by default: without an active recorder
# the launcher builds the plain Agent/Monitor above and no per-op code runs.
_RECORDING = threading.local()


@dataclass
class Op:
    """One recorded span of one agent instance (times in ns since the trace started).

    kind: acquire commit wait release (pipes), signal evwait (events), sync arrive
    (barriers), or "work" for the computation between two sync ops. ``seq`` is this
    instance's k-th such op on ``obj`` (for barriers: its k-th arrival, sync or arrive).
    ``blocked_ns`` is when the op found it could not proceed (None: it never blocked);
    ``waits_on`` the runtime's account of what it waited for; ``stuck`` marks an op that
    never completed (the program stalled or failed while it waited).
    """

    label: str
    kind: str
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
    commit of its channel's producer (every producer for a gather event); acquire j of a
    producer follows release j - stages of each consumer of its channel; barrier meeting m
    of one member follows arrival m of every other member."""
    info = objects[op.obj]
    if op.kind == "sync":
        return [(op.obj, "arrival", m, op.seq) for m in info.src if m != op.label]
    for prods, cons in info.channels:
        if op.kind == "wait" and op.label in cons:
            return [(op.obj, "commit", prods[0], op.seq)]
        if op.kind == "evwait" and op.label in cons:
            return [(op.obj, "signal", q, op.seq) for q in prods]
        if op.kind == "acquire" and op.label in prods:
            if op.seq < info.stages:
                return []
            return [(op.obj, "release", d, op.seq - info.stages) for d in cons]
    return []


def _link(prog: ProgramTrace):
    index = {}
    for i, op in enumerate(prog.ops):
        if op.obj is None or op.kind == "work":
            continue
        cls = "arrival" if op.kind in ("sync", "arrive") else op.kind
        index[(op.obj, cls, op.label, op.seq)] = i
    for i, op in enumerate(prog.ops):
        if op.obj is None or op.kind not in ("wait", "evwait", "acquire", "sync") or op.stuck:
            continue
        for key in _partners(prog.objects, op):
            j = index.get(key)
            if j is not None:
                prog.pairs.append((j, i))


class _RecordingMonitor(Monitor):
    def __init__(self, *args, trace: Trace):
        super().__init__(*args)
        self.trace = trace
        self.blocked: dict[str, tuple[int, str]] = {}   # label -> (since, what it waits on)

    def block_until(self, label, ready, describe, line, at):
        if not ready():
            self.blocked[label] = (self.trace.now(), describe())
        super().block_until(label, ready, describe, line, at)


class _RecordingAgent(Agent):
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
            self.ops.append(Op(self.label, "work", None, None, lines, self.t_last, t,
                               program=self.program_index))

    def _op(self, kind, obj, line, at, call):
        kline = line or None
        iteration = dict(at or {})
        t0 = self.trace.now()
        self._work(t0, kline)
        cls = "arrival" if kind in ("sync", "arrive") else kind
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
        return self._op("acquire", pipe, line, at, lambda: Agent.acquire(self, pipe, line, at))

    def commit(self, pipe, line=0, at=None):
        return self._op("commit", pipe, line, at, lambda: Agent.commit(self, pipe, line, at))

    def wait(self, pipe, line=0, at=None):
        return self._op("wait", pipe, line, at, lambda: Agent.wait(self, pipe, line, at))

    def release(self, pipe, line=0, at=None):
        return self._op("release", pipe, line, at, lambda: Agent.release(self, pipe, line, at))

    def signal(self, event, line=0, at=None):
        return self._op("signal", event, line, at, lambda: Agent.signal(self, event, line, at))

    def wait_event(self, event, line=0, at=None):
        return self._op("evwait", event, line, at, lambda: Agent.wait_event(self, event, line, at))

    def sync(self, barrier, line=0, at=None):
        return self._op("sync", barrier, line, at, lambda: Agent.sync(self, barrier, line, at))

    def arrive(self, barrier, line=0, at=None):
        return self._op("arrive", barrier, line, at, lambda: Agent.arrive(self, barrier, line, at))


def _object_infos(skel) -> dict[str, SyncObjectInfo]:
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
