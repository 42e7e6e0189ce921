"""The generated Gluon kernel's parameter list (its ABI), as typed records: the renderer makes
one :class:`KernelArg` per parameter, in order, and the launch path reads them to build the
host arguments (descriptors, pointers, shapes) from the user's tensors and scalars."""
from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class ArgKind(StrEnum):
    """What the host passes for one kernel parameter."""

    DESC = "desc"              # a TMA load descriptor of a tensor (source: (tensor, block shape))
    STORE_DESC = "store_desc"  # a TMA store descriptor (source: (tensor, block shape))
    STORE_OK = "store_ok"      # 1 when the tensor can take TMA stores, else 0 (source: tensor)
    TABLE = "table"            # an int32 table read with xs.load_scalar (source: tensor)
    PTR = "ptr"                # a plain pointer for masked loads/stores (source: tensor)
    ROWS = "rows"              # the tensor's row count (source: tensor)
    COLS = "cols"              # its column count
    STRIDE = "stride"          # its row stride, in elements
    SIZE = "size"              # size i of a tensor of 1, 3 or 4 dimensions (source: (tensor, i))
    STRIDE_I = "stride_i"      # its stride i, in elements (source: (tensor, i))
    SCALAR = "scalar"          # a run-time scalar parameter (source: its name)
    DBG = "dbg"                # the hang-debug report buffer (source: None)

    @property
    def descriptor(self) -> bool:
        return self in (ArgKind.DESC, ArgKind.STORE_DESC)


class KernelArg(NamedTuple):
    """One parameter of the generated kernel: its name there, what it is, and what it is made
    from (a tensor parameter's name, ``(tensor, block shape)`` for descriptors)."""

    name: str
    kind: ArgKind
    source: object
