"""The tile ops of the vocabulary on torch, as generated CPU agent code calls them
(``rt.load``, ``rt.reduce_max``, ...)."""
from __future__ import annotations

import threading

import torch

# reduce-adds of the agent threads of one program to one tensor: torch's in-place add is not
# atomic across threads (it releases the GIL), the devices' per-element atomics are
_ADD_LOCK = threading.Lock()

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                "int32": torch.int32, "int1": torch.bool}


def cdiv(a, b):
    return -(-a // b)


def arange(start, end):
    return torch.arange(start, end, dtype=torch.int32)


def zeros(shape, dtype):
    return torch.zeros(list(shape), dtype=dtype)


def full(shape, value, dtype):
    return torch.full(list(shape), value, dtype=dtype)


def _region(tensor, offsets, shape, bounds=None):
    """(tensor window, tile window) of a ``shape`` tile at ``offsets`` (one per tensor dimension;
    the tile spans the last len(shape) dimensions, each leading offset picks one index), cut to
    the tensor and ``bounds`` (one end per dimension); None when nothing of the tile is inside."""
    offsets = [int(o) for o in offsets]
    ends = list(tensor.shape)
    if bounds is not None:
        ends = [min(e, int(b)) for e, b in zip(ends, bounds)]
    lead = len(offsets) - len(shape)
    src, dst = [], []
    for i, (o, e) in enumerate(zip(offsets, ends)):
        if o < 0 or o >= e:
            return None
        if i < lead:
            src.append(o)
        else:
            n = min(shape[i - lead], e - o)
            src.append(slice(o, o + n))
            dst.append(slice(0, n))
    return tuple(src), tuple(dst)


def load(tensor, offsets, shape):
    """Tile of ``shape`` at ``offsets``; out-of-bounds elements read as 0 (TMA semantics)."""
    out = torch.zeros(tuple(shape), dtype=tensor.dtype)
    w = _region(tensor, offsets, tuple(shape))
    if w is not None:
        out[w[1]] = tensor[w[0]]
    return out


def load_scalar(tensor, index):
    return int(tensor[int(index)])


def store_add(tensor, offsets, value, bounds=None):
    """``xs.store(..., reduce="add")``: add ``value`` into the tensor at ``offsets`` (each
    element once, in the tensor's dtype), parts outside the tensor or ``bounds`` dropped; adds
    of concurrent agents are serialized, in the order they happen."""
    w = _region(tensor, offsets, tuple(value.shape), bounds)
    if w is not None:
        part = value[w[1]].to(tensor.dtype)
        with _ADD_LOCK:
            tensor[w[0]] += part


def store(tensor, offsets, value, bounds=None):
    """Write ``value`` at ``offsets``; parts outside the tensor or ``bounds`` are dropped."""
    w = _region(tensor, offsets, tuple(value.shape), bounds)
    if w is not None:
        tensor[w[0]] = value[w[1]].to(tensor.dtype)


def trans(x):
    return x.transpose(0, 1)


def reduce_max(x, axis):
    return torch.amax(x, dim=axis)


def reduce_sum(x, axis):
    return torch.sum(x, dim=axis)


def exp2(x):
    return torch.exp2(x)


def log2(x):
    return torch.log2(x)


def _f32(x):
    """The float32 operand of a math function (xsync.api: math computes in float32)."""
    return torch.as_tensor(x).to(torch.float32)


def sqrt(x):
    return torch.sqrt(_f32(x))


def rsqrt(x):
    return torch.rsqrt(_f32(x))


def exp(x):
    return torch.exp(_f32(x))


def log(x):
    return torch.log(_f32(x))


def tanh(x):
    return torch.tanh(_f32(x))


def erf(x):
    return torch.erf(_f32(x))


def sigmoid(x):
    return torch.sigmoid(_f32(x))


def abs_(x):
    return torch.abs(x) if isinstance(x, torch.Tensor) else abs(x)


def pow_(x, n):
    return torch.pow(_f32(x), n)


def where(c, a, b):
    return torch.where(c, torch.as_tensor(a), torch.as_tensor(b))


def maximum(a, b):
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return a if a >= b else b
    return torch.maximum(torch.as_tensor(a), torch.as_tensor(b))


def minimum(a, b):
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return a if a <= b else b
    return torch.minimum(torch.as_tensor(a), torch.as_tensor(b))

