"""Trace layout: a :class:`~xsync.trace.timeline.Timeline` -> a :class:`~xsync.trace.drawing.Scene`.

:func:`layout` first fixes the :class:`Geometry` (how a time or step maps to x, where each mark
sits, how wide the scene is), then places each part in drawing order: header, lanes, axis,
program separators, work spans, stalls, marks, links, legend.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from xsync.trace.drawing import (LANE_BG, PALETTE, STALL_EDGE, STALL_FILL, STUCK_FILL, WORK_FILL, Line,
                                 Rect, Scene, Text, mix, text_width, write_scene)
from xsync.trace.timeline import VERB_LETTER, VERB_NAME, LinkKind, Timeline, fmt_us


def _nice_step(span: float, target: int = 10) -> float:
    raw = span / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


LEFT, RIGHT_PAD, TOP, LANE_H = 200, 40, 86, 60
BREAK_PX, BREAK_CUT = 160.0, 56.0

@dataclass(frozen=True)
class Geometry:
    """Where things go: fixed before any item is placed."""

    step_mode: bool                      # a counterexample: one slot per step (else time in µs)
    x_of: Callable[[float], float]       # time (or step) -> x
    plot_w: float
    mark_w: float
    mark_h: float
    scale: float                         # px per µs (time mode)
    breaks: list                         # (t0, t1, x0, x1) of each cut stretch (time mode)
    pos: dict                            # mark index -> (x0, x1, x_end)
    max_x: float
    width: int
    colors: dict                         # sync object -> colour
    lanes_bottom: float
    axis_y: float

    def lane_y(self, i: int) -> float:
        return TOP + i * LANE_H + LANE_H / 2


def layout(tl: Timeline) -> Scene:
    """Place every lane, span, mark, stall, link, axis and legend item."""
    g = geometry(tl)
    items = (_header(tl) + _lanes(tl, g) + _axis(tl, g) + _separators(tl, g) + _spans(tl, g)
             + _stalls(tl, g))
    link_items = _links(tl, g)
    items += _marks(tl, g) + link_items
    legend, height = _legend(tl, g)
    return Scene(g.width, height, items + legend)


def geometry(tl: Timeline) -> Geometry:
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(tl.objects)}
    n = len(tl.lanes)
    step_mode = tl.unit == "step"
    x_of, plot_w, mark_w, mark_h, scale, breaks = _horizontal(tl, n, step_mode)
    pos, max_x = _positions(tl, step_mode, x_of, mark_w, plot_w)
    width = _width(tl, step_mode, pos, max_x)
    lanes_bottom = TOP + n * LANE_H
    return Geometry(step_mode, x_of, plot_w, mark_w, mark_h, scale, breaks, pos, max_x, width, colors,
                    lanes_bottom, lanes_bottom + 6)


def _horizontal(tl: Timeline, n: int, step_mode: bool) -> tuple:
    """The x of a time (or step): ``(x_of, plot_w, mark_w, mark_h, scale, breaks)``."""

    scale, breaks = 0.0, []
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
    return x_of, plot_w, mark_w, mark_h, scale, breaks


def _positions(tl: Timeline, step_mode: bool, x_of, mark_w: float, plot_w: float) -> tuple:
    """Each mark's (x0, x1, x_end), nudged right so that marks of one lane never overlap; the plot's right end."""

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
    return pos, max_x


def _width(tl: Timeline, step_mode: bool, pos: dict, max_x: float) -> int:
    """The scene width: the plot, the deadlock notes on its right, the title."""

    # extra room on the right for the deadlock notes
    note_w = 0.0
    for i, m in enumerate(tl.marks):
        if m.stuck and step_mode:
            note_w = max(note_w, text_width("waits: " + m.waits_on, 11.5) + 20)
        elif m.stuck:
            note_w = max(note_w, pos[i][2] + 6 + text_width(m.waits_on, 10.5) - max_x)
    width = int(max(max_x + note_w + RIGHT_PAD, 16 + text_width(tl.title, 17, True) + 20,
                    16 + text_width(tl.subtitle, 12) + 20))
    return width


def _header(tl: Timeline) -> list:
    """Title, subtitle and the stuck agents."""
    items: list = []
    items.append(Text(16, 22, tl.title, 17, "#111111", bold=True))
    items.append(Text(16, 46, tl.subtitle, 12, "#444444"))
    if tl.deadlock:
        stuck = ", ".join(tl.stuck_lanes)
        items.append(Text(16, 66, f"stuck: {stuck} — red boxes show each one's blocked op and what it "
                                  f"waits on", 12, STALL_EDGE, bold=True))
    return items


def _lanes(tl: Timeline, g: Geometry) -> list:
    """One band per lane, with its name and hardware / stall notes."""
    n = len(tl.lanes)
    width = g.width
    items: list = []
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
    return items


def _axis(tl: Timeline, g: Geometry) -> list:
    """The axis: steps, or times with the breaks that hide long gaps."""
    max_x = g.max_x
    step_mode = g.step_mode
    x_of = g.x_of
    mark_w = g.mark_w
    scale = g.scale
    breaks = g.breaks
    lanes_bottom = g.lanes_bottom
    items: list = []
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
            items.append(Text((xa + xb) / 2, axis_y + 15, f"+{fmt_us(b - a)}", 10, "#777777", "middle"))
        items.append(Text(LEFT - 14, axis_y + 15, "time (ms)" if ms else "time (µs)", 10.5,
                          "#333333", "end"))
    return items


def _separators(tl: Timeline, g: Geometry) -> list:
    """Dashed lines between programs."""
    x_of = g.x_of
    lanes_bottom = g.lanes_bottom
    items: list = []
    for t, label in tl.separators:
        x = x_of(t) - 3
        items.append(Line(x, TOP - 12, x, lanes_bottom, "#555555", 1.2, dash=True))
        items.append(Text(x + 4, TOP - 10, label, 10.5, "#333333"))
    return items


def _spans(tl: Timeline, g: Geometry) -> list:
    """Work between sync ops."""
    x_of = g.x_of
    lane_y = g.lane_y
    items: list = []
    for s in tl.spans:
        x0, x1 = x_of(s.t0), x_of(s.t1)
        if x1 - x0 < 0.5:
            continue
        items.append(Rect(x0, lane_y(s.lane) - 5, x1 - x0, 10, WORK_FILL, tip=s.tip))
    return items


def _stalls(tl: Timeline, g: Geometry) -> list:
    """Time each op spent blocked (drawn under the marks)."""
    step_mode = g.step_mode
    pos = g.pos
    lane_y = g.lane_y
    mark_h = g.mark_h
    items: list = []
    for i, m in enumerate(tl.marks):
        x0, x1, xe = pos[i]
        y = lane_y(m.lane)
        if m.stall_from is not None and xe - x1 > 0.5 and not step_mode:
            items.append(Rect(x1, y - mark_h / 2, xe - x1, mark_h, STUCK_FILL if m.stuck else STALL_FILL,
                              STALL_EDGE, 2.0 if m.stuck else 1.0,
                              tip=f"stalled {fmt_us(m.t_end - m.stall_from)}: {m.waits_on}"))
            label = "stuck" if m.stuck else f"stall {fmt_us(m.t_end - m.stall_from)}"
            if text_width(label, 10) + 6 < xe - x1:
                items.append(Text((x1 + xe) / 2, y, label, 10, "#5a0d0d" if m.stuck else "#8b1a1a",
                                  "middle", bold=m.stuck))
    return items


def _links(tl: Timeline, g: Geometry) -> list:
    """Arrows from each op to the one it let through, and from a stuck op to the lane it waits on."""
    step_mode = g.step_mode
    pos = g.pos
    lane_y = g.lane_y
    mark_h = g.mark_h
    colors = g.colors
    link_items = []
    for ln in tl.links:
        src = tl.marks[ln.src]
        sx0, sx1, _ = pos[ln.src]
        if ln.kind is LinkKind.WAITS_ON:
            lane = -1 - ln.dst
            if lane == src.lane:
                continue
            down = lane > src.lane
            if abs(lane - src.lane) > 1:
                # skip over the lanes in between: out to the left of the column and back in
                far = [l2 for l2 in tl.links if l2.kind is LinkKind.WAITS_ON
                       and abs(-1 - l2.dst - tl.marks[l2.src].lane) > 1]
                xo = sx0 - 10 - 9 * far.index(ln)
                ya, yb = lane_y(src.lane) - 6, lane_y(lane) + 6
                link_items.append(Line(sx0, ya, xo, ya, STALL_EDGE, 2.0, dash=True))
                link_items.append(Line(xo, ya, xo, yb, STALL_EDGE, 2.0, dash=True))
                link_items.append(Line(xo, yb, sx0 - 1, yb, STALL_EDGE, 2.0, dash=True, arrow=True))
                continue
            # every waits-on arrow gets its own column so that opposite ones do not overlap
            others = [l2 for l2 in tl.links if l2.kind is LinkKind.WAITS_ON]
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
            link_items.append(Line(x1, y1, x2, y2, mix(color, 0.85), 1.6, arrow=True))
        elif ln.ended_stall:
            link_items.append(Line(x1, y1, x2, y2, color, 1.8, arrow=True))
        else:
            link_items.append(Line(x1, y1, x2, y2, mix(color, 0.45), 1.0, arrow=True))
    # faint ones first so the bold ones stay on top
    link_items.sort(key=lambda ln: ln.width)
    return link_items


def _marks(tl: Timeline, g: Geometry) -> list:
    """The sync ops (a letter, or a box per step) and the "finished" tags."""
    step_mode = g.step_mode
    x_of = g.x_of
    pos = g.pos
    lane_y = g.lane_y
    mark_w = g.mark_w
    mark_h = g.mark_h
    colors = g.colors
    mark_items = []
    for i, m in enumerate(tl.marks):
        x0, x1, xe = pos[i]
        y = lane_y(m.lane)
        color = colors.get(m.obj, "#555555")
        letter = VERB_LETTER.get(m.verb, "?")
        if step_mode:
            fill = STALL_FILL if m.stuck else mix(color, 0.18)
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
            edge = STALL_EDGE if m.stuck else mix(color, 0.6)
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
    return mark_items


def _legend(tl: Timeline, g: Geometry) -> tuple:
    """Sync objects, legend and footer below the axis: ``(items, scene height)``."""
    step_mode = g.step_mode
    width = g.width
    colors = g.colors
    axis_y = g.axis_y
    items: list = []
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
        if any(ln.kind is LinkKind.WAITS_ON for ln in tl.links):
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
    return items, height


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


def write(tl: Timeline, path: str, scale: float = 2.0) -> str:
    """Write ``tl`` as ``.svg`` (hand-built XML) or ``.png`` (Pillow), atomically."""
    return write_scene(layout(tl), path, scale)
