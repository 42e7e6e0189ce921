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

The package: ``timeline`` (the model, built from a recording or a counterexample), ``run``
(running a kernel under the recorder), ``layout`` (timeline -> scene) and ``drawing`` (scene ->
SVG / PNG).
"""
from __future__ import annotations

from xsync.trace.drawing import (  # noqa: F401
    FONT, LANE_BG, PALETTE, STALL_EDGE, STALL_FILL, STUCK_FILL, WORK_FILL, Line, Rect, Scene, Text,
    text_width, to_png_image, to_svg, write_scene)
from xsync.trace.layout import Geometry, geometry, layout, write  # noqa: F401
from xsync.trace.run import TraceResult, counterexample, trace_kernel  # noqa: F401
from xsync.trace.timeline import (  # noqa: F401
    VERB_LETTER, VERB_NAME, Link, LinkKind, Mark, OpKind, Span, Timeline, TraceSetupError,
    from_counterexample, from_recording, verb_text)
