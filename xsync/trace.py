"""`xsync trace`: draw what the agents of a kernel did, as a timeline (SVG or PNG).

    xsync trace MODULE:KERNEL [--out file.svg|file.png] [--set NAME=VALUE ...] [--grid 1,2]

A kernel that passes the verifier is run on the CPU emulator with small shapes under the
runtime's event recorder (``xsync.backends.cpu.runtime.record``) and drawn as one lane
per agent instance (role replica): grey bars are work between sync ops, lettered marks
are sync ops (colour = sync object), red bars are stalls (time an op spent blocked), and
arrows run from each commit / signal / release / barrier arrival to the op it unblocked
(bold when it ended a stall). A kernel the verifier rejects with a deadlock is not run:
its counterexample interleaving is drawn the same way, one step per time slot, with the
stuck ops in red and what each waits on.

Small shapes come from the kernel's ``trace=`` hook::

    def _trace_args(settings):            # settings: the --set values, e.g. {"STAGES": 3}
        cx = dict(BM=16, BN=16, BK=16, STAGES=2) | settings
        a, b = torch.randn(16, 64).bfloat16(), torch.randn(64, 32).bfloat16()
        c = torch.zeros(16, 32)
        return (1, 2), (a, b, c, 16, 32, 64), cx      # grid, positional args, keywords

    @xs.kernel(example=dict(...), trace=_trace_args)
    def gemm(a, b, c, M, N, K, BM: xs.constexpr, ...): ...

The drawing is a list of primitives (rectangles, lines, arrows, text) laid out once and
written either as hand-built SVG or, through Pillow (the ``trace`` extra), as PNG.
Files are written atomically (temporary file + rename).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from xsync.errors import DeadlockError, StallError, XSyncError
from xsync.files import write_atomic


class TraceSetupError(XSyncError):
    """`xsync trace` cannot build a run for this kernel (no trace= hook, bad hook result)."""


# ====================================================================== the model
VERB_LETTER = {"acquire": "A", "commit": "C", "wait": "W", "release": "R", "signal": "S",
               "evwait": "E", "sync": "B", "arrive": "a", "bar_arrive": "a", "bar_wait": "B"}
VERB_NAME = {"A": "acquire", "C": "commit", "W": "wait (pipe)", "R": "release", "S": "signal",
             "E": "wait (event)", "B": "barrier sync", "a": "barrier arrive"}


def verb_text(verb: str, obj: str) -> str:
    return {"acquire": f"{obj}.acquire()", "commit": f"{obj}.commit()", "wait": f"{obj}.wait()",
            "release": f"{obj}.release()", "signal": f"xs.signal({obj})",
            "evwait": f"xs.wait({obj})", "sync": f"{obj}.sync()", "arrive": f"{obj}.arrive()",
            "bar_arrive": f"{obj}.arrive", "bar_wait": f"{obj}.sync"}.get(verb, f"{verb} {obj}")


@dataclass
class Mark:
    """A sync op on a lane; [t, t_end] in axis units (µs, or step slots)."""

    lane: int
    t: float
    t_end: float
    verb: str
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


@dataclass
class Link:
    src: int                      # index into marks: the commit/signal/release/arrival
    dst: int                      # the wait/acquire/sync it let through
    ended_stall: bool = False
    kind: str = "pair"            # "pair" or "waits-on" (a stuck op -> the lane it needs)


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


def _objects(kernel) -> dict[str, str]:
    out = {}
    for p in kernel.pipes:
        out[p.name] = f"pipe {p.src} -> {p.dst}, {p.stages} stage(s)"
    for e in kernel.events:
        out[e.name] = f"event {e.src} -> {e.dst}"
    for b in kernel.barriers:
        out[b.name] = "barrier of every role" if b.all_roles else f"barrier of {', '.join(b.members)}"
    return out


def _spec_text(constexprs: dict) -> str:
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
    from xsync.lowering.protocol import derive

    by_label = {inst.label: inst for inst in derive(kernel_ir, placement).instances}
    info = []
    for lb in lanes:
        inst = by_label.get(lb)
        info.append(f"{inst.hardware}: {', '.join(inst.roles)}" if inst else "")
    tl = Timeline(
        title=f"xsync trace  {kernel_ir.name}  on the CPU emulator",
        subtitle=f"grid {tuple(tr.grid)}   {_spec_text(constexprs)}   ({os.path.basename(kernel_ir.file)})",
        lanes=lanes, lane_info=info, objects=_objects(kernel_ir))
    stalled = [0.0] * len(lanes)
    for prog in tr.programs:
        if len(tr.programs) > 1 and prog.ops:
            tl.separators.append((us(min(op.t_start for op in prog.ops)), f"program {prog.pid}"))
        index = {}
        for oi, op in enumerate(prog.ops):
            lane = lanes.index(op.label)
            if op.kind == "work":
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
            tl.lane_info[i] += f"   stalled {_fmt_us(s)} ({100 * s / total:.0f}%)"
    return tl


def _fmt_us(v: float) -> str:
    if v >= 1000:
        return f"{v / 1000:.2f} ms"
    return f"{v:.0f} µs"


# ---------------------------------------------------------------- deadlock counterexamples
def counterexample(kernel, constexprs: dict, dtypes: dict, backend: str = "cpu"):
    """Verify ``kernel`` on ``backend`` and return (Timeline, DeadlockError) for the deadlock
    the verifier reports, or None when the protocol does not deadlock there."""
    from xsync.lowering.frontend import parse_kernel
    from xsync.backends import place
    from xsync.lowering.verify import verify

    kir = parse_kernel(kernel.fn, dict(constexprs), dict(dtypes))
    try:
        verify(kir, place(kir, backend))
    except DeadlockError as err:
        return _deadlock_timeline(kir, err.counterexample, err, constexprs), err
    return None


def _deadlock_timeline(kir, found, err: DeadlockError, constexprs) -> Timeline:
    """Draw a verifier counterexample (``xsync.lowering.verify.Counterexample``)."""
    tl = Timeline(
        title=f"xsync trace  {kir.name}  DEADLOCK on the {found.backend} placement (verifier counterexample)",
        subtitle=(f"{_spec_text(constexprs)}   {found.scalars}" if found.scalars else _spec_text(constexprs)),
        lanes=list(found.lanes), lane_info=list(found.lane_info), objects=_objects(kir),
        unit="step", deadlock=True)
    marks = []
    for k, st in enumerate(found.steps, 1):
        it = ", ".join(f"{v}={n}" for v, n in st.iters)
        text = f"{verb_text(st.verb, st.obj)}  line {st.line}" + (f" ({it})" if it else "")
        marks.append(len(tl.marks))
        for j in st.enabled_by:
            tl.links.append(Link(marks[j], marks[-1]))
        tl.marks.append(Mark(st.lane, float(k), float(k), st.verb, st.obj, text))
    stuck_slot = float(len(found.steps) + 1)
    for lane in found.finished:
        tl.finished[lane] = stuck_slot
    for st in found.stuck:
        it = ", ".join(f"{v}={n}" for v, n in st.iters)
        text = f"{verb_text(st.verb, st.obj)}  line {st.line}" + (f" ({it})" if it else "")
        mi = len(tl.marks)
        tl.marks.append(Mark(st.lane, stuck_slot, stuck_slot, st.verb, st.obj, text, stuck=True,
                             waits_on=st.why))
        for lane in st.waits_on:
            tl.links.append(Link(mi, -1 - lane, kind="waits-on"))
    tl.footer = [f"{err.loc}: {err.what}"] + ([f"fix: {err.fix}"] if err.fix else [])
    return tl


# ====================================================================== running a trace
@dataclass
class TraceResult:
    timeline: Timeline
    recording: object = None          # runtime.Trace of the run (None for a counterexample)
    error: XSyncError | None = None   # the DeadlockError / StallError that was drawn
    grid: tuple = ()


def _no_hook(kernel) -> TraceSetupError:
    return TraceSetupError(
        f"kernel '{kernel.__name__}' has no trace= hook, so `xsync trace` cannot build small "
        f"arguments to run it (its protocol verifies, so there is no deadlock to draw)",
        fix=("add one to its decorator: @xs.kernel(example=..., trace=make_args) with "
             "def make_args(settings): return grid, args, kwargs — tiny tensors, 1-2 programs, "
             "launched as kernel[grid](*args, **kwargs); see xsync/trace.py or kernels/gemm.py"))


def trace_kernel(kernel, settings: dict | None = None, *, constexprs: dict | None = None,
                 dtypes: dict | None = None, grid=None, backend: str = "cpu") -> TraceResult:
    """Run ``kernel`` small on the CPU emulator under the recorder and build its timeline.

    Without a ``trace=`` hook, or for ``backend`` other than cpu, the protocol is first
    verified for the example specialization (``constexprs``/``dtypes``); a deadlock is
    drawn from the verifier's counterexample, without running anything.
    """
    from xsync.backends.cpu import runtime

    settings = dict(settings or {})
    if constexprs is None or dtypes is None:
        constexprs, dtypes = kernel.specialization()
    if kernel.trace is None or backend != "cpu":
        try:
            kernel.lower(backend, constexprs, dtypes, check=True)
        except DeadlockError as err:
            found = counterexample(kernel, constexprs, dtypes, backend)
            if found is None:
                raise
            return TraceResult(found[0], error=found[1])
        if kernel.trace is None:
            raise _no_hook(kernel)
    made = kernel.trace(settings)
    if not (isinstance(made, tuple) and len(made) == 3):
        raise TraceSetupError(f"trace= hook of '{kernel.__name__}' returned {type(made).__name__}",
                              fix="return (grid, args, kwargs) for kernel[grid](*args, **kwargs)")
    hook_grid, args, kwargs = made
    grid = tuple(grid) if grid is not None else hook_grid
    grid = tuple(grid) if isinstance(grid, (tuple, list)) else (int(grid),)
    kwargs = dict(kwargs)
    kwargs.pop("backend", None)
    _, cx, dts = kernel.bind(tuple(args), kwargs)
    cx = {**{k: v for k, v in constexprs.items() if k not in cx and k in kernel.constexpr_names()}, **cx}
    error = None
    with runtime.record() as tr:
        try:
            compiled = kernel[grid](*args, backend="cpu", **kwargs)
        except DeadlockError:
            found = counterexample(kernel, cx, dts, "cpu")
            if found is None:
                raise
            return TraceResult(found[0], error=found[1], grid=grid)
        except StallError as err:
            error, compiled = err, None
    lowered = compiled.lowered if compiled is not None else kernel.lower("cpu", cx, dts, check=False)
    tl = from_recording(tr, lowered.kernel, lowered.placement, cx)
    if error is not None:
        tl.title = tl.title.replace("on the CPU emulator", "STALLED on the CPU emulator")
    return TraceResult(tl, recording=tr, error=error, grid=grid)


# ====================================================================== layout
@dataclass
class Rect:
    x: float
    y: float
    w: float
    h: float
    fill: str
    stroke: str | None = None
    width: float = 1.0
    dash: bool = False
    tip: str = ""


@dataclass
class Line:
    x1: float
    y1: float
    x2: float
    y2: float
    color: str
    width: float = 1.0
    dash: bool = False
    arrow: bool = False


@dataclass
class Text:
    x: float
    y: float                      # vertical centre of the text
    s: str
    size: float = 12
    color: str = "#222222"
    anchor: str = "start"         # start | middle | end
    bold: bool = False


@dataclass
class Scene:
    width: int
    height: int
    items: list = field(default_factory=list)


PALETTE = ["#1f77b4", "#2ca02c", "#9467bd", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f"]
STALL_FILL, STALL_EDGE, STUCK_FILL = "#f9c6c4", "#d62728", "#ee8784"
WORK_FILL = "#c3c8d0"
LANE_BG = ("#ffffff", "#f3f5f8")
FONT = "DejaVu Sans, Verdana, Arial, Helvetica, sans-serif"


def text_width(s: str, size: float, bold: bool = False) -> float:
    """Conservative width estimate (DejaVu Sans-like metrics) used for layout."""
    return len(s) * size * (0.64 if bold else 0.6)


def _mix(color: str, alpha: float) -> str:
    """``color`` at opacity ``alpha`` over white, as an opaque colour (same in SVG and PNG)."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    r, g, b = (round(255 - (255 - c) * alpha) for c in (r, g, b))
    return f"#{r:02x}{g:02x}{b:02x}"


def _nice_step(span: float, target: int = 10) -> float:
    raw = span / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


LEFT, RIGHT_PAD, TOP, LANE_H = 200, 40, 86, 60
BREAK_PX, BREAK_CUT = 160.0, 56.0


def layout(tl: Timeline) -> Scene:
    """Place every lane, span, mark, stall, link, axis and legend item."""
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(tl.objects)}
    n = len(tl.lanes)
    step_mode = tl.unit == "step"
    items: list = []

    # ---- horizontal mapping
    if step_mode:
        longest = max([text_width(m.text.split("  ")[0], 11) for m in tl.marks] + [60])
        slot_w = max(104.0, longest + 14)
        slots = max([m.t for m in tl.marks] + [1.0])
        x_of = lambda t: LEFT + 16 + (t - 1) * slot_w + 4  # noqa: E731
        plot_w = slots * slot_w + 16
        mark_w = slot_w - 8
        mark_h = 36
    else:
        t_max = tl.t_max()
        mark_w, mark_h = 14.0, 22.0
        # Scale: wide enough that most consecutive marks of a lane sit at their true time
        # (the rest are nudged right). Stretches in which no sync op starts or ends and
        # that would take more than BREAK_PX are cut to BREAK_CUT px (drawn as axis breaks
        # labelled with the time they hide), so scheduler gaps do not squeeze the action.
        need = []
        for i in range(n):
            lane = sorted((m for m in tl.marks if m.lane == i), key=lambda m: m.t)
            for prev, cur in zip(lane, lane[1:]):
                free = cur.t - (prev.t_end if prev.stall_from is not None else prev.t)
                need.append((mark_w + 3) / max(free, 1e-3))
        need.sort()
        scale = need[int(0.7 * (len(need) - 1))] if need else 1200.0 / t_max
        events = sorted({0.0, t_max} | {m.t for m in tl.marks} | {m.t_end for m in tl.marks}
                        | {s.t0 for s in tl.spans if s.t0 <= 0.0})
        for _ in range(8):
            segments, x = [], float(LEFT)
            for a, b in zip(events, events[1:]):
                w = (b - a) * scale
                cut = w > BREAK_PX
                segments.append((a, b, x, x + (BREAK_CUT if cut else w), cut))
                x += BREAK_CUT if cut else w
            plot_w = x - LEFT
            if plot_w > 2600:
                scale *= 0.8
            elif plot_w < 1100 and not any(sg[4] for sg in segments):
                scale *= 1100 / max(plot_w, 1.0)
            else:
                break
        breaks = [(a, b, xa, xb) for a, b, xa, xb, cut in segments if cut]

        def x_of(t, segments=segments):
            lo, hi = 0, len(segments) - 1
            while lo < hi:
                mid = (lo + hi) // 2
                if segments[mid][1] < t:
                    lo = mid + 1
                else:
                    hi = mid
            if not segments:
                return float(LEFT)
            a, b, xa, xb, _ = segments[lo]
            if t <= a or b <= a:
                return xa
            return xa + (min(t, b) - a) / (b - a) * (xb - xa)

    # ---- marks: positions (nudged right so that marks of one lane never overlap)
    pos = []                             # (x0, x1, x_end) per mark
    order = sorted(range(len(tl.marks)), key=lambda i: (tl.marks[i].lane, tl.marks[i].t))
    last_right = {}
    for i in order:
        m = tl.marks[i]
        x0 = x_of(m.t)
        if not step_mode:
            x0 = max(x0, last_right.get(m.lane, -1e9) + 2)
        x1 = x0 + mark_w
        xe = max(x1, x_of(m.t_end)) if not step_mode else x1
        last_right[m.lane] = xe if (m.stall_from is not None or m.stuck) else x1
        pos.append((i, x0, x1, xe))
    pos = {i: (x0, x1, xe) for i, x0, x1, xe in pos}
    max_x = max([LEFT + plot_w] + [xe for _, _, xe in pos.values()])

    # extra room on the right for the deadlock notes
    note_w = 0.0
    for i, m in enumerate(tl.marks):
        if m.stuck and step_mode:
            note_w = max(note_w, text_width("waits: " + m.waits_on, 11.5) + 20)
        elif m.stuck:
            note_w = max(note_w, pos[i][2] + 6 + text_width(m.waits_on, 10.5) - max_x)
    width = int(max(max_x + note_w + RIGHT_PAD, 16 + text_width(tl.title, 17, True) + 20,
                    16 + text_width(tl.subtitle, 12) + 20))

    def lane_y(i):
        return TOP + i * LANE_H + LANE_H / 2

    # ---- header
    items.append(Text(16, 22, tl.title, 17, "#111111", bold=True))
    items.append(Text(16, 46, tl.subtitle, 12, "#444444"))
    if tl.deadlock:
        stuck = ", ".join(tl.stuck_lanes)
        items.append(Text(16, 66, f"stuck: {stuck} — red boxes show each one's blocked op and what it "
                                  f"waits on", 12, STALL_EDGE, bold=True))

    # ---- lanes
    lanes_bottom = TOP + n * LANE_H
    for i, name in enumerate(tl.lanes):
        y = TOP + i * LANE_H
        items.append(Rect(0, y, width, LANE_H, LANE_BG[i % 2]))
        stuck = any(m.stuck and m.lane == i for m in tl.marks)
        items.append(Text(14, y + LANE_H / 2 - 9, _fit(name, LEFT - 24, 14, True), 14,
                          STALL_EDGE if stuck else "#111111", bold=True))
        info = tl.lane_info[i] if i < len(tl.lane_info) else ""
        parts = info.split("   ")
        items.append(Text(14, y + LANE_H / 2 + 8, _fit(parts[0], LEFT - 24, 10.5), 10.5, "#555555"))
        if len(parts) > 1:
            items.append(Text(14, y + LANE_H / 2 + 21, _fit(parts[1], LEFT - 24, 10.5), 10.5, STALL_EDGE))
    items.append(Line(LEFT - 8, TOP, LEFT - 8, lanes_bottom, "#9aa0a8"))

    # ---- axis and grid
    axis_y = lanes_bottom + 6
    items.append(Line(LEFT - 8, axis_y, max_x, axis_y, "#555555"))
    if step_mode:
        for k in range(1, int(max(m.t for m in tl.marks)) + 1 if tl.marks else 1):
            x = x_of(k) + mark_w / 2
            items.append(Line(x, TOP, x, lanes_bottom, "#e2e5ea"))
            items.append(Line(x, axis_y, x, axis_y + 5, "#555555"))
            last = tl.marks and k == int(max(m.t for m in tl.marks)) and any(m.stuck for m in tl.marks)
            items.append(Text(x, axis_y + 15, "stuck" if last else str(k), 10.5,
                              STALL_EDGE if last else "#333333", "middle", bold=bool(last)))
        items.append(Text(LEFT - 14, axis_y + 15, "step", 10.5, "#333333", "end"))
    else:
        t_max = tl.t_max()
        step = _nice_step(110.0 / scale, 1)          # a tick about every 110 px
        ms = step >= 500
        k = 0
        while k * step <= t_max * 1.0001:
            t = k * step
            k += 1
            if any(a < t < b for a, b, _, _ in breaks):
                continue
            x = x_of(t)
            items.append(Line(x, TOP, x, lanes_bottom, "#e2e5ea"))
            items.append(Line(x, axis_y, x, axis_y + 5, "#555555"))
            label = f"{t / 1000:g}" if ms else f"{t:g}"
            items.append(Text(x, axis_y + 15, label, 10.5, "#333333", "middle"))
        for a, b, xa, xb in breaks:
            items.append(Rect(xa + 4, TOP, xb - xa - 8, lanes_bottom - TOP, "#e9ebef"))
            items.append(Rect((xa + xb) / 2 - 6, axis_y - 2, 12, 4, "#ffffff"))
            for dx in (-3, 3):
                xm = (xa + xb) / 2 + dx
                items.append(Line(xm - 3, axis_y + 5, xm + 3, axis_y - 5, "#555555", 1.2))
            items.append(Text((xa + xb) / 2, axis_y + 15, f"+{_fmt_us(b - a)}", 10, "#777777", "middle"))
        items.append(Text(LEFT - 14, axis_y + 15, "time (ms)" if ms else "time (µs)", 10.5,
                          "#333333", "end"))

    # ---- program separators
    for t, label in tl.separators:
        x = x_of(t) - 3
        items.append(Line(x, TOP - 12, x, lanes_bottom, "#555555", 1.2, dash=True))
        items.append(Text(x + 4, TOP - 10, label, 10.5, "#333333"))

    # ---- work spans
    for s in tl.spans:
        x0, x1 = x_of(s.t0), x_of(s.t1)
        if x1 - x0 < 0.5:
            continue
        items.append(Rect(x0, lane_y(s.lane) - 5, x1 - x0, 10, WORK_FILL, tip=s.tip))

    # ---- stalls (under the marks)
    for i, m in enumerate(tl.marks):
        x0, x1, xe = pos[i]
        y = lane_y(m.lane)
        if m.stall_from is not None and xe - x1 > 0.5 and not step_mode:
            items.append(Rect(x1, y - mark_h / 2, xe - x1, mark_h, STUCK_FILL if m.stuck else STALL_FILL,
                              STALL_EDGE, 2.0 if m.stuck else 1.0,
                              tip=f"stalled {_fmt_us(m.t_end - m.stall_from)}: {m.waits_on}"))
            label = "stuck" if m.stuck else f"stall {_fmt_us(m.t_end - m.stall_from)}"
            if text_width(label, 10) + 6 < xe - x1:
                items.append(Text((x1 + xe) / 2, y, label, 10, "#5a0d0d" if m.stuck else "#8b1a1a",
                                  "middle", bold=m.stuck))

    # ---- links (arrows)
    link_items = []
    for ln in tl.links:
        src = tl.marks[ln.src]
        sx0, sx1, _ = pos[ln.src]
        if ln.kind == "waits-on":
            lane = -1 - ln.dst
            if lane == src.lane:
                continue
            down = lane > src.lane
            if abs(lane - src.lane) > 1:
                # skip over the lanes in between: out to the left of the column and back in
                far = [l2 for l2 in tl.links if l2.kind == "waits-on" and abs(-1 - l2.dst - tl.marks[l2.src].lane) > 1]
                xo = sx0 - 10 - 9 * far.index(ln)
                ya, yb = lane_y(src.lane) - 6, lane_y(lane) + 6
                link_items.append(Line(sx0, ya, xo, ya, STALL_EDGE, 2.0, dash=True))
                link_items.append(Line(xo, ya, xo, yb, STALL_EDGE, 2.0, dash=True))
                link_items.append(Line(xo, yb, sx0 - 1, yb, STALL_EDGE, 2.0, dash=True, arrow=True))
                continue
            # every waits-on arrow gets its own column so that opposite ones do not overlap
            others = [l2 for l2 in tl.links if l2.kind == "waits-on"]
            off = (others.index(ln) - (len(others) - 1) / 2) * 16
            x = (sx0 + sx1) / 2 + off
            y1 = lane_y(src.lane) + (mark_h / 2 if down else -mark_h / 2)
            y2 = lane_y(lane) + (-mark_h / 2 - 2 if down else mark_h / 2 + 2)
            link_items.append(Line(x, y1, x, y2, STALL_EDGE, 2.0, dash=True, arrow=True))
            continue
        dst = tl.marks[ln.dst]
        dx0, dx1, dxe = pos[ln.dst]
        if src.lane == dst.lane:
            continue
        color = colors.get(src.obj, "#555555")
        down = dst.lane > src.lane
        y1 = lane_y(src.lane) + (mark_h / 2 if down else -mark_h / 2)
        y2 = lane_y(dst.lane) + (-mark_h / 2 - 1 if down else mark_h / 2 + 1)
        x1 = (sx0 + sx1) / 2
        x2 = dxe if (dst.stall_from is not None and not step_mode) else (dx0 + dx1) / 2
        if step_mode:
            link_items.append(Line(x1, y1, x2, y2, _mix(color, 0.85), 1.6, arrow=True))
        elif ln.ended_stall:
            link_items.append(Line(x1, y1, x2, y2, color, 1.8, arrow=True))
        else:
            link_items.append(Line(x1, y1, x2, y2, _mix(color, 0.45), 1.0, arrow=True))
    # faint ones first so the bold ones stay on top
    link_items.sort(key=lambda ln: ln.width)

    # ---- marks
    mark_items = []
    for i, m in enumerate(tl.marks):
        x0, x1, xe = pos[i]
        y = lane_y(m.lane)
        color = colors.get(m.obj, "#555555")
        letter = VERB_LETTER.get(m.verb, "?")
        if step_mode:
            fill = STALL_FILL if m.stuck else _mix(color, 0.18)
            edge = STALL_EDGE if m.stuck else color
            mark_items.append(Rect(x0, y - mark_h / 2, mark_w, mark_h, fill, edge,
                                   2.2 if m.stuck else 1.3, tip=m.text))
            head, _, rest = m.text.partition("  ")
            mark_items.append(Text(x0 + mark_w / 2, y - 8, head, 11, "#111111", "middle", bold=True))
            mark_items.append(Text(x0 + mark_w / 2, y + 8, rest, 10, "#444444", "middle"))
            if m.stuck:
                mark_items.append(Text(x0 + mark_w + 10, y - 8, "STUCK", 11.5, STALL_EDGE, bold=True))
                mark_items.append(Text(x0 + mark_w + 10, y + 8, "waits: " + m.waits_on, 11.5,
                                       STALL_EDGE))
        else:
            edge = STALL_EDGE if m.stuck else _mix(color, 0.6)
            mark_items.append(Rect(x0, y - mark_h / 2, mark_w, mark_h, color, edge,
                                   2.0 if m.stuck else 1.0,
                                   tip=m.text + (f" — stalled: {m.waits_on}" if m.waits_on else "")))
            mark_items.append(Text(x0 + mark_w / 2, y, letter, 11, "#ffffff", "middle", bold=True))
            if m.stuck:
                mark_items.append(Text(xe + 6, y - 8, "STUCK", 11, STALL_EDGE, bold=True))
                mark_items.append(Text(xe + 6, y + 8, m.waits_on, 10.5, STALL_EDGE))
    for lane, slot in tl.finished.items():
        x0 = x_of(slot)
        y = lane_y(lane)
        mark_items.append(Rect(x0, y - 11, mark_w, 22, "#e6e8eb", "#9aa0a8", dash=True))
        mark_items.append(Text(x0 + mark_w / 2, y, "finished", 10.5, "#555555", "middle"))
    items += mark_items + link_items

    # ---- legend
    y = axis_y + 40
    x = 16.0
    row_h = 22

    def put(w):
        nonlocal x, y
        if x + w > width - 16:
            x, y = 16.0, y + row_h
        x0 = x
        x += w
        return x0

    items.append(Text(16, y, "sync objects:", 11.5, "#111111", bold=True))
    x = 16 + text_width("sync objects:", 11.5, True) + 12
    for name, desc in tl.objects.items():
        label = f"{name}  ({desc})"
        x0 = put(24 + text_width(label, 11) + 18)
        items.append(Rect(x0, y - 7, 14, 14, colors[name]))
        items.append(Text(x0 + 20, y, label, 11))
    y += row_h
    x = 16.0
    if step_mode:
        entries = [("box", "#ffffff", "#555555", "one step of the interleaving (colour = sync object)"),
                   ("arrow", "#555555", None, "commit/signal/release/arrival -> the op it enabled"),
                   ("box", STALL_FILL, STALL_EDGE, "stuck op (waits forever)")]
        if any(ln.kind == "waits-on" for ln in tl.links):
            entries.append(("dash", STALL_EDGE, None, "stuck op -> the agent it waits on"))
        if tl.finished:
            entries.append(("box", "#e6e8eb", "#9aa0a8", "agent finished"))
    else:
        letters = sorted({VERB_LETTER.get(m.verb, "?") for m in tl.marks}, key="ACWRSEBa".find)
        entries = [("letter", L, None, VERB_NAME[L]) for L in letters]
        if any(m.stuck for m in tl.marks):
            entries.append(("box", STUCK_FILL, STALL_EDGE, "stuck op (never completed)"))
        entries += [("bar", WORK_FILL, None, "work between sync ops"),
                    ("box", STALL_FILL, STALL_EDGE, "stall (blocked)"),
                    ("arrow", "#555555", None, "satisfied by (bold: ended a stall)")]
    items.append(Text(16, y, "legend:", 11.5, "#111111", bold=True))
    x = 16 + text_width("legend:", 11.5, True) + 12
    for kind, c1, c2, label in entries:
        x0 = put((20 if kind == "letter" else 32) + text_width(label, 11) + 18)
        if kind == "letter":
            items.append(Rect(x0, y - 9, 14, 18, "#555555"))
            items.append(Text(x0 + 7, y, c1, 11, "#ffffff", "middle", bold=True))
        elif kind == "bar":
            items.append(Rect(x0, y - 5, 26, 10, c1))
        elif kind == "box":
            items.append(Rect(x0, y - 8, 26, 16, c1, c2, 1.2))
        elif kind == "arrow":
            items.append(Line(x0, y, x0 + 26, y, c1, 1.6, arrow=True))
        elif kind == "dash":
            items.append(Line(x0, y, x0 + 26, y, c1, 2.0, dash=True, arrow=True))
        items.append(Text(x0 + (20 if kind == "letter" else 32), y, label, 11))
    y += row_h
    for line in tl.footer:
        for chunk in _wrap(line, int((width - 32) / (11 * 0.6))):
            items.append(Text(16, y, chunk, 11, STALL_EDGE if tl.deadlock else "#333333"))
            y += 17
    height = int(y + 14)
    return Scene(width, height, items)


def _fit(s: str, width: float, size: float, bold: bool = False) -> str:
    """``s`` cut with an ellipsis to fit ``width`` px."""
    if text_width(s, size, bold) <= width:
        return s
    n = max(1, int(width / text_width("x", size, bold)) - 1)
    return s[:n] + "…"


def _wrap(s: str, n: int) -> list[str]:
    out, cur = [], ""
    for word in s.split(" "):
        if cur and len(cur) + 1 + len(word) > n:
            out.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    return out + ([cur] if cur else [])


# ====================================================================== SVG
def _arrow_head(x1, y1, x2, y2, size):
    ang = math.atan2(y2 - y1, x2 - x1)
    left = (x2 - size * math.cos(ang - 0.42), y2 - size * math.sin(ang - 0.42))
    right = (x2 - size * math.cos(ang + 0.42), y2 - size * math.sin(ang + 0.42))
    return [(x2, y2), left, right]


def to_svg(scene: Scene) -> str:
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<svg xmlns="http://www.w3.org/2000/svg" width="{scene.width}" height="{scene.height}" '
           f'viewBox="0 0 {scene.width} {scene.height}" font-family="{FONT}">',
           f'<rect x="0" y="0" width="{scene.width}" height="{scene.height}" fill="#ffffff"/>']
    f = lambda v: f"{v:.1f}".rstrip("0").rstrip(".")  # noqa: E731
    for it in scene.items:
        if isinstance(it, Rect):
            attrs = f'x="{f(it.x)}" y="{f(it.y)}" width="{f(max(it.w, 0))}" height="{f(it.h)}" fill="{it.fill}"'
            if it.stroke:
                attrs += f' stroke="{it.stroke}" stroke-width="{f(it.width)}"'
                if it.dash:
                    attrs += ' stroke-dasharray="4 3"'
            if it.tip:
                out.append(f"<rect {attrs}><title>{escape(it.tip)}</title></rect>")
            else:
                out.append(f"<rect {attrs}/>")
        elif isinstance(it, Line):
            x2, y2 = it.x2, it.y2
            head = None
            if it.arrow:
                size = 5 + 2 * it.width
                head = _arrow_head(it.x1, it.y1, x2, y2, size)
                ang = math.atan2(y2 - it.y1, x2 - it.x1)
                x2, y2 = x2 - 0.8 * size * math.cos(ang), y2 - 0.8 * size * math.sin(ang)
            dash = ' stroke-dasharray="6 4"' if it.dash else ""
            out.append(f'<line x1="{f(it.x1)}" y1="{f(it.y1)}" x2="{f(x2)}" y2="{f(y2)}" '
                       f'stroke="{it.color}" stroke-width="{f(it.width)}"{dash}/>')
            if head:
                pts = " ".join(f"{f(px)},{f(py)}" for px, py in head)
                out.append(f'<polygon points="{pts}" fill="{it.color}"/>')
        elif isinstance(it, Text):
            anchor = {"start": "start", "middle": "middle", "end": "end"}[it.anchor]
            weight = ' font-weight="bold"' if it.bold else ""
            out.append(f'<text x="{f(it.x)}" y="{f(it.y)}" font-size="{f(it.size)}" fill="{it.color}" '
                       f'text-anchor="{anchor}" dominant-baseline="central"{weight}>{escape(it.s)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ====================================================================== PNG (Pillow)
def _font(size: float, bold: bool):
    from PIL import ImageFont

    key = (round(size), bold)
    cache = _font.__dict__.setdefault("cache", {})
    if key in cache:
        return cache[key]
    font = None
    names = (["DejaVuSans-Bold.ttf", "Arial Bold.ttf", "arialbd.ttf"] if bold
             else ["DejaVuSans.ttf", "Arial.ttf", "arial.ttf"])
    for name in names:
        try:
            font = ImageFont.truetype(name, key[0])
            break
        except OSError:
            continue
    if font is None:
        try:
            font = ImageFont.load_default(size=key[0])
        except TypeError:  # Pillow < 10.1: fixed-size bitmap font
            font = ImageFont.load_default()
    cache[key] = font
    return font


def to_png_image(scene: Scene, scale: float = 2.0):
    """Render ``scene`` with PIL.ImageDraw at ``scale`` (pixels per layout unit)."""
    try:
        from PIL import Image, ImageDraw
    except ImportError as exc:
        raise TraceSetupError("PNG output needs Pillow", fix="pip install 'xsync[trace]' (or pillow), "
                              "or write an .svg") from exc
    img = Image.new("RGB", (max(1, int(scene.width * scale)), max(1, int(scene.height * scale))), "#ffffff")
    draw = ImageDraw.Draw(img)
    S = lambda v: v * scale  # noqa: E731
    for it in scene.items:
        if isinstance(it, Rect):
            if it.w <= 0:
                continue
            box = [S(it.x), S(it.y), S(it.x + max(it.w, 0.5)), S(it.y + it.h)]
            draw.rectangle(box, fill=it.fill)
            if it.stroke:
                w = max(1, round(S(it.width)))
                if it.dash:
                    x0, y0, x1, y1 = box
                    for a, b in (((x0, y0), (x1, y0)), ((x1, y0), (x1, y1)), ((x1, y1), (x0, y1)),
                                 ((x0, y1), (x0, y0))):
                        _dashed(draw, a, b, it.stroke, w, S(4), S(3))
                else:
                    draw.rectangle(box, outline=it.stroke, width=w)
        elif isinstance(it, Line):
            w = max(1, round(S(it.width)))
            x1, y1, x2, y2 = S(it.x1), S(it.y1), S(it.x2), S(it.y2)
            if it.arrow:
                size = S(5 + 2 * it.width)
                head = _arrow_head(x1, y1, x2, y2, size)
                ang = math.atan2(y2 - y1, x2 - x1)
                x2, y2 = x2 - 0.8 * size * math.cos(ang), y2 - 0.8 * size * math.sin(ang)
            if it.dash:
                _dashed(draw, (x1, y1), (x2, y2), it.color, w, S(6), S(4))
            else:
                draw.line([(x1, y1), (x2, y2)], fill=it.color, width=w)
            if it.arrow:
                draw.polygon(head, fill=it.color)
        elif isinstance(it, Text):
            font = _font(S(it.size), it.bold)
            anchor = {"start": "lm", "middle": "mm", "end": "rm"}[it.anchor]
            try:
                draw.text((S(it.x), S(it.y)), it.s, fill=it.color, font=font, anchor=anchor)
            except ValueError:  # bitmap fonts take no anchor: place by the measured box
                l, t, r, b = draw.textbbox((0, 0), it.s, font=font)
                dx = {"lm": 0, "mm": -(r - l) / 2, "rm": -(r - l)}[anchor]
                draw.text((S(it.x) + dx, S(it.y) - (b - t) / 2), it.s, fill=it.color, font=font)
    return img


def _dashed(draw, a, b, color, width, on, off):
    (x1, y1), (x2, y2) = a, b
    length = math.hypot(x2 - x1, y2 - y1)
    if length == 0:
        return
    ux, uy = (x2 - x1) / length, (y2 - y1) / length
    d = 0.0
    while d < length:
        e = min(d + on, length)
        draw.line([(x1 + ux * d, y1 + uy * d), (x1 + ux * e, y1 + uy * e)], fill=color, width=width)
        d = e + off


# ====================================================================== files
def write(tl: Timeline, path: str, scale: float = 2.0) -> str:
    """Write ``tl`` as ``.svg`` (hand-built XML) or ``.png`` (Pillow), atomically."""
    ext = os.path.splitext(path)[1].lower()
    scene = layout(tl)
    if ext == ".svg":
        write_atomic(path, to_svg(scene).encode("utf-8"))
    elif ext == ".png":
        import io

        buf = io.BytesIO()
        to_png_image(scene, scale).save(buf, format="PNG", optimize=True)
        write_atomic(path, buf.getvalue())
    else:
        raise TraceSetupError(f"cannot write {path!r}: unknown image type {ext or '(none)'}",
                              fix="name the output file .svg or .png")
    return path
