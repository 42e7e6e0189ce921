"""The ascend backends' options (ascend and ascend-sim share them)."""
from __future__ import annotations

from dataclasses import dataclass

from xsync.backends.base import StageOptions, option_field


@dataclass(frozen=True)
class LowerOptions(StageOptions):
    """Read by the allocator (:mod:`xsync.backends.ascend.alloc`)."""

    STAGE = "lowering"

    event_ids: int | None = option_field("ascend_event_ids")   # cap on cross-core event IDs


@dataclass(frozen=True)
class RenderOptions(StageOptions):
    """Read by the renderer (:mod:`xsync.backends.ascend.render`)."""

    STAGE = "rendering"

    form: str = option_field("ascend_form", "auto")     # "auto" | "release" | "scope"
