"""The trace's drawing primitives (rectangles, lines, arrows, text) in a :class:`Scene`, written
as hand-built SVG or, through Pillow (the ``trace`` extra), as PNG. Files are written
atomically (temporary file + rename)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from xsync.files import write_atomic
from xsync.trace.timeline import TraceSetupError


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


def mix(color: str, alpha: float) -> str:
    """``color`` at opacity ``alpha`` over white, as an opaque colour (same in SVG and PNG)."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    r, g, b = (round(255 - (255 - c) * alpha) for c in (r, g, b))
    return f"#{r:02x}{g:02x}{b:02x}"


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
def write_scene(scene: Scene, path: str, scale: float = 2.0) -> str:
    """Write ``scene`` as ``.svg`` (hand-built XML) or ``.png`` (Pillow), atomically."""
    ext = os.path.splitext(path)[1].lower()
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
