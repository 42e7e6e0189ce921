"""The nvidia backend object: Hopper (sm_90a) through Triton 3.6-3.9 Gluon."""
from __future__ import annotations

from xsync.backends.base import Backend
from xsync.backends.nvidia import options
from xsync.backends.nvidia.placement import TARGET, place


class NvidiaBackend(Backend):
    LowerOptions = options.LowerOptions
    RenderOptions = options.RenderOptions

    def probe(self) -> tuple[bool, str]:
        try:
            import triton.experimental.gluon  # noqa: F401
        except ImportError:
            return False, "upstream Triton with Gluon (triton>=3.6,<3.10) is not installed"
        try:
            import torch
        except ImportError:
            return False, "torch is not installed"
        if not torch.cuda.is_available():
            return False, "no CUDA GPU is visible to torch"
        major, minor = torch.cuda.get_device_capability()
        if major != 9:
            return False, f"the GPU is sm_{major}{minor}; the Gluon lowering targets Hopper (sm_90a)"
        return True, ""

    def render_source(self, kernel, placement, allocation, options: options.RenderOptions) -> str:
        """The Gluon module text (``xsync lower --backend nvidia``); needs no GPU and no triton."""
        from xsync.backends.nvidia.render import render

        return render(kernel, placement, allocation, options).source

    def compile(self, kernel, placement, allocation, options: options.RenderOptions):
        """Render the Gluon module, write it to the module cache and import it."""
        from xsync.backends.nvidia.compiled import CompiledNvidia
        from xsync.backends.nvidia.modules import load_module
        from xsync.backends.nvidia.render import render

        result = render(kernel, placement, allocation, options)
        module = load_module(kernel.name, result.source)
        return CompiledNvidia(kernel, placement, allocation, options, result, module)

    def resident_programs(self, device=None) -> int:
        """The GPU's SM count (a persistent launch runs one program per SM)."""
        import torch

        index = torch.cuda.current_device() if device is None or device.index is None else device.index
        if index not in _SMS:
            _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
        return _SMS[index]


_SMS: dict = {}

NVIDIA = NvidiaBackend("nvidia", TARGET, place, device="cuda")
