"""Backend selection: XSYNC_BACKEND = nvidia | ascend | cpu | unset (auto).

Auto picks nvidia on a CUDA GPU with Triton Gluon, ascend on an NPU with torch_npu and
triton-ascend, else the CPU emulator. An unknown or unavailable backend is an error
that lists the valid values and says why the backend cannot run here.
"""
from __future__ import annotations

import importlib
import os

from xsync.errors import BackendError
from xsync.lowering.placement import BACKENDS


def availability(name: str) -> tuple[bool, str]:
    """(can run kernels here, why not)."""
    if name == "cpu":
        try:
            import torch  # noqa: F401
        except ImportError:
            return False, "torch is not installed"
        return True, ""
    module = importlib.import_module(f"xsync.backends.{name}")
    return module.availability()


def select(name: str | None = None) -> str:
    from xsync import config

    raw = name if name is not None else config.current().backend
    raw = raw.strip().lower()
    if raw in ("", "auto"):
        for candidate in ("nvidia", "ascend"):
            ok, _ = availability(candidate)
            if ok:
                return candidate
        return "cpu"
    if raw not in BACKENDS:
        raise BackendError(f"unknown backend {raw!r} (from XSYNC_BACKEND)" if name is None
                           else f"unknown backend {raw!r}",
                           fix=f"use one of: {', '.join(BACKENDS)}, or leave XSYNC_BACKEND unset for auto")
    ok, why = availability(raw)
    if not ok:
        raise BackendError(f"backend {raw!r} cannot run on this machine: {why}",
                           fix=f"valid values: {', '.join(BACKENDS)}; unset XSYNC_BACKEND to pick "
                               f"automatically, or use `python -m xsync lower --backend {raw}` to see "
                               f"the generated code without running it")
    return raw
