"""CPU emulator backend: threads + torch, exact sync semantics, stall watchdog."""
from __future__ import annotations

import linecache
from dataclasses import dataclass

from xsync import config
from xsync.backends.base import Backend
from xsync.backends.cpu import options as cpu_options
from xsync.backends.cpu.placement import TARGET, place
from xsync.backends.cpu.render import function_names, render, render_mapped
from xsync.lowering import ir
from xsync.lowering.placement import Placement


@dataclass
class CompiledCpu:
    kernel: ir.KernelIR
    placement: Placement
    source: str
    agent_functions: dict
    skeleton: object = None      # xsync.lowering.protocol.Skeleton: the sync objects' meaning
    mode: str = "threads"        # "threads" | "cooperative" (XSYNC_CPU_MODE)
    filename: str = ""           # the generated source's name in frames and linecache
    line_map: tuple = ()         # (generated line, kernel line) per statement (the watchdog)
    loop_names: dict = None      # generated loop variable -> kernel loop variable

    def launch(self, grid: tuple[int, ...], args: dict, settings=None):
        """``settings``: the configuration the caller resolved (xsync.config.Settings; default:
        the one in effect now), for the run-time options (cpu_timeout)."""
        from xsync.backends.cpu import runtime

        settings = settings if settings is not None else config.current()
        runtime.run_grid(self, grid, args, settings.cpu_timeout)


class CpuBackend(Backend):
    cpu_emulator = True
    LowerOptions = cpu_options.LowerOptions
    RenderOptions = cpu_options.RenderOptions

    def probe(self) -> tuple[bool, str]:
        try:
            import torch  # noqa: F401
        except ImportError:
            return False, "torch is not installed"
        return True, ""

    def render_source(self, kernel: ir.KernelIR, placement: Placement, allocation,
                      options: cpu_options.RenderOptions) -> str:
        return render(kernel, placement, getattr(allocation, "skeleton", None), options.mode == "cooperative")

    def compile(self, kernel: ir.KernelIR, placement: Placement, allocation,
                options: cpu_options.RenderOptions) -> CompiledCpu:
        from xsync.lowering.protocol import derive

        skeleton = getattr(allocation, "skeleton", None) or derive(kernel, placement)
        source, line_map, loop_names = render_mapped(kernel, placement, skeleton, options.mode == "cooperative")
        filename = f"<xsync-cpu {kernel.name} {abs(hash(source)):x}>"
        # Register the generated source so tracebacks show its lines.
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace: dict = {}
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated code
        names = function_names(kernel, placement)
        functions = {a.name: namespace[names[a.name]] for a in placement.agents}
        return CompiledCpu(kernel, placement, source, functions, skeleton, options.mode, filename,
                           line_map, loop_names)


CPU = CpuBackend("cpu", TARGET, place, device="cpu")


def render_source(kernel: ir.KernelIR, placement: Placement, allocation, options: dict | None = None) -> str:
    """The emulator's source of a lowered kernel; ``options``: RenderOptions fields (``mode``)
    over the configuration."""
    return CPU.render_source(kernel, placement, allocation,
                             config.render_options(CPU, options, where="render_source(options=...)"))


def compile_kernel(kernel: ir.KernelIR, placement: Placement, allocation, options: dict | None = None) -> CompiledCpu:
    return CPU.compile(kernel, placement, allocation,
                       config.render_options(CPU, options, where="compile_kernel(options=...)"))
