"""CPU emulator backend: threads + torch, exact sync semantics, stall watchdog."""
from __future__ import annotations

import linecache
import os
from dataclasses import dataclass

from xsync import config
from xsync.backends.cpu import runtime
from xsync.backends.cpu.render import render
from xsync.lowering import ir
from xsync.lowering.placement import Placement


def availability() -> tuple[bool, str]:
    return True, ""


@dataclass
class CompiledCpu:
    kernel: ir.KernelIR
    placement: Placement
    source: str
    agent_functions: dict
    skeleton: object = None      # xsync.lowering.protocol.Skeleton: the sync objects' meaning
    mode: str = "threads"        # "threads" | "cooperative" (XSYNC_CPU_MODE)

    def launch(self, grid: tuple[int, ...], args: dict):
        timeout = config.current().cpu_timeout
        runtime.run_grid(self, grid, args, timeout)


def render_source(kernel: ir.KernelIR, placement: Placement, allocation) -> str:
    mode = config.current().cpu_mode
    return render(kernel, placement, getattr(allocation, "skeleton", None), mode == "cooperative")


def compile_kernel(kernel: ir.KernelIR, placement: Placement, allocation, options=None) -> CompiledCpu:
    from xsync.lowering.protocol import derive

    mode = (options or {}).get("mode") or config.current().cpu_mode
    skeleton = getattr(allocation, "skeleton", None) or derive(kernel, placement)
    source = render(kernel, placement, skeleton, mode == "cooperative")
    filename = f"<xsync-cpu {kernel.name} {abs(hash(source)):x}>"
    # Register the generated source so tracebacks show its lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated code
    functions = {a.name: namespace[f"agent_{a.name}"] for a in placement.agents}
    return CompiledCpu(kernel, placement, source, functions, skeleton, mode)
