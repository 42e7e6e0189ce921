"""What generated CPU agent code calls: the sync verbs of one agent instance.

:class:`Agent` blocks under the program's condition variable (threads scheduler);
:class:`CoopAgent` turns every verb into a generator for the cooperative scheduler.
"""
from __future__ import annotations

import sys

import torch

from xsync.backends.cpu.channels import Aborted, Program, at_text
from xsync.backends.cpu.watchdog import Overtime
from xsync.errors import ProtocolError, SlotOrderError, SourceLoc


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
        self.stopped_at = None   # the frame it stopped in once the program failed (threads)
        self.stopped_by = None   # the error it raised itself, if that is what stopped it
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
            raise Aborted()

    def program_id(self, axis):
        # an axis the launch's grid leaves out is size 1, as on the GPU (a 1-D grid's axis 1)
        return self.pid[axis] if axis < len(self.pid) else 0

    def num_programs(self, axis):
        return self.grid[axis] if axis < len(self.grid) else 1

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
            details=(f"at iteration {at_text(at).strip()[1:-1]}\n" if at else ""),
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
        b, mon = self.program.barrier(barrier, self.instance), self.monitor
        with mon.cond:
            b.arrivals[self.label] += 1
            b.sites[self.label].add(line, at)
            mon.changed()
            mine = b.arrivals[self.label]
            mon.block_until(self.label, lambda: b.met(mine), lambda: b.why(mine), line, at)

    def arrive(self, barrier, line=0, at=None):
        b, mon = self.program.barrier(barrier, self.instance), self.monitor
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

    # reduce-add, deterministic ------------------------------------------------
    def store_add_ordered(self, tensor, offsets, value, bounds=None):
        """``xs.store(..., reduce="add", deterministic=True)``: queue the add; the program adds
        its queue at its end, agent instance by instance (skeleton order), each in program
        order -- the same order whatever the threads did (:meth:`Program.flush_adds`)."""
        self.program.queue_add(self.instance, (tensor, [int(o) for o in offsets], value.clone(),
                                               None if bounds is None else [int(b) for b in bounds]))


class CoopAgent(Agent):
    """Cooperative scheduler: every sync verb is a generator; a blocked verb yields what it
    waits for and checks again when the scheduler comes back to it."""

    def __init__(self, *args, scheduler=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.sched = scheduler

    def tick(self):
        """Every loop iteration: a generator that computes without a sync verb never returns
        to the scheduler, so the launch's deadline is checked here."""
        if self.sched is not None and self.sched.deadline.passed():
            raise Overtime(sys._getframe(1))

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
        b = self.program.barrier(barrier, self.instance)
        b.arrivals[self.label] += 1
        b.sites[self.label].add(line, at)
        self.sched.moves += 1
        mine = b.arrivals[self.label]
        if not b.met(mine):
            yield from self._block(lambda: b.met(mine), lambda: b.why(mine), line, at)

    def arrive(self, barrier, line=0, at=None):
        b = self.program.barrier(barrier, self.instance)
        b.arrivals[self.label] += 1
        b.sites[self.label].add(line, at)
        self.sched.moves += 1
        return
        yield

