"""Backend selection: XSYNC_BACKEND = nvidia | ascend | ascend-sim | cpu | auto (unset).

Auto picks nvidia on a CUDA GPU with Triton Gluon, ascend on an NPU with torch_npu and
triton-ascend, else the CPU emulator. ``ascend-sim`` lowers for Ascend and runs the generated
triton-ascend code in xsync's cube/vector simulator on the CPU (needs triton-ascend, no NPU).
An unknown or unavailable backend is an error that lists the valid values and says why the
backend cannot run here.
"""
from __future__ import annotations

import importlib

from xsync.errors import BackendError
from xsync.lowering import ir
from xsync.lowering.placement import Placement

TARGETS = ("cpu", "nvidia", "ascend")   # what a kernel can be lowered for

# A backend name is a target (what the kernel is lowered for) and a runner (what executes
# the generated code).
RUNNERS = {"cpu": ("cpu", "emulator"), "nvidia": ("nvidia", "gpu"), "ascend": ("ascend", "npu"),
           "ascend-sim": ("ascend", "simulator")}
BACKENDS = tuple(RUNNERS)


def place(kernel: ir.KernelIR, target: str) -> Placement:
    """The placement of ``kernel``'s roles on ``target``'s agents, with the target's facts
    (``xsync.backends.<target>.placement``: ``place(kernel)`` and ``TARGET``)."""
    if target not in TARGETS:
        raise BackendError(f"unknown backend {target!r}", fix=f"use one of: {', '.join(TARGETS)}")
    module = importlib.import_module(f"xsync.backends.{target}.placement")
    return Placement(target, tuple(module.place(kernel)), module.TARGET)


def target_of(name: str) -> str:
    """The lowering target of backend ``name`` (``ascend-sim`` lowers for ``ascend``)."""
    return RUNNERS[name][0] if name in RUNNERS else name


def runner_of(name: str) -> str:
    return RUNNERS[name][1]


def availability(name: str) -> tuple[bool, str]:
    """(can run kernels here, why not)."""
    if name == "cpu":
        try:
            import torch  # noqa: F401
        except ImportError:
            return False, "torch is not installed"
        return True, ""
    if name == "ascend-sim":
        from xsync.backends.ascend.simulator import availability as sim_availability
        return sim_availability()
    module = importlib.import_module(f"xsync.backends.{name}")
    return module.availability()


_SELECTED: dict[str, str] = {}   # what a backend name resolved to (availability is probed once)


def select(name: str | None = None) -> str:
    from xsync import config

    given = name if name is not None else config.current().backend
    hit = _SELECTED.get(given)
    if hit is not None:
        return hit
    chosen = _select(given, name is None)
    _SELECTED[given] = chosen
    return chosen


def _select(given: str, from_environment: bool) -> str:
    raw = given.strip().lower()
    if raw in ("", "auto"):
        for candidate in ("nvidia", "ascend"):
            ok, _ = availability(candidate)
            if ok:
                return candidate
        return "cpu"
    if raw not in BACKENDS:
        raise BackendError(f"unknown backend {raw!r} (from XSYNC_BACKEND)" if from_environment
                           else f"unknown backend {raw!r}",
                           fix=f"use one of: {', '.join(BACKENDS)}, or leave XSYNC_BACKEND unset for auto")
    ok, why = availability(raw)
    if not ok:
        sim = ("; XSYNC_BACKEND=ascend-sim runs the generated Ascend code in xsync's cube/vector "
               "simulator on the CPU (needs triton-ascend: bash scripts/env.sh ascend)"
               if raw == "ascend" else "")
        raise BackendError(f"backend {raw!r} cannot run on this machine: {why}",
                           fix=f"valid values: {', '.join(BACKENDS)}; unset XSYNC_BACKEND to pick "
                               f"automatically, or use `python -m xsync lower --backend "
                               f"{target_of(raw)}` to see the generated code without running it{sim}")
    return raw
