"""The backends: XSYNC_BACKEND = nvidia | ascend | ascend-sim | cpu | auto (unset).

Each backend is one :class:`~xsync.backends.base.Backend` object, registered here; adding a
backend means adding its package and one ``register`` line below. Auto picks nvidia on a
CUDA GPU with Triton Gluon, ascend on an NPU with torch_npu and triton-ascend, else the CPU
emulator. ``ascend-sim`` lowers for Ascend and runs the generated triton-ascend code in
xsync's cube/vector simulator on the CPU (needs triton-ascend, no NPU). An unknown or
unavailable backend is an error that lists the valid values and says why the backend cannot
run here. Availability is probed lazily (importing xsync imports neither triton nor
torch_npu).
"""
from __future__ import annotations

from xsync.backends.base import Backend  # noqa: F401
from xsync.backends.registry import backends, get, names, register, select, target_names  # noqa: F401

from xsync.backends.cpu import CPU
from xsync.backends.nvidia.backend import NVIDIA
from xsync.backends.ascend import ASCEND, ASCEND_SIM

register(CPU, auto_rank=2)
register(NVIDIA, auto_rank=0)
register(ASCEND, auto_rank=1)
register(ASCEND_SIM)


def place(kernel, backend):
    """``backend``'s placement of ``kernel`` (``backend``: a Backend or its name)."""
    return get(backend).place(kernel)
