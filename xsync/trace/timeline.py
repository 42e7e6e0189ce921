"""The trace's model: a :class:`Timeline` of lanes, marks (sync ops), spans (work) and links
(which op let which through), built from a CPU-emulator recording or from a verifier
counterexample. Nothing here draws (``layout`` places, ``drawing`` writes).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum

from xsync.errors import DeadlockError, XSyncError
from xsync.lowering.ir import Verb


class TraceSetupError(XSyncError):
    """`xsync trace` cannot build a run for this kernel (no trace= hook, bad hook result)."""

class OpKind(StrEnum):
    """What a recorded op or a drawn mark is: a sync verb (:class:`~xsync.lowering.ir.Verb`; an
    event's wait is EVENT_WAIT, apart from a pipe's WAIT, as the recorder, the verifier's
    counterexample and the drawing tell them apart), or WORK between two sync ops."""

    ACQUIRE = "acquire"
    COMMIT = "commit"
    WAIT = "wait"            # pipe
    RELEASE = "release"
    SIGNAL = "signal"
    EVENT_WAIT = "evwait"    # event (``xs.wait(ev)``)
    SYNC = "sync"
    ARRIVE = "arrive"
    WORK = "work"            # the computation between two sync ops (recorder only)

    @classmethod
    def of(cls, verb: Verb, *, event: bool = False) -> "OpKind":
        """The kind of a sync op of ``verb`` (on an event when ``event``)."""
        return cls.EVENT_WAIT if event and verb is Verb.WAIT else cls(verb.value)

    @property
    def verb(self) -> Verb | None:
        """The IR verb (None for WORK)."""
        if self is OpKind.WORK:
            return None
        return Verb.WAIT if self is OpKind.EVENT_WAIT else Verb(self.value)


# ====================================================================== the model
VERB_LETTER = {OpKind.ACQUIRE: "A", OpKind.COMMIT: "C", OpKind.WAIT: "W", OpKind.RELEASE: "R",
               OpKind.SIGNAL: "S", OpKind.EVENT_WAIT: "E", OpKind.SYNC: "B", OpKind.ARRIVE: "a"}
VERB_NAME = {"A": "acquire", "C": "commit", "W": "wait (pipe)", "R": "release", "S": "signal",
             "E": "wait (event)", "B": "barrier sync", "a": "barrier arrive"}


def verb_text(verb: OpKind, obj: str) -> str:
    return {OpKind.ACQUIRE: f"{obj}.acquire()", OpKind.COMMIT: f"{obj}.commit()",
            OpKind.WAIT: f"{obj}.wait()", OpKind.RELEASE: f"{obj}.release()",
            OpKind.SIGNAL: f"xs.signal({obj})", OpKind.EVENT_WAIT: f"xs.wait({obj})",
            OpKind.SYNC: f"{obj}.sync()", OpKind.ARRIVE: f"{obj}.arrive()"}.get(verb, f"{verb} {obj}")


@dataclass
class Mark:
    """A sync op on a lane; [t, t_end] in axis units (µs, or step slots)."""

    lane: int
    t: float
    t_end: float
    verb: OpKind
    obj: str
    text: str                     # e.g. "tiles.wait()  line 45 (t=0, k=16)"
    stall_from: float | None = None
    stuck: bool = False
    waits_on: str = ""


@dataclass
class Span:
    lane: int
    t0: float
    t1: float
    tip: str = ""


class LinkKind(StrEnum):
    """What a :class:`Link` draws."""

    PAIR = "pair"            # a commit/signal/release/arrival -> the op it let through
    WAITS_ON = "waits-on"    # a stuck op -> the lane it needs


@dataclass
class Link:
    src: int                      # index into marks: the commit/signal/release/arrival
    dst: int                      # the wait/acquire/sync it let through
    ended_stall: bool = False
    kind: LinkKind = LinkKind.PAIR


@dataclass
class Timeline:
    title: str
    subtitle: str
    lanes: list[str]
    lane_info: list[str]
    marks: list[Mark] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    objects: dict[str, str] = field(default_factory=dict)    # name -> "pipe load -> mma, 2 stages"
    unit: str = "µs"                                          # "µs" or "step"
    separators: list[tuple[float, str]] = field(default_factory=list)
    finished: dict[int, float] = field(default_factory=dict)  # lane -> slot of "finished" tag
    footer: list[str] = field(default_factory=list)
    deadlock: bool = False

    @property
    def stuck_lanes(self) -> list[str]:
        return sorted({self.lanes[m.lane] for m in self.marks if m.stuck},
                      key=self.lanes.index)

    def t_max(self) -> float:
        ends = [m.t_end for m in self.marks] + [s.t1 for s in self.spans] + [1.0]
        return max(ends)


def object_notes(kernel) -> dict[str, str]:
    out = {}
    for p in kernel.pipes:
        out[p.name] = f"pipe {p.src} -> {p.dst}, {p.stages} stage(s)"
    for e in kernel.events:
        out[e.name] = f"event {e.src} -> {e.dst}"
    for b in kernel.barriers:
        out[b.name] = "barrier of every role" if b.all_roles else f"barrier of {', '.join(b.members)}"
    return out


def spec_text(constexprs: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(constexprs.items()))


def _iters(it: dict) -> str:
    return "(" + ", ".join(f"{k}={v}" for k, v in it.items()) + ")" if it else ""


def from_recording(tr, kernel_ir, placement, constexprs: dict) -> Timeline:
    """Timeline of a recorded CPU-emulator run (``runtime.record()``)."""
    lanes: list[str] = []
    for prog in tr.programs:
        for lb in prog.labels:
            if lb not in lanes:
                lanes.append(lb)
    starts = [op.t_start for prog in tr.programs for op in prog.ops]
    t0 = min(starts) if starts else 0
    us = lambda ns: (ns - t0) / 1000.0  # noqa: E731
    from xsync.lowering.cluster_protocol import expand
    from xsync.lowering.protocol import derive

    # a cluster with a multicast pipe runs its programs together (lanes per program)
    by_label = {inst.label: inst for inst in expand(kernel_ir, derive(kernel_ir, placement)).instances}
    info = []
    for lb in lanes:
        inst = by_label.get(lb)
        info.append(f"{inst.hardware}: {', '.join(inst.roles)}" if inst else "")
    tl = Timeline(
        title=f"xsync trace  {kernel_ir.name}  on the CPU emulator",
        subtitle=f"grid {tuple(tr.grid)}   {spec_text(constexprs)}   ({os.path.basename(kernel_ir.file)})",
        lanes=lanes, lane_info=info, objects=object_notes(kernel_ir))
    stalled = [0.0] * len(lanes)
    for prog in tr.programs:
        if len(tr.programs) > 1 and prog.ops:
            tl.separators.append((us(min(op.t_start for op in prog.ops)), f"program {prog.pid}"))
        index = {}
        for oi, op in enumerate(prog.ops):
            lane = lanes.index(op.label)
            if op.kind is OpKind.WORK:
                tip = "work" + (f" lines {op.iteration.get('from', '')}-{op.iteration.get('to', '')}"
                                if op.iteration else "")
                tl.spans.append(Span(lane, us(op.t_start), us(op.t_end), tip))
                continue
            text = verb_text(op.kind, op.obj)
            if op.line:
                text += f"  line {op.line}"
            if op.iteration:
                text += f" {_iters(op.iteration)}"
            stall_from = us(op.blocked_ns) if op.blocked_ns is not None else None
            if stall_from is not None:
                stalled[lane] += op.stalled_ns / 1000.0
            index[oi] = len(tl.marks)
            tl.marks.append(Mark(lane, us(op.t_start), us(op.t_end), op.kind, op.obj, text,
                                 stall_from, op.stuck, op.waits_on))
        for j, i in prog.pairs:
            if i in index and j in index:
                dst = tl.marks[index[i]]
                tl.links.append(Link(index[j], index[i], ended_stall=dst.stall_from is not None))
        if prog.error is not None:
            tl.footer.append(f"program {prog.pid}: {type(prog.error).__name__}: "
                             + str(prog.error).splitlines()[0])
    total = max(tl.t_max(), 1e-9)
    for i, s in enumerate(stalled):
        if s > 0:
            tl.lane_info[i] += f"   stalled {fmt_us(s)} ({100 * s / total:.0f}%)"
    return tl


def fmt_us(v: float) -> str:
    if v >= 1000:
        return f"{v / 1000:.2f} ms"
    return f"{v:.0f} µs"


def from_counterexample(kir, found, err: DeadlockError, constexprs) -> Timeline:
    """Draw a verifier counterexample (``xsync.lowering.verify.Counterexample``)."""
    tl = Timeline(
        title=f"xsync trace  {kir.name}  DEADLOCK on the {found.backend} placement (verifier counterexample)",
        subtitle=(f"{spec_text(constexprs)}   {found.scalars}" if found.scalars else spec_text(constexprs)),
        lanes=list(found.lanes), lane_info=list(found.lane_info), objects=object_notes(kir),
        unit="step", deadlock=True)
    marks = []
    for k, st in enumerate(found.steps, 1):
        it = ", ".join(f"{v}={n}" for v, n in st.iters)
        text = f"{verb_text(OpKind(st.verb), st.obj)}  line {st.line}" + (f" ({it})" if it else "")
        marks.append(len(tl.marks))
        for j in st.enabled_by:
            tl.links.append(Link(marks[j], marks[-1]))
        tl.marks.append(Mark(st.lane, float(k), float(k), OpKind(st.verb), st.obj, text))
    stuck_slot = float(len(found.steps) + 1)
    for lane in found.finished:
        tl.finished[lane] = stuck_slot
    for st in found.stuck:
        it = ", ".join(f"{v}={n}" for v, n in st.iters)
        text = f"{verb_text(OpKind(st.verb), st.obj)}  line {st.line}" + (f" ({it})" if it else "")
        mi = len(tl.marks)
        tl.marks.append(Mark(st.lane, stuck_slot, stuck_slot, OpKind(st.verb), st.obj, text, stuck=True,
                             waits_on=st.why))
        for lane in st.waits_on:
            tl.links.append(Link(mi, -1 - lane, kind=LinkKind.WAITS_ON))
    tl.footer = [f"{err.loc}: {err.what}"] + ([f"fix: {err.fix}"] if err.fix else [])
    return tl

