"""xsync: one producer/consumer synchronization vocabulary for accelerator kernels,
lowered onto NVIDIA Hopper (Gluon), Huawei Ascend (triton-ascend) and a CPU emulator."""
import os as _os

from xsync import _source_kernels

_source_kernels.install(_os.path.dirname(_os.path.abspath(__file__)))
from xsync.api import (  # noqa: F401  (the vocabulary: every tile op and declaration)
    DType, abs, arange, barrier, bfloat16, cdiv, cluster, cluster_id, cluster_rank, constexpr, erf,
    event, exp, exp2, float16, float32, full, int1, int32, kernel, load, load_scalar, log, log2, max,
    maximum, minimum, mma, mma_wait, num_clusters, num_programs, num_replicas, pipe, pow,
    program_id, replica_id, role, rsqrt, sigmoid, signal, sqrt, store, sum, tanh, tile, tile_range,
    trans, wait, where, zeros,
)
from xsync.config import ConfigError, options  # noqa: F401
from xsync.errors import (  # noqa: F401
    AllocationError, BackendError, CacheWarning, CounterLimitError, DeadlockError, DistributedError,
    FlagOverflowError,
    KernelSourceError, LaunchError, LeftoverError, PhaseAliasingError, ProtocolError,
    SimulationError, SlotOrderError, StallError, UnsupportedError, VerifierLimitError,
    XSyncError,
)

__version__ = "0.1.0"

_ENTRY_POINTS = ("sdpa", "flash_attn_func", "flash_attn_varlen_func")


def __getattr__(name):
    # the attention entry points import torch: loaded on first use, so `import xsync` stays light
    if name in _ENTRY_POINTS:
        from xsync.kernels.flash_attn import entry

        return getattr(entry, name)
    raise AttributeError(f"module 'xsync' has no attribute {name!r}")
