"""Running a trace: the kernel small on the CPU emulator under the recorder, or the verifier's
counterexample when the protocol deadlocks."""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

from xsync.errors import DeadlockError, SourceLoc, StallError, XSyncError
from xsync.trace.timeline import Timeline, TraceSetupError, from_counterexample, from_recording


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
        return from_counterexample(kir, err.counterexample, err, constexprs), err
    return None



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
             "launched as kernel[grid](*args, **kwargs); see the xsync.trace docstring or kernels/gemm.py"))


MAX_PROGRAMS = 64      # lanes beyond this are neither drawable in bounded time nor readable


def _drawable_grid(kernel, grid, from_caller: bool) -> tuple[int, ...]:
    from xsync.compiler import launch_grid

    grid = launch_grid(kernel.__name__, grid)
    programs = math.prod(grid)
    if programs > MAX_PROGRAMS:
        who = "--grid" if from_caller else f"the trace= hook of '{kernel.__name__}'"
        raise TraceSetupError(
            f"{who} asks for grid {grid}: {programs} programs; xsync trace runs and draws at most "
            f"{MAX_PROGRAMS} programs", loc=kernel_loc(kernel),
            fix="trace a small launch (e.g. --grid 2); every program repeats the same protocol")
    return grid


def kernel_loc(kernel) -> SourceLoc | None:
    try:
        return SourceLoc(inspect.getsourcefile(kernel.fn) or "<unknown>",
                         inspect.getsourcelines(kernel.fn)[1], kernel.__name__)
    except (OSError, TypeError):
        return None


def trace_kernel(kernel, settings: dict | None = None, *, constexprs: dict | None = None,
                 dtypes: dict | None = None, grid=None, backend: str = "cpu") -> TraceResult:
    """Run ``kernel`` small on the CPU emulator under the recorder and build its timeline.

    Without a ``trace=`` hook, or for ``backend`` other than cpu, the protocol is first
    verified for the example specialization (``constexprs``/``dtypes``); a deadlock is
    drawn from the verifier's counterexample, without running anything.
    """
    from xsync.backends import get
    from xsync.backends.cpu import runtime

    backend = get(backend)
    settings = dict(settings or {})
    if constexprs is None or dtypes is None:
        constexprs, dtypes = kernel.specialization()
    if kernel.trace is None or not backend.cpu_emulator:
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
    grid = _drawable_grid(kernel, grid if grid is not None else hook_grid, grid is not None)
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
