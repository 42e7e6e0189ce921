"""The CPU emulator's wall-clock watchdog (the ``cpu_timeout`` option, ``XSYNC_CPU_TIMEOUT``).

One deadline covers a whole launch, whatever its grid: it is checked between programs, by
the threads launcher while it joins the agents, and at every loop iteration of a cooperative
agent (a generator that computes without a sync verb never returns to its scheduler, so its
own loop checks). The report names each agent, the kernel line it is at and its loop
iteration, read from the agent's frame through the renderer's line map
(:func:`xsync.backends.cpu.render.render_mapped`).
"""
from __future__ import annotations

import bisect
import time

from xsync.backends.cpu.channels import at_text
from xsync.errors import LaunchError, SourceLoc


class Deadline:
    """The launch's wall-clock limit."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        return time.monotonic() > self.at


class Overtime(Exception):
    """Raised inside a cooperative agent at a loop iteration past the deadline; ``frame`` is
    the generated frame it was raised from (where the agent is)."""

    def __init__(self, frame):
        super().__init__("past the deadline")
        self.frame = frame


def position(compiled, frame) -> tuple[int | None, dict | None]:
    """(kernel line, loop iteration) of the innermost generated frame on ``frame``'s stack."""
    filename = getattr(compiled, "filename", None)
    while frame is not None and frame.f_code.co_filename != filename:
        frame = frame.f_back
    if frame is None:
        return None, None
    lines = compiled.line_map
    i = bisect.bisect_right(lines, (frame.f_lineno, float("inf"))) - 1
    local = frame.f_locals
    at = {kname: local[gname] for gname, kname in compiled.loop_names.items()
          if isinstance(local.get(gname), int)}
    return (lines[i][1] if i >= 0 else None), at


def timeout_error(compiled, pid, deadline: Deadline, where: dict, done: int, total: int) -> LaunchError:
    """``where``: agent label -> (state text, kernel line or None, loop iteration or None);
    ``done`` of ``total`` programs finished before this one."""
    k = compiled.kernel
    rows, loc = [], None
    for label, (state, line, at) in where.items():
        spot = f" at {k.file}:{line}" if line else ""
        rows.append(f"{label}: {state}{spot}{at_text(at)}")
        if loc is None and line and state.startswith("computing"):
            loc = SourceLoc(k.file, line, k.name)
    if loc is None:
        first = next((line for _s, line, _a in where.values() if line), None)
        loc = SourceLoc(k.file, first, k.name) if first else None
    progress = f"program {pid}, {done} of {total} programs finished"
    return LaunchError(
        f"kernel '{k.name}' did not finish within {deadline.seconds:g} s on the CPU emulator "
        f"({progress})", loc=loc, objects=tuple(where), details="\n".join(rows),
        fix="shrink the problem (shapes, trip counts, grid) for the emulator, or raise "
            "XSYNC_CPU_TIMEOUT (xsync.options(cpu_timeout=...)) if it is meant to run this long")
