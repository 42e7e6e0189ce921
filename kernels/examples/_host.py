"""Host-side helpers the example wrappers share: the backend, the grid, tensors the copy engine
can read."""
from __future__ import annotations

import torch


def backend_for(backend=None):
    """The backend a wrapper launches on: ``backend`` (a name or a Backend), else
    ``XSYNC_BACKEND`` / ``xsync.options(backend=...)``, else the first available one."""
    from xsync.backends import select

    return select(backend)


def check_block(block, size: int, name: str = "block") -> tuple:
    """``block`` (a tuple of ``size`` positive ints), or a ValueError naming the argument."""
    if not (isinstance(block, (tuple, list)) and len(block) == size
            and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise ValueError(f"{name}={block!r}: give {size} positive integers (tile sizes)")
    return tuple(block)


def check_positive(name: str, n) -> int:
    """``n`` (a positive int), or a ValueError naming the argument."""
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise ValueError(f"{name}={n!r}: give a positive integer")
    return n


def check_matrix(name: str, t: torch.Tensor) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name} has shape {tuple(t.shape)}: give a 2-D tensor [rows, columns]")


def check_vector(name: str, t: torch.Tensor, n: int) -> None:
    """``t`` has exactly ``n`` elements (a per-column weight or bias of a [*, n] input)."""
    if t.numel() != n:
        raise ValueError(f"{name} has shape {tuple(t.shape)}: the last dimension of the input is {n}, "
                         f"so {name} needs {n} elements")


def pow2(n: int, least: int = 16) -> int:
    """The smallest power of two >= max(n, least): tiles are powers of two, a bound masks the rest."""
    p = least
    while p < n:
        p *= 2
    return p


def programs(backend, tiles: int, device, programs: int | None = None) -> int:
    """Programs of a persistent launch: ``programs`` if given, else one per SM / AI core
    (``Backend.resident_programs``), never more than there are tiles."""
    if programs is None:
        programs = backend.resident_programs(device) or tiles
    return max(1, min(programs, tiles))


def readable(x: torch.Tensor) -> torch.Tensor:
    """``x`` with contiguous rows whose stride is 16-byte aligned (what a Hopper TMA descriptor
    needs): a view of a zero-padded copy where ``x``'s own rows are not aligned."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    per = 16 // x.element_size()
    if x.stride(0) % per == 0 and x.data_ptr() % 16 == 0:
        return x
    cols = -(-x.shape[1] // per) * per
    padded = torch.zeros(x.shape[0], cols, dtype=x.dtype, device=x.device)
    padded[:, :x.shape[1]] = x
    return padded[:, :x.shape[1]]


_FITTED: dict = {}   # (kernel, backend, constexprs) -> the row block that fitted


def launch_rows(kernel, args, rows: int, device, backend, constexprs: dict, block_rows: int,
                programs_: int | None = None) -> None:
    """``kernel[grid](*args, BM=..., **constexprs)`` over ``rows`` rows in blocks of
    ``block_rows``, halved while the backend's memory check refuses the tiles (an
    ``AllocationError`` at compile, before anything runs: e.g. an Ascend vector core's unified
    buffer); the block that fitted is remembered."""
    from xsync.errors import AllocationError

    key = (kernel, backend, tuple(sorted(constexprs.items())), block_rows)
    bm = _FITTED.get(key, block_rows)
    while True:
        grid = (programs(backend, -(-rows // bm), device, programs_),)
        try:
            kernel[grid](*args, BM=bm, **constexprs, backend=backend)
        except AllocationError:
            if bm == 1:
                raise
            bm //= 2
            continue
        _FITTED[key] = bm
        return
