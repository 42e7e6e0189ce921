"""The registered backends, by name: ``register``, ``get``, ``select``, ``names``.

``select`` is where ``XSYNC_BACKEND`` (or a ``backend=`` argument) becomes a
:class:`~xsync.backends.base.Backend`: auto (unset) picks the available backend of lowest
``auto_rank`` (nvidia on a Hopper GPU, ascend on an NPU, else the CPU emulator). An unknown
or unavailable backend is an error that lists the valid values and says why the backend
cannot run here. Below the entry points, Backend objects travel, never names.
"""
from __future__ import annotations

from xsync.backends.base import Backend
from xsync.errors import BackendError

_BACKENDS: dict[str, Backend] = {}
_SELECTED: dict[str, Backend] = {}   # what a name resolved to (availability is probed once)


def register(backend: Backend, *, auto_rank: int | None = None) -> Backend:
    """Add ``backend``; ``auto_rank``: its place in auto selection (lower first; None: never
    picked automatically)."""
    if backend.name in _BACKENDS:
        raise ValueError(f"backend {backend.name!r} is registered already")
    backend.auto_rank = auto_rank
    _BACKENDS[backend.name] = backend
    _SELECTED.clear()
    return backend


def names() -> tuple[str, ...]:
    """Every registered backend's name, in registration order."""
    return tuple(_BACKENDS)


def backends() -> tuple[Backend, ...]:
    return tuple(_BACKENDS.values())


def target_names() -> tuple[str, ...]:
    """What kernels can be lowered for (each target once, in registration order)."""
    return tuple(dict.fromkeys(b.target_name for b in _BACKENDS.values()))


def get(name: str | Backend) -> Backend:
    """The backend called ``name`` (no availability check: lowering needs no hardware)."""
    if isinstance(name, Backend):
        return name
    backend = _BACKENDS.get(name)
    if backend is None:
        raise BackendError(f"unknown backend {name!r}", fix=f"use one of: {', '.join(_BACKENDS)}")
    return backend


def select(name: str | Backend | None = None, configured: str | None = None) -> Backend:
    """The backend to run on: ``name`` (a Backend passes through), else ``configured`` (the
    XSYNC_BACKEND setting, read from xsync.config when not given); checked available."""
    if isinstance(name, Backend):
        return name
    if name is None and configured is None:
        from xsync import config
        configured = config.current().backend
    given = name if name is not None else configured
    hit = _SELECTED.get(given)
    if hit is not None:
        return hit
    chosen = _select(given, name is None)
    _SELECTED[given] = chosen
    return chosen


def _select(given: str, from_environment: bool) -> Backend:
    raw = given.strip().lower()
    if raw in ("", "auto"):
        ranked = sorted((b for b in _BACKENDS.values() if b.auto_rank is not None),
                        key=lambda b: b.auto_rank)
        for candidate in ranked:
            ok, _ = candidate.availability()
            if ok or candidate is ranked[-1]:    # the last resort (the CPU emulator) is not probed
                return candidate
        raise BackendError("no registered backend can run on this machine",
                           fix=f"install torch for the CPU emulator; backends: {', '.join(_BACKENDS)}")
    backend = _BACKENDS.get(raw)
    if backend is None:
        raise BackendError(f"unknown backend {raw!r} (from XSYNC_BACKEND)" if from_environment
                           else f"unknown backend {raw!r}",
                           fix=f"use one of: {', '.join(_BACKENDS)}, or leave XSYNC_BACKEND unset for auto")
    ok, why = backend.availability()
    if not ok:
        raise BackendError(f"backend {raw!r} cannot run on this machine: {why}",
                           fix=f"valid values: {', '.join(_BACKENDS)}; unset XSYNC_BACKEND to pick "
                               f"automatically, or use `python -m xsync lower --backend "
                               f"{backend.target_name}` to see the generated code without running "
                               f"it{backend.unavailable_hint()}")
    return backend
