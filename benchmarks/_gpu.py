"""The check every H200 benchmark makes before it measures anything."""
from __future__ import annotations

import os
import sys


def cuda_missing(script: str) -> bool:
    """True, after saying so on stderr, where torch sees no CUDA GPU; else False, with
    XSYNC_BACKEND defaulting to nvidia (these benchmarks time the Hopper backend).
    ``script``: the caller's ``__file__``, named in the message."""
    import torch

    if not torch.cuda.is_available():
        print(f"benchmarks/{os.path.basename(script)} needs a CUDA GPU; none is visible.", file=sys.stderr)
        return True
    os.environ.setdefault("XSYNC_BACKEND", "nvidia")
    return False
