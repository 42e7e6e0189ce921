"""Huawei Ascend backend (triton-ascend)."""
from __future__ import annotations


def availability() -> tuple[bool, str]:
    try:
        import torch_npu  # noqa: F401
    except Exception:  # noqa: BLE001 - torch_npu raises several kinds without CANN
        return False, "torch_npu is not importable (needs CANN and an Ascend NPU)"
    import torch
    if not torch.npu.is_available():
        return False, "no Ascend NPU is visible to torch_npu"
    try:
        import triton.backends  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError:
        return False, "triton-ascend is not installed"
    return True, ""
