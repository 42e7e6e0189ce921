"""The cpu backend's options: no lowering switches; the emulator's scheduler is chosen when
the source is rendered (the generated agents are threads or generators)."""
from __future__ import annotations

from dataclasses import dataclass

from xsync.backends.base import NoLowerOptions, StageOptions, option_field

LowerOptions = NoLowerOptions


@dataclass(frozen=True)
class RenderOptions(StageOptions):
    STAGE = "rendering"

    mode: str = option_field("cpu_mode", "threads")     # "threads" | "cooperative"
