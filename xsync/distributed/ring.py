"""Ring (context-parallel) attention: each rank holds a part of the sequence's queries, keys and
values; K and V travel once around the ring while every rank attends its queries to the block it
holds, and the partial outputs merge through their log-sum-exp.

Forward, on each of the W ranks: W steps; at step s the rank holds the K/V of rank (rank - s) mod W.
It starts sending that block to the next rank and receiving the following one from the previous
rank (one batched isend/irecv), runs xsync's attention on the blocks the causal mask leaves
(layout.step_blocks: the diagonal as a causal block, wholly visible blocks without a mask, wholly
masked ones skipped), merges them into float32 accumulators, and only then waits for the exchange:
the transfer overlaps the block computation.

Backward: the same ring, with the block backward (xsync's attention_backward, given the merged O and
LSE: each block's probabilities are then the global ones) per step. dQ accumulates locally; dK and
dV accumulate in float32 buffers that follow K/V one step behind and reach their owner after a last
hop. Both rotations are in flight while the next step computes.
"""
from __future__ import annotations

import math

import torch

from xsync.distributed import layout as _layout
from xsync.distributed.comm import Comm, Meta, agree
from xsync.errors import LaunchError, XSyncError

_KV_TAG, _DKV_TAG = 41, 42


def _pack(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.cat([k.reshape(-1), v.reshape(-1)])


def _unpack(buf: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor]:
    n = math.prod(shape)
    return buf[:n].view(shape), buf[n:2 * n].view(shape)


def merge(acc_o: torch.Tensor, acc_lse: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
          lo: int, hi: int) -> None:
    """Fold a block's (o, lse) for query rows [lo, hi) into the float32 accumulators, in place:
    the weights exp(lse - max) never overflow, rows no block has reached yet (lse -inf) take the
    block as it is, and a block's rows that saw no key (xsync reports their LSE as +inf, O = 0)
    change nothing."""
    a = acc_lse[:, :, lo:hi]
    b = lse.float()
    b = b.masked_fill(b == math.inf, -math.inf)
    m = torch.maximum(a, b)
    m = m.masked_fill(~torch.isfinite(m), 0.0)
    wa, wb = torch.exp(a - m), torch.exp(b - m)
    total = wa + wb
    inv = torch.where(total > 0, 1.0 / total, torch.zeros_like(total))
    out = acc_o[:, :, lo:hi]
    out.mul_((wa * inv).unsqueeze(-1)).add_(o.float() * (wb * inv).unsqueeze(-1))
    a.copy_(m + torch.log(total))


def _forward(q, k, v, causal: bool, scale: float, comm: Comm, meta: Meta):
    from xsync.kernels.flash_attn import attention

    rank, world = comm.rank, comm.world
    acc_o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    acc_lse = torch.full(q.shape[:3], -math.inf, dtype=torch.float32, device=q.device)
    kv = _pack(k, v)
    for step in range(world):
        src = (rank - step) % world
        pending = None
        if step < world - 1:
            pending = comm.rotate(kv, meta.kv_numel((src - 1) % world), f"the K/V exchange of forward step {step}",
                                  _KV_TAG)
        ck, cv = _unpack(kv, meta.kv_shape(src))
        for b in meta.blocks(rank, src, causal):
            o, lse = attention(q[:, :, b.q_lo:b.q_hi], ck[:, :, b.k_lo:b.k_hi], cv[:, :, b.k_lo:b.k_hi],
                               causal=b.causal, sm_scale=scale)
            merge(acc_o, acc_lse, o, lse, b.q_lo, b.q_hi)
        if pending is not None:
            kv = pending.wait()
    # as xsync's attention: a row that saw no key has O = 0 and LSE +inf
    return acc_o.to(q.dtype), acc_lse.masked_fill(acc_lse == -math.inf, math.inf)


def _backward(do, dlse, q, k, v, o, lse, causal: bool, scale: float, comm: Comm, meta: Meta):
    from xsync.kernels.flash_attn import attention_backward

    rank, world = comm.rank, comm.world
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = _pack(k, v)
    incoming = None          # the accumulated dK/dV of the block held this step, from the previous rank
    for step in range(world):
        src = (rank - step) % world
        pending = None
        if step < world - 1:
            pending = comm.rotate(kv, meta.kv_numel((src - 1) % world),
                                  f"the K/V exchange of backward step {step}", _KV_TAG)
        shape = meta.kv_shape(src)
        ck, cv = _unpack(kv, shape)
        dkv = torch.zeros(2 * math.prod(shape), dtype=torch.float32, device=q.device)
        dk, dv = _unpack(dkv, shape)
        for b in meta.blocks(rank, src, causal):
            rows, cols = slice(b.q_lo, b.q_hi), slice(b.k_lo, b.k_hi)
            g = attention_backward(do[:, :, rows], None if dlse is None else dlse[:, :, rows].contiguous(),
                                   q[:, :, rows], ck[:, :, cols], cv[:, :, cols], o[:, :, rows],
                                   lse[:, :, rows].contiguous(),
                                   causal=b.causal, sm_scale=scale)
            dq[:, :, rows] += g[0]
            dk[:, :, cols] += g[1]
            dv[:, :, cols] += g[2]
        if incoming is not None:
            dkv += incoming.wait()
        # src's accumulator goes on to the next rank; the previous rank sends the one of the block
        # held next step (after the last step: this rank's own, complete)
        incoming = comm.rotate(dkv, meta.kv_numel((src - 1) % world),
                               f"the dK/dV exchange of backward step {step}", _DKV_TAG)
        if pending is not None:
            kv = pending.wait()
    dk, dv = _unpack(incoming.wait(), meta.kv_shape(rank))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, comm, meta):
        o, lse = _forward(q, k, v, causal, scale, comm, meta)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.comm, ctx.meta = causal, scale, comm, meta
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        do = torch.zeros_like(o) if do is None else do.contiguous()
        dlse = None if dlse is None else dlse.contiguous()
        dq, dk, dv = _backward(do, dlse, q, k, v, o, lse, ctx.causal, ctx.scale, ctx.comm, ctx.meta)
        return dq, dk, dv, None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   sm_scale: float | None = None, group=None, layout: str = "zigzag", timeout=None):
    """Attention over a sequence split across the ranks of ``group`` (None: the default group);
    returns this rank's ``(o, lse)``, as ``xsync.kernels.flash_attn.attention`` returns them for
    its rows of the whole sequence.

    q: [B, Hq, Sq_local, D]; k, v: [B, Hkv, Sk_local, D] (Hkv divides Hq: GQA), fp16/bf16, a head
    dim xsync's attention takes. Every rank calls it with the same B, heads, D, dtype, causal,
    layout and sm_scale (checked by one all_gather before the ring). ``causal``: the causal mask
    of the whole sequence; each rank then holds its tokens as ``xsync.distributed.shard`` splits
    them (``layout`` "zigzag", load-balanced, or "contiguous") and Sq_local == Sk_local. Without a
    mask any split works and the lengths may differ from rank to rank (0 included).
    ``timeout`` (seconds or a timedelta): the longest wait on a peer; None: the group's.
    Differentiable (reverse mode): the backward is a ring too. Errors: DistributedError."""
    comm = Comm(group, timeout)
    scale = sm_scale
    refusal: XSyncError | None = None
    try:
        _layout.check_layout(layout)
        from xsync.kernels.flash_attn.ops import _check, _default_scale

        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise LaunchError(f"ring_attention: {name} is a {type(t).__name__}", fix="pass torch tensors")
        scale = _default_scale(q, sm_scale)
        _check(q, k, v, packed=False, sm_scale=scale)
    except XSyncError as exc:
        refusal = exc
        scale = 0.0 if not isinstance(scale, (int, float)) or isinstance(scale, bool) else scale
    meta = agree(comm, q, k, v, bool(causal), float(scale), layout, refusal)
    return _RingAttention.apply(q, k, v, bool(causal), float(scale), comm, meta)


def gather(local: torch.Tensor, group=None, dim: int = 2, layout: str = "zigzag", timeout=None) -> torch.Tensor:
    """The whole sequence from every rank's ``local`` part (the collective inverse of
    ``shard``): parts of any lengths, padded for one all_gather and trimmed. Every rank gets it."""
    comm = Comm(group, timeout)
    n = torch.tensor([local.shape[dim]], dtype=torch.int64, device=local.device)
    lens = comm.all_gather(n, "the length exchange of gather (all_gather)").view(-1).tolist()
    longest = max(lens)
    pad = list(local.shape)
    pad[dim] = longest - local.shape[dim]
    flat = torch.cat([local, local.new_zeros(pad)], dim=dim).contiguous()
    everything = comm.all_gather(flat.reshape(-1), "gather (all_gather)").view(comm.world, *flat.shape)
    parts = [everything[r].narrow(dim, 0, lens[r]) for r in range(comm.world)]
    return _layout.unshard(parts, dim=dim, layout=layout)
