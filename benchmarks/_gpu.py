"""The check every H200 benchmark makes before it measures anything, and where a result goes."""
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


def write_result(results: dict, stem: str, out: str | None = None) -> str:
    """``results`` as ``<stem>_<time>.json`` in benchmarks/results and in ``out`` (if given);
    returns the file name."""
    import json
    import time

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    name = f"{stem}_{time.strftime('%Y%m%d-%H%M%S')}.json"
    text = json.dumps(results, indent=2) + "\n"
    for folder in filter(None, [os.path.join(root, "benchmarks", "results"), out]):
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return name
