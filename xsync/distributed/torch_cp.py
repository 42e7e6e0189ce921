"""xsync's attention as the block kernel of torch's own context parallelism
(``torch.distributed.tensor.experimental.context_parallel``), for models written against
``F.scaled_dot_product_attention``.

torch's context_parallel swaps ``F.scaled_dot_product_attention`` for a wrapper that turns its
arguments into sequence-sharded DTensors, and DTensor sends the aten SDPA ops (flash, efficient,
cuDNN; not the CPU ones) to its ring (``_templated_ring_attention``), which takes any attention op
returning (out, lse). :func:`context_parallel` here puts ``xsync.sdpa`` in SDPA's place and hands
the ``xsync::attention`` / ``xsync::attention_backward`` ops to that same ring: torch does the
sharding (its head-tail split, the zig-zag layout of ``xsync.distributed.shard`` for lengths that
2W divides), the rotation and the merge; xsync computes every block.

This leans on torch internals (the DTensor handler table and the templated ring are private and
were verified on torch 2.13); where they are missing it raises UnsupportedError. The recommended
path is ``xsync.distributed.ring_attention``: public APIs only, any lengths, the LSE's gradient,
timeouts and errors on every rank (docs/distributed.md compares them).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from xsync.errors import UnsupportedError

_SEQ_DIM = 2


def _torch_ring():
    """torch's context-parallel module, checked for the internals used here."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp
    except ImportError as exc:
        raise UnsupportedError(f"torch {torch.__version__} has no context-parallel module ({exc})",
                               fix="use xsync.distributed.ring_attention") from exc
    missing = [n for n in ("_templated_ring_attention", "_templated_ring_attention_backward", "custom_ops",
                           "context_parallel") if not hasattr(cp, n)]
    if missing:
        raise UnsupportedError(
            f"torch {torch.__version__}'s context_parallel lacks the internals xsync plugs into ({', '.join(missing)})",
            fix="use xsync.distributed.ring_attention (public torch.distributed APIs only)")
    return cp


def _block_forward(query, key, value, is_causal, scale=None, **_):
    from xsync.kernels.flash_attn import attention

    return attention(query, key, value, causal=is_causal, sm_scale=scale)


def _block_backward(query, key, value, out, logsumexp, is_causal, grad_out, scale=None, **_):
    from xsync.kernels.flash_attn import attention_backward

    return attention_backward(grad_out, None, query, key, value, out, logsumexp.contiguous(),
                              causal=is_causal, sm_scale=scale)


def _args(op_call, args, kwargs):
    names = [a.name for a in op_call._schema.arguments]
    return dict(zip(names, args), **kwargs)


def _wrap(tensors, mesh):
    from torch.distributed.tensor import DTensor, Shard

    return tuple(DTensor.from_local(t, mesh, [Shard(_SEQ_DIM)], run_check=False) for t in tensors)


@contextlib.contextmanager
def _balance(cp, causal: bool):
    """torch's ring refuses a non-causal call while its load balancing is on (the default); without
    a mask every split gives the same result, so a non-causal call runs with it off."""
    opts = getattr(cp, "_cp_options", None)
    saved = getattr(opts, "enable_load_balance", None)
    if opts is not None and not causal:
        opts.enable_load_balance = False
    try:
        yield
    finally:
        if opts is not None and saved is not None:
            opts.enable_load_balance = saved


def _forward_handler(op_call, args, kwargs):
    a = _args(op_call, args, kwargs)
    mesh = a["q"].device_mesh
    cp = _torch_ring()
    with _balance(cp, a["causal"]):
        o, lse = cp._templated_ring_attention(
            mesh.get_group(), _SEQ_DIM, _block_forward, a["q"].to_local(), a["k"].to_local(), a["v"].to_local(),
            is_causal=a["causal"], scale=a["sm_scale"])
    return _wrap((o, lse), mesh)


def _backward_handler(op_call, args, kwargs):
    a = _args(op_call, args, kwargs)
    mesh = a["q"].device_mesh
    cp = _torch_ring()
    # torch's ring carries no LSE gradient (SDPA returns O only, as xsync.sdpa does)
    with _balance(cp, a["causal"]):
        grads = cp._templated_ring_attention_backward(
            mesh.get_group(), _SEQ_DIM, _block_backward, a["grad_o"].to_local(), "grad_out", a["q"].to_local(),
            a["k"].to_local(), a["v"].to_local(), a["o"].to_local(), a["lse"].to_local(), a["causal"],
            scale=a["sm_scale"])
    return _wrap(grads[:3], mesh)


def scaled_dot_product_attention(*args, **kwargs):
    """``xsync.sdpa`` under SDPA's name (torch's wrapper replaces the attribute it wraps by name)."""
    from xsync.kernels.flash_attn.entry import sdpa

    return sdpa(*args, **kwargs)


@contextlib.contextmanager
def context_parallel(mesh, *, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
    """torch's ``context_parallel(mesh, buffers=..., buffer_seq_dims=..., no_restore_buffers=...)``
    with xsync's attention computing every block of ``F.scaled_dot_product_attention`` inside it."""
    import xsync.kernels.flash_attn  # noqa: F401 - registers the xsync::attention ops

    cp = _torch_ring()
    handlers = {torch.ops.xsync.attention.default: _forward_handler,
                torch.ops.xsync.attention_backward.default: _backward_handler}
    before = {op: cp.custom_ops.get(op) for op in handlers}
    original = F.scaled_dot_product_attention
    cp.custom_ops.update(handlers)
    F.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        with cp.context_parallel(mesh, buffers=buffers, buffer_seq_dims=buffer_seq_dims,
                                 no_restore_buffers=no_restore_buffers):
            yield
    finally:
        F.scaled_dot_product_attention = original
        for op, h in before.items():
            if h is None:
                cp.custom_ops.pop(op, None)
            else:
                cp.custom_ops[op] = h
