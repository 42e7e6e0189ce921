"""How the Ascend renderer addresses a tensor parameter: the scalar arguments that travel with
it, and the window an ``xs.load`` / ``xs.store`` reads or writes.

A tensor of 1 or 2 dimensions travels with (rows, cols, row stride) -- a 1-D one as
(length, 1, stride), which ``xs.load_scalar`` tables read; one of 3 or 4 dimensions with its
sizes ``xs_<t>_d<i>`` and the strides ``xs_<t>_s<i>`` of all but its last dimension. The last
stride is 1 by contract (the launcher checks it): with a run-time column stride the HIVM
compiler stores every element of a vector tile in its own 32-byte block (8x the unified
buffer), which overflows UB for any useful tile.

A tile spans the tensor's last 1 or 2 dimensions and each leading offset picks one index: the
leading offsets move the base pointer, and the tile is a 1-D or 2-D block pointer from there.
An out-of-range leading offset makes the block's first extent 0, so its boundary check
zero-fills a load and drops a store, as for a row past the tensor's end.
"""
from __future__ import annotations

from dataclasses import dataclass


def tensor_args(name: str, rank: int = 2) -> list[str]:
    """Extra scalar arguments that travel with a tensor parameter addressed with ``rank``
    offsets (see the module docstring)."""
    if rank <= 2:
        return [f"xs_{name}_rows", f"xs_{name}_cols", f"xs_{name}_s0"]
    return [f"xs_{name}_d{i}" for i in range(rank)] + [f"xs_{name}_s{i}" for i in range(rank - 1)]


def tensor_dims(name: str, rank: int) -> tuple[list[str], list[str]]:
    """The kernel's names of the tensor's sizes and strides, one per dimension."""
    a = tensor_args(name, rank)
    if rank == 1:
        return [a[0]], ["1"]
    if rank == 2:
        return a[:2], [a[2], "1"]
    return a[:rank], a[rank:] + ["1"]


def host_values(v, rank: int) -> list[int]:
    """The values of :func:`tensor_args` for the torch tensor ``v``."""
    if rank <= 2 and v.dim() == 1:
        return [int(v.shape[0]), 1, int(v.stride(0))]
    if rank <= 2:
        return [int(v.shape[0]), int(v.shape[1]), int(v.stride(0))]
    return [int(d) for d in v.shape] + [int(v.stride(i)) for i in range(rank - 1)]


@dataclass(frozen=True)
class Window:
    """The tile's block: the base pointer (moved by the leading offsets), then per tile
    dimension its extent (cut to the bounds; the first one 0 when a leading offset is out of
    range), stride and offset."""

    base: str
    sizes: tuple[str, ...]
    strides: tuple[str, ...]
    offsets: tuple[str, ...]

    def block_ptr(self, block_shape: str) -> str:
        order = "(1, 0)" if len(self.sizes) == 2 else "(0,)"
        return (f"tl.make_block_ptr({self.base}, shape={_tuple(self.sizes)}, strides={_tuple(self.strides)}, "
                f"offsets={_tuple(self.offsets)}, block_shape={block_shape}, order={order})")

    @property
    def boundary_check(self) -> str:
        return "(0, 1)" if len(self.sizes) == 2 else "(0,)"


def window(ptr: str, name: str, rank: int, offsets: list[str], tile_rank: int,
           bounds: list[str] | None = None) -> Window:
    """The window of a ``tile_rank``-D tile at ``offsets`` (one per dimension of the rank-``rank``
    tensor ``name``, spelled ``ptr``), cut to ``bounds`` (one end per dimension) when given."""
    sizes, strides = tensor_dims(name, rank)
    lead = rank - tile_rank
    base = ptr + "".join(f" + ({o}) * {strides[i]}" for i, o in enumerate(offsets[:lead]))
    extents = list(sizes[lead:])
    if bounds:
        extents = [f"tl.minimum({s}, {b})" for s, b in zip(extents, bounds[lead:])]
    inside = [f"({o} < {sizes[i]})" for i, o in enumerate(offsets[:lead])]
    inside += [f"({o} < {b})" for o, b in zip(offsets[:lead], (bounds or [])[:lead])]
    if inside:
        extents[0] = f"{extents[0]} * ({' & '.join(inside)})"
    return Window(base, tuple(extents), tuple(strides[lead:]), tuple(offsets[lead:]))


def _tuple(items) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
