"""CPU emulator runtime: threads, exact sync semantics, torch tile ops, stall watchdog.

Every agent instance of a program is a thread. All sync objects of a program share one
condition variable, so the runtime always knows who waits on what: when every live
agent is blocked, no signal can ever arrive, and the watchdog raises a StallError that
names each agent, the object it waits on, the kernel line and the loop iteration —
within milliseconds, instead of hanging.

``with record() as trace:`` turns on an event recorder for launches from this thread:
each agent instance logs its sync ops (with the time spent blocked and what it waited
on) and the work spans between them, and every wait/acquire/barrier sync is paired with
the commit/signal/release/arrival that let it through (``xsync trace`` draws this).
Without an active recorder the launcher builds the plain Agent and Monitor: no per-op cost.
"""
from __future__ import annotations

import re
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from xsync.errors import LaunchError, ProtocolError, SourceLoc, StallError

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                "int32": torch.int32, "int1": torch.bool}


class _Aborted(Exception):
    """Raised in agents when another agent failed or the program stalled."""


class Monitor:
    def __init__(self, kernel_name: str, file: str, labels: list[str]):
        self.cond = threading.Condition()
        self.kernel_name = kernel_name
        self.file = file
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
                self.failure = self._stall_error()
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

    def _stall_error(self) -> StallError:
        lines, first_line, objects = [], None, []
        width = max(len(k) for k in self.status)
        for label, s in self.status.items():
            if s == "done":
                lines.append(f"{label:<{width}}  finished")
                continue
            _, what, line, at = s
            first_line = first_line or line
            it = (" (" + ", ".join(f"{k}={v}" for k, v in at.items()) + ")") if at else ""
            lines.append(f"{label:<{width}}  line {line}{it}: {what}")
            objects.append(label)
        return StallError(
            f"kernel '{self.kernel_name}' stalled on the CPU emulator: every live agent waits "
            f"and no signal can arrive", loc=SourceLoc(self.file, first_line or 0, self.kernel_name),
            objects=tuple(objects), details="\n".join(lines),
            fix=("run `python -m xsync check module:kernel` for the counterexample; the verifier "
                 "was off (XSYNC_VERIFY=0) or the stall depends on run-time values"))


class PipeRT:
    """Ring of ``stages`` slots; 1 -> N broadcast or N -> N paired by replica."""

    def __init__(self, mon: Monitor, name: str, stages: int, n_src: int, n_dst: int):
        self.mon, self.name, self.stages = mon, name, stages
        self.paired = n_src == n_dst and n_src > 1
        self.acquired = [0] * n_src
        self.committed = [0] * n_src
        self.waited = [0] * n_dst
        self.released = [0] * n_dst
        self.n_dst = n_dst
        self.ring = [[{} for _ in range(stages)] for _ in range(n_src)]

    def _consumers(self, q):
        return [q] if self.paired else range(self.n_dst)

    def _producer(self, r):
        return r if self.paired else 0

    def acquire(self, label, q, line, at):
        with self.mon.cond:
            def free():
                return all(self.acquired[q] - self.released[r] < self.stages for r in self._consumers(q))

            def what():
                low = min(self._consumers(q), key=lambda r: self.released[r])
                return (f"acquire on pipe '{self.name}': all {self.stages} slot(s) in use "
                        f"({self.acquired[q]} acquired, {self.released[low]} released by consumer {low})")
            self.mon.block_until(label, free, what, line, at)
            slot = self.ring[q][self.acquired[q] % self.stages]
            self.acquired[q] += 1
            return slot

    def commit(self, label, q):
        with self.mon.cond:
            self.committed[q] += 1
            self.mon.changed()

    def wait(self, label, r, line, at):
        q = self._producer(r)
        with self.mon.cond:
            self.mon.block_until(
                label, lambda: self.waited[r] < self.committed[q],
                lambda: (f"wait on pipe '{self.name}': slot {self.waited[r]} not committed "
                         f"({self.committed[q]} committed by the producer)"), line, at)
            slot = self.ring[q][self.waited[r] % self.stages]
            self.waited[r] += 1
            return slot

    def release(self, label, r):
        with self.mon.cond:
            self.released[r] += 1
            self.mon.changed()


class EventRT:
    """Counting event: 1 -> N broadcast, N -> 1 gather (needs all N), N -> N paired."""

    def __init__(self, mon: Monitor, name: str, n_src: int, n_dst: int):
        self.mon, self.name = mon, name
        self.paired = n_src == n_dst and n_src > 1
        self.signals = [0] * n_src
        self.waits = [0] * n_dst

    def signal(self, label, q):
        with self.mon.cond:
            self.signals[q] += 1
            self.mon.changed()

    def wait(self, label, r, line, at):
        srcs = [r] if self.paired else range(len(self.signals))
        with self.mon.cond:
            self.mon.block_until(
                label, lambda: self.waits[r] < min(self.signals[q] for q in srcs),
                lambda: (f"wait on event '{self.name}': signal {self.waits[r] + 1} not sent "
                         f"({min(self.signals[q] for q in srcs)} sent)"), line, at)
            self.waits[r] += 1


class BarrierRT:
    def __init__(self, mon: Monitor, name: str, members: list[str]):
        self.mon, self.name = mon, name
        self.arrivals = {m: 0 for m in members}

    def arrive(self, label):
        with self.mon.cond:
            self.arrivals[label] += 1
            self.mon.changed()

    def sync(self, label, line, at):
        with self.mon.cond:
            self.arrivals[label] += 1
            self.mon.changed()
            mine = self.arrivals[label]
            self.mon.block_until(
                label, lambda: min(self.arrivals.values()) >= mine,
                lambda: (f"sync on barrier '{self.name}' (meeting {mine}): waiting for "
                         + ", ".join(m for m, n in self.arrivals.items() if n < mine)), line, at)


class Agent:
    """What generated agent code calls: sync verbs for one agent instance, plus ids."""

    def __init__(self, label: str, replica: int, pid: tuple[int, ...], grid: tuple[int, ...],
                 objects: dict, monitor: Monitor):
        self.label, self.replica, self.pid, self.grid = label, replica, pid, grid
        self.objects, self.monitor = objects, monitor
        self.in_flight: list[tuple[int, tuple]] = []   # (mma id, slots it reads)
        self.mma_count = 0
        self.held: dict[str, list] = {}   # pipe -> slots waited and not yet released (FIFO)

    def program_id(self, axis):
        return self.pid[axis]

    def num_programs(self, axis):
        return self.grid[axis]

    # sync verbs -------------------------------------------------------
    def acquire(self, pipe, line, at=None):
        return self.objects[pipe].acquire(self.label, self.replica, line, at)

    def commit(self, pipe):
        self.objects[pipe].commit(self.label, self.replica)

    def wait(self, pipe, line, at=None):
        slot = self.objects[pipe].wait(self.label, self.replica, line, at)
        self.held.setdefault(pipe, []).append(slot)
        return slot

    def release(self, pipe, line):
        """Release the oldest slot this agent waited for and still holds (FIFO, as on hardware)."""
        queue = self.held.get(pipe)
        slot = queue.pop(0) if queue else None
        for _, reads in self.in_flight:
            if any(s is slot for s in reads):
                raise ProtocolError(
                    f"{self.label} releases a slot of pipe '{pipe}' while an xs.mma that reads it "
                    f"is still in flight", loc=SourceLoc(self.monitor.file, line, self.monitor.kernel_name),
                    objects=(pipe, self.label),
                    fix="call xs.mma_wait(acc, pending=0) (or a pending count that retires that mma) "
                        "before releasing the slot")
        self.objects[pipe].release(self.label, self.replica)

    def signal(self, event):
        self.objects[event].signal(self.label, self.replica)

    def wait_event(self, event, line, at=None):
        self.objects[event].wait(self.label, self.replica, line, at)

    def sync(self, barrier, line, at=None):
        self.objects[barrier].sync(self.label, line, at)

    def arrive(self, barrier):
        self.objects[barrier].arrive(self.label)

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
def run_grid(compiled, grid: tuple[int, ...], args: dict, join_timeout: float):
    """Run every program of ``grid``; each program's agent instances run as threads."""
    import itertools

    for pid in itertools.product(*(range(g) for g in grid)):
        _run_program(compiled, tuple(pid), grid, args, join_timeout)


def _run_program(compiled, pid, grid, args, join_timeout):
    k, placement = compiled.kernel, compiled.placement
    labels = []
    for a in placement.agents:
        labels += [a.name if a.replicas == 1 else f"{a.name}[{r}]" for r in range(a.replicas)]
    trace = getattr(_RECORDING, "trace", None)
    if trace is None:
        mon = Monitor(k.name, k.file, labels)
    else:
        mon = _RecordingMonitor(k.name, k.file, labels, trace=trace)
        table = getattr(compiled, "_trace_lines", None)
        if table is None:
            table = compiled._trace_lines = _line_table(compiled)
        by_agent = {a.name: [lb for lb in labels if lb.split("[")[0] == a.name] for a in placement.agents}
        prog = ProgramTrace(pid, labels, _object_infos(
            k, lambda role: by_agent[placement.agent_of(role).name]))
        trace.programs.append(prog)
        trace.kernel_name, trace.file, trace.grid = k.name, k.file, grid
    objects = {}
    for p in k.pipes:
        objects[p.name] = PipeRT(mon, p.name, p.stages, k.role(p.src).replicas, k.role(p.dst).replicas)
    for e in k.events:
        objects[e.name] = EventRT(mon, e.name, k.role(e.src).replicas, k.role(e.dst).replicas)
    for b in k.barriers:
        members = [lb for a in placement.agents if set(a.roles) & set(b.members)
                   for lb in labels if lb.split("[")[0] == a.name]
        objects[b.name] = BarrierRT(mon, b.name, members)

    threads, agents = [], []
    for a in placement.agents:
        fn = compiled.agent_functions[a.name]
        for r in range(a.replicas):
            label = a.name if a.replicas == 1 else f"{a.name}[{r}]"
            if trace is None:
                ag = Agent(label, r, pid, grid, objects, mon)
            else:
                ag = _RecordingAgent(label, r, pid, grid, objects, mon, trace=trace, table=table,
                                     program=len(trace.programs) - 1)

            def body(fn=fn, ag=ag):
                try:
                    if trace is not None:
                        ag.begin()
                    fn(ag, **args)
                except _Aborted:
                    pass
                except BaseException as exc:  # noqa: BLE001 - reported by the launcher
                    mon.fail(exc)
                finally:
                    if trace is not None:
                        ag.end()
                    mon.finish(ag.label)
            threads.append(threading.Thread(target=body, name=f"xsync-{label}", daemon=True))
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
_SYNC_CALL = re.compile(r"\bag\.(acquire|commit|wait_event|wait|release|signal|sync|arrive)\(")


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


def _partners(objects: dict, op: Op, endpoint: dict) -> list[tuple]:
    """Keys (obj, class, label, seq) of the ops that let ``op`` complete.

    The pairing rules are the runtime's: the k-th wait of consumer r follows the k-th
    commit of its producer (every producer for a gather event); acquire j of a producer
    follows release j - stages of each consumer it feeds; barrier meeting m of one member
    follows arrival m of every other member."""
    info = objects[op.obj]
    me = endpoint[op.label]
    paired = len(info.src) == len(info.dst) and len(info.src) > 1
    if op.kind == "wait":
        src = info.src[me] if paired else info.src[0]
        return [(op.obj, "commit", src, op.seq)]
    if op.kind == "evwait":
        srcs = [info.src[me]] if paired else info.src
        return [(op.obj, "signal", s, op.seq) for s in srcs]
    if op.kind == "acquire":
        if op.seq < info.stages:
            return []
        dsts = [info.dst[me]] if paired else info.dst
        return [(op.obj, "release", d, op.seq - info.stages) for d in dsts]
    if op.kind == "sync":
        return [(op.obj, "arrival", m, op.seq) for m in info.src if m != op.label]
    return []


def _link(prog: ProgramTrace):
    endpoint = {}
    for info in prog.objects.values():
        for side in (info.src, info.dst):
            for i, lb in enumerate(side):
                endpoint.setdefault(lb, i)
    index = {}
    for i, op in enumerate(prog.ops):
        if op.obj is None or op.kind == "work":
            continue
        cls = "arrival" if op.kind in ("sync", "arrive") else op.kind
        index[(op.obj, cls, op.label, op.seq)] = i
    for i, op in enumerate(prog.ops):
        if op.obj is None or op.kind not in ("wait", "evwait", "acquire", "sync") or op.stuck:
            continue
        for key in _partners(prog.objects, op, endpoint):
            j = index.get(key)
            if j is not None:
                prog.pairs.append((j, i))


def _line_table(compiled) -> dict[int, tuple[int | None, tuple[str, ...]]]:
    """Generated-source line -> (kernel line, enclosing loop variables) for each sync call."""
    from xsync.lowering import ir
    from xsync.lowering.slicing import slice_agent

    def sync_ops(stmts):
        for s in stmts:
            if isinstance(s, ir.SyncOp):
                yield s
            elif isinstance(s, (ir.RoleBlock, ir.For)):
                yield from sync_ops(s.body)
            elif isinstance(s, ir.If):
                yield from sync_ops(s.body)
                yield from sync_ops(s.orelse)

    per_agent = {a.name: [s.loc.line for s in sync_ops(slice_agent(compiled.kernel.body, a.roles))]
                 for a in compiled.placement.agents}
    table, agent, found, loops = {}, None, [], []
    for no, text in enumerate(compiled.source.splitlines(), 1):
        stripped = text.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(text) - len(stripped)
        while loops and loops[-1][0] >= indent:
            loops.pop()
        m = re.match(r"def agent_(\w+)\(", stripped)
        if m and indent == 0:
            agent, found, loops = m.group(1), [], []
            continue
        m = re.match(r"for (\w+) in ", stripped)
        if m:
            loops.append((indent, m.group(1)))
        if agent is not None and _SYNC_CALL.search(stripped):
            lines = per_agent.get(agent, [])
            kline = lines[len(found)] if len(found) < len(lines) else None
            found.append(no)
            table[no] = (kline, tuple(v for _, v in loops))
    return table


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

    def __init__(self, *args, trace: Trace, table: dict, program: int):
        super().__init__(*args)
        self.trace, self.table, self.program = trace, table, program
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
                               program=self.program))

    def _op(self, kind, obj, call):
        frame = sys._getframe(2)
        kline, loop_vars = self.table.get(frame.f_lineno, (None, ()))
        loc = frame.f_locals
        iteration = {v: loc[v] for v in loop_vars if v in loc}
        t0 = self.trace.now()
        self._work(t0, kline)
        cls = "arrival" if kind in ("sync", "arrive") else kind
        seq = self.counts.get((obj, cls), 0)
        self.counts[(obj, cls)] = seq + 1
        op = Op(self.label, kind, obj, kline, iteration, t0, t0, seq, program=self.program)
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

    def acquire(self, pipe, line, at=None):
        return self._op("acquire", pipe, lambda: Agent.acquire(self, pipe, line, at))

    def commit(self, pipe):
        return self._op("commit", pipe, lambda: Agent.commit(self, pipe))

    def wait(self, pipe, line, at=None):
        return self._op("wait", pipe, lambda: Agent.wait(self, pipe, line, at))

    def release(self, pipe, line):
        return self._op("release", pipe, lambda: Agent.release(self, pipe, line))

    def signal(self, event):
        return self._op("signal", event, lambda: Agent.signal(self, event))

    def wait_event(self, event, line, at=None):
        return self._op("evwait", event, lambda: Agent.wait_event(self, event, line, at))

    def sync(self, barrier, line, at=None):
        return self._op("sync", barrier, lambda: Agent.sync(self, barrier, line, at))

    def arrive(self, barrier):
        return self._op("arrive", barrier, lambda: Agent.arrive(self, barrier))


def _object_infos(k, labels_of) -> dict[str, SyncObjectInfo]:
    out = {}
    for p in k.pipes:
        out[p.name] = SyncObjectInfo(p.name, "pipe", labels_of(p.src), labels_of(p.dst), p.stages)
    for e in k.events:
        out[e.name] = SyncObjectInfo(e.name, "event", labels_of(e.src), labels_of(e.dst))
    for b in k.barriers:
        members = [lb for r in b.members for lb in labels_of(r)]
        out[b.name] = SyncObjectInfo(b.name, "barrier", members, members)
    return out
