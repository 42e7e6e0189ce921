"""The two CPU emulator schedulers (``XSYNC_CPU_MODE``): one thread per agent instance
(``threads``, with the recorder when one is active) or one deterministic round-robin over
generator agents in the calling thread (``cooperative``)."""
from __future__ import annotations

import threading
import time

import torch

from xsync.backends.cpu.agents import Agent, CoopAgent
from xsync.backends.cpu.channels import Aborted, Monitor, Program, at_text, leftover_error, stall_error
from xsync.backends.cpu.watchdog import Deadline, Overtime, position, timeout_error
from xsync.backends.cpu.recording import (ProgramTrace, RecordingAgent, RecordingMonitor, active_trace,
                                          link_pairs, object_infos)
from xsync.errors import LaunchError, SourceLoc, XSyncError
from xsync.lowering.cluster_protocol import ClusterSkeleton, expand
from xsync.lowering.ir import ParamKind
from xsync.lowering.verifier.check import run_time_verdict


class CoopScheduler:
    """Round-robin over generator agents; a round without a move is a stall."""

    def __init__(self):
        self.moves = 0
        self.status: dict = {}
        self.deadline = Deadline(float("inf"))   # the launch's (run_grid sets it)

    def blocked(self, ag, describe, line, at):
        self.status[ag.label] = (describe, line, at)

    def running(self, ag):
        self.status.pop(ag.label, None)



_STOP_GRACE_S = 120.0      # one loop iteration's compute, at most, after a timeout


def run_grid(compiled, grid: tuple[int, ...], args: dict, join_timeout: float):
    """Run every program of ``grid`` (threads or the cooperative scheduler) within one
    wall-clock limit of ``join_timeout`` seconds for the whole launch."""
    import itertools
    import math

    run = _run_coop if getattr(compiled, "mode", "threads") == "cooperative" else _run_program
    deadline = Deadline(join_timeout)
    # the programs of a cluster that share a multicast pipe run together, as one program of
    # the cluster's skeleton (xsync.lowering.cluster_protocol); ``pid`` is then its program 0's
    skel = expand(compiled.kernel, compiled.skeleton)
    step = skel.cluster if isinstance(skel, ClusterSkeleton) else 1
    ranges = [range(0, grid[0], step)] + [range(g) for g in grid[1:]]
    total = math.prod(len(r) for r in ranges)
    for done, pid in enumerate(itertools.product(*ranges)):
        if deadline.passed():
            raise timeout_error(compiled, tuple(pid), deadline, {}, done, total)
        run(compiled, tuple(pid), grid, args, deadline, (done, total), skel)


def _pid(skel, inst, pid: tuple) -> tuple:
    """The program id of ``inst``: in a cluster's skeleton, program p of the cluster at ``pid``."""
    return (pid[0] + inst.program,) + pid[1:] if isinstance(skel, ClusterSkeleton) else pid


def _scalar_note(k, args, skel=None, pid=()) -> str:
    shown = [f"{p.name} = {args[p.name]}" for p in k.params if p.kind is ParamKind.SCALAR and p.name in args]
    if isinstance(skel, ClusterSkeleton):     # the programs of one cluster run together
        shown.append(f"cluster {pid[0] // skel.cluster} (programs {pid[0]}..{pid[0] + skel.cluster - 1} "
                     f"of axis 0)")
    return ("with " + ", ".join(shown) + "\n") if shown else ""


def _verdict(compiled) -> str | None:
    """What the verifier said about this compiled kernel, for a stall or leftover report."""
    return run_time_verdict(getattr(compiled, "lowered", None))


def _run_coop(compiled, pid, grid, args, deadline, progress=(0, 1), skel=None):
    k, skel = compiled.kernel, skel or compiled.skeleton
    labels = [inst.label for inst in skel.instances]
    program = Program(skel, labels)
    sched = CoopScheduler()
    sched.deadline = deadline      # CoopAgent.tick checks it at every loop iteration
    live = []
    for inst in skel.instances:
        ag = CoopAgent(inst.label, inst.replica, _pid(skel, inst, pid), grid, program, None, inst.index, k.file,
                       k.name, scheduler=sched)
        live.append((ag, compiled.agent_functions[inst.agent](ag, **args)))
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
            except Overtime as over:
                raise _coop_overtime(compiled, pid, live, done, sched, ag, over, progress) from None
            except XSyncError:
                raise
            except Exception as exc:  # noqa: BLE001 - the kernel's own code failed
                raise _agent_raised(compiled, pid, ag.label, exc, _innermost_frame(exc.__traceback__),
                                    _scalar_note(k, args, skel, pid)) from exc
        if sched.moves == before and not finished and len(done) < len(live):
            status = {ag.label: ("done" if ag.label in done else
                                 (sched.status[ag.label][0](),) + sched.status[ag.label][1:])
                      for ag, _ in live}
            raise stall_error(k.name, k.file, status, _scalar_note(k, args, skel, pid), _verdict(compiled))
        if deadline.passed():
            raise _coop_overtime(compiled, pid, live, done, sched, None, None, progress)
    left = program.leftovers()
    if left:
        raise leftover_error(k.name, k.file, left, _scalar_note(k, args, skel, pid), _verdict(compiled))
    program.flush_adds()


def _coop_overtime(compiled, pid, live, done, sched, running, over, progress) -> LaunchError:
    """The timeout report of a cooperative program: the agent that was computing (``running``,
    from the frame ``over`` was raised in) and where every other one is suspended."""
    where = {}
    for ag, gen in live:
        if ag.label in done:
            where[ag.label] = ("done", None, None)
            continue
        frame = over.frame if ag is running else gen.gi_frame
        line, at = position(compiled, frame)
        blocked = sched.status.get(ag.label)
        state = ("computing" if ag is running else
                 f"blocked: {blocked[0]()}" if blocked else "ready to run")
        where[ag.label] = (state, line, at)
    return timeout_error(compiled, pid, sched.deadline, where, *progress)


def _run_program(compiled, pid, grid, args, deadline, progress=(0, 1), skel=None):
    k, placement, skel = compiled.kernel, compiled.placement, skel or compiled.skeleton
    labels = [inst.label for inst in skel.instances]
    scalars, verdict = _scalar_note(k, args, skel, pid), _verdict(compiled)
    program = Program(skel, labels)
    trace = active_trace()
    if trace is None:
        mon = Monitor(k.name, k.file, labels, scalars, verdict)
    else:
        mon = RecordingMonitor(k.name, k.file, labels, scalars, verdict, trace=trace)
        prog = ProgramTrace(pid, labels, object_infos(skel))
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
            ag = Agent(inst.label, inst.replica, _pid(skel, inst, pid), grid, program, mon, inst.index,
                       k.file, k.name)
        else:
            ag = RecordingAgent(inst.label, inst.replica, _pid(skel, inst, pid), grid, program, mon, inst.index,
                                 k.file, k.name, trace=trace, program_index=len(trace.programs) - 1)

        def body(fn=fn, ag=ag):
            try:
                if trace is not None:
                    ag.begin()
                with caller_mode():
                    fn(ag, **args)
            except Aborted as stop:
                ag.stopped_at = _innermost_frame(stop.__traceback__)
            except BaseException as exc:  # noqa: BLE001 - reported by the launcher
                ag.stopped_at, ag.stopped_by = _innermost_frame(exc.__traceback__), exc
                mon.fail(exc)
            finally:
                if trace is not None:
                    ag.end()
                mon.finish(ag.label)
        threads.append(threading.Thread(target=body, name=f"xsync-{inst.label}", daemon=True))
        agents.append(ag)
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline.left())
    if any(t.is_alive() for t in threads):
        with mon.cond:
            status, overtime = dict(mon.status), mon.failure is None
            if overtime:
                mon.failure = Aborted("past the deadline")   # the report replaces it below
            mon.cond.notify_all()
        # every agent stops at its next loop iteration or sync call: wait for that, so no
        # thread still computes when the error reaches the caller (or the interpreter exits);
        # each stopped agent left the frame it stopped in, read once its thread is gone
        for t in threads:
            t.join(_STOP_GRACE_S)
        if overtime:
            mon.failure = _threads_overtime(compiled, pid, threads, agents, status, deadline, progress)
    if mon.failure is None:
        left = program.leftovers()
        if left:
            mon.failure = leftover_error(k.name, k.file, left, scalars, verdict)
    if trace is not None:
        for ag in agents:
            prog.ops.extend(ag.ops)
        prog.ops.sort(key=lambda op: (op.t_start, op.t_end))
        prog.error = mon.failure
        link_pairs(prog)
    failure = mon.failure
    if isinstance(failure, Exception) and not isinstance(failure, XSyncError):
        ag = next((a for a in agents if a.stopped_by is failure), None)
        if ag is not None:
            raise _agent_raised(compiled, pid, ag.label, failure, ag.stopped_at, scalars) from failure
    if failure is not None:
        raise failure
    program.flush_adds()


def _innermost_frame(tb):
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame if tb is not None else None


def _agent_raised(compiled, pid, label, exc, frame, scalars) -> LaunchError:
    """An exception the kernel's own code raised in an agent (a division by zero, a torch
    error): reported at the kernel line it ran, with the role and the scalars, not as a
    traceback through the generated source. Every bad argument is refused before launch,
    so this is the kernel's arithmetic."""
    k = compiled.kernel
    line, at = position(compiled, frame)
    text = _first_line(exc)
    return LaunchError(
        f"kernel '{k.name}' raised {type(exc).__name__} in role '{label}' on the CPU emulator "
        f"(program {pid}){at_text(at)}" + (f": {text}" if text else ""),
        loc=SourceLoc(k.file, line, k.name) if line else None, objects=(label,), details=scalars.rstrip(),
        fix="the kernel's own code failed at this line with these scalars: guard the value it "
            "computes (on a GPU the same code gives an undefined result, not an error)")


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's text ("" for none): a report row holds one line."""
    return next(iter(str(exc).splitlines()), "")


def _threads_overtime(compiled, pid, threads, agents, status, deadline, progress) -> LaunchError:
    """The timeout report of a threaded program: each agent's state when the deadline passed
    (``status``, the monitor's) and, for one that was computing, where it stopped. Another
    thread's live frames are never read: CPython 3.11 can crash walking a frame its thread is
    leaving, so each agent records its own (``Agent.stopped_at``)."""
    where = {}
    for t, ag in zip(threads, agents):
        st = status.get(ag.label)
        frame = None if t.is_alive() else ag.stopped_at
        if ag.stopped_by is not None and not t.is_alive():   # its own error, raised past the deadline
            line, at = position(compiled, frame)
            where[ag.label] = (f"failed: {type(ag.stopped_by).__name__}: {_first_line(ag.stopped_by)}",
                               line, at)
        elif st == "done" or (frame is None and not t.is_alive()):   # finished before it saw the stop
            where[ag.label] = ("done", None, None)
        elif isinstance(st, tuple):        # ("blocked", what, line, at)
            line, at = position(compiled, frame)
            where[ag.label] = (f"blocked: {st[1]}", st[2] or line, st[3] if st[3] is not None else at)
        else:
            line, at = position(compiled, frame)
            where[ag.label] = ("computing" if frame is not None else "computing (still running)", line, at)
    return timeout_error(compiled, pid, deadline, where, *progress)
