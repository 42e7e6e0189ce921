"""What a backend is: the :class:`Backend` base class and the option dataclasses' base.

A backend is one object (registered in :mod:`xsync.backends.registry`) that carries
everything xsync needs to lower a kernel for it and to run the result::

    Backend
      .name            the XSYNC_BACKEND / ``backend=`` spelling ("nvidia", "ascend-sim")
      .target          the lowering Target (hardware facts, schedule passes, allocator)
      .place(kernel)   -> Placement (which agent runs each role)
      .LowerOptions    frozen dataclass: what the passes and the allocator read
      .RenderOptions   frozen dataclass: what the renderer and the compiled kernel read
      .compile(kernel, placement, allocation, render_options)
                       -> a compiled kernel with .launch(grid, args)
      .render_source(kernel, placement, allocation, render_options)
                       -> the generated source text
      .availability()  -> (can run here, why not); probed lazily, once

Two backends may share a target (``ascend`` and ``ascend-sim`` lower the same way and run
the generated module on an NPU or in xsync's simulator). Nothing below the entry points
(``Kernel.lower/compile/launch``, the CLI, the library ops) dispatches on a backend's name.

Options: each field of a backend's option dataclasses names the ``xsync.config`` option
that feeds it (``option_field("nv_fuse_mma")``); :mod:`xsync.config` builds them
(environment < ``@xs.kernel(options=)`` < ``xsync.options(...)``) and the compile cache key
is the option objects themselves.

Adding a backend: a package ``xsync/backends/<name>/`` with ``placement.py`` (``place(kernel)
-> agents`` and its ``TARGET``: hardware facts, schedule passes ``run(kernel, placement, log,
lower_options)``, ``allocate(kernel, placement, skeleton, lower_options)``), ``options.py``
(its LowerOptions / RenderOptions, each field an ``option_field`` naming an option of
``xsync.config.OPTIONS``) and a Backend subclass (``probe``, ``render_source``, ``compile``);
then one ``register(...)`` line in ``xsync/backends/__init__.py`` (``XSYNC_BACKEND`` accepts
every registered name).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from xsync.lowering import ir
from xsync.lowering.placement import Placed, Placement, Target


def option_field(option: str | None, default: Any = None, doc: str = ""):
    """A field of a LowerOptions/RenderOptions dataclass fed by the xsync.config option
    ``option`` (None: set only by a keyword, e.g. a benchmark's staging limit)."""
    return field(default=default, metadata={"option": option, "doc": doc})


@dataclass(frozen=True)
class StageOptions:
    """Base of a backend's LowerOptions / RenderOptions (frozen, hashable: a cache key)."""

    STAGE: ClassVar[str] = ""       # "lowering" | "rendering"

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        names = cls.__dict__.get("_field_names")
        if names is None:
            names = tuple(f.name for f in dataclasses.fields(cls))
            setattr(cls, "_field_names", names)
        return names

    @classmethod
    def config_names(cls) -> dict[str, str]:
        """{field: the xsync.config option that feeds it} (fields fed by one)."""
        names = cls.__dict__.get("_config_names")
        if names is None:
            names = {f.name: f.metadata["option"] for f in dataclasses.fields(cls) if f.metadata.get("option")}
            setattr(cls, "_config_names", names)
        return dict(names)


@dataclass(frozen=True)
class NoLowerOptions(StageOptions):
    """A lowering with nothing to switch."""

    STAGE = "lowering"


@dataclass(frozen=True)
class NoRenderOptions(StageOptions):
    """A renderer with nothing to switch."""

    STAGE = "rendering"


class Backend:
    """One backend (see the module docstring). Subclasses set the class attributes and
    implement ``compile``, ``render_source`` and ``availability``."""

    name: str = ""
    target: Target
    LowerOptions: type[StageOptions] = NoLowerOptions
    RenderOptions: type[StageOptions] = NoRenderOptions
    device: str = "cpu"             # the torch device type its tensors live on
    # the CPU emulator: kernels run as host threads (reading inputs on the host costs
    # nothing; big shapes are slow)
    cpu_emulator: bool = False
    auto_rank: int | None = None    # set by registry.register

    def __init__(self, name: str, target: Target, place_roles, *, device: str = "cpu"):
        self.name, self.target, self._place_roles, self.device = name, target, place_roles, device
        self._availability: tuple[bool, str] | None = None

    def __repr__(self) -> str:
        return f"<xsync backend {self.name}>"

    def __str__(self) -> str:
        return self.name

    @property
    def target_name(self) -> str:
        """What kernels are lowered for (``ascend-sim`` lowers for ``ascend``)."""
        return self.target.name

    def place(self, kernel: ir.KernelIR) -> Placement:
        """The placement of ``kernel``'s roles on this backend's agents, with its target facts."""
        placed = self._place_roles(kernel)
        if isinstance(placed, Placed):
            return Placement(tuple(placed.agents), self.target, tuple(placed.notes))
        return Placement(tuple(placed), self.target)

    def availability(self) -> tuple[bool, str]:
        """(can run kernels here, why not); probed once per process (every launch asks)."""
        if self._availability is None:
            self._availability = self.probe()
        return self._availability

    def probe(self) -> tuple[bool, str]:
        return True, ""

    def unavailable_hint(self) -> str:
        """What to add to the 'cannot run on this machine' error's fix."""
        return ""

    def compile(self, kernel: ir.KernelIR, placement: Placement, allocation, options):
        """The compiled kernel (``.source``, ``.launch(grid, args)``) of a lowered one."""
        raise NotImplementedError

    def render_source(self, kernel: ir.KernelIR, placement: Placement, allocation, options) -> str:
        """The generated source text (``xsync lower``)."""
        raise NotImplementedError

    def resident_programs(self, device=None) -> int | None:
        """Programs a persistent launch keeps resident (SMs, AI cores); None: no limit."""
        return None
