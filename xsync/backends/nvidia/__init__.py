"""NVIDIA Hopper backend (Triton 3.6 Gluon)."""
from __future__ import annotations


def availability() -> tuple[bool, str]:
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:
        return False, "Triton with Gluon (triton==3.6.*) is not installed"
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
