"""Torch entry points for the flash-attention kernel.

    attention(q, k, v, causal=False, sm_scale=None) -> (o, lse)
        q: [B, Hq, Sq, D], k/v: [B, Hkv, Sk, D] (SDPA layout; Hkv divides Hq for GQA)
        o: [B, Hq, Sq, D] in q's dtype; lse: [B, Hq, Sq] float32 (natural log)
    attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     causal=False, sm_scale=None) -> (o, lse)
        packed q: [total_q, Hq, D], k/v: [total_k, Hkv, D] as in flash_attn_varlen_func;
        o: [total_q, Hq, D]; lse: [Hq, total_q]

Causal masks are bottom-right aligned when Sq != Sk (as flash-attn does). Both are
`torch.library` custom ops (``xsync::attention``, ``xsync::attention_varlen``) with fake
implementations, so they trace under ``torch.compile``. The backend follows
XSYNC_BACKEND (auto: Hopper GPU -> nvidia, NPU -> ascend, else the CPU emulator).
"""
from __future__ import annotations

import math

import torch

from xsync.kernels.flash_attn.kernel import attention_fwd
from xsync.errors import LaunchError

HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)


def block_sizes(backend: str) -> dict:
    """Tile shapes per backend: rows per consumer replica (BM; a program takes 2*BM rows),
    keys per step (BN). Ascend: 64 rows per program as triton-ascend's own attention
    tutorial, so each vector core's softmax tiles leave the compiler room to double-buffer
    (see kernel.py for the measured unified-buffer use)."""
    if backend == "cpu":
        return dict(BM=16, BN=32, STAGES=2)
    if backend in ("ascend", "ascend-sim"):
        return dict(BM=32, BN=128, STAGES=2)
    return dict(BM=64, BN=128, STAGES=2)


def _fail(msg: str, fix: str):
    raise LaunchError(f"attention: {msg}", fix=fix)


def _check(q, k, v, packed: bool):
    want = 3 if packed else 4
    layout = "[total, heads, head_dim]" if packed else "[batch, heads, seq, head_dim]"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            _fail(f"{name} is a {type(t).__name__}", "pass torch tensors")
        if t.dim() != want:
            _fail(f"{name} has shape {tuple(t.shape)}; expected {want} dims {layout}",
                  f"pass {layout} tensors")
        if t.dtype not in DTYPES:
            _fail(f"{name} has dtype {t.dtype}", "use torch.float16 or torch.bfloat16")
        if t.device != q.device:
            _fail(f"{name} is on {t.device} but q is on {q.device}", "put q, k and v on one device")
        if not t.is_contiguous():
            _fail(f"{name} is not contiguous", f"pass {name}.contiguous()")
    if not q.dtype == k.dtype == v.dtype:
        _fail(f"dtypes differ: q {q.dtype}, k {k.dtype}, v {v.dtype}", "cast them to one dtype")
    d = q.shape[-1]
    if d not in HEAD_DIMS or k.shape[-1] != d or v.shape[-1] != d:
        _fail(f"head_dim q={q.shape[-1]} k={k.shape[-1]} v={v.shape[-1]}",
              f"head_dim must be one of {HEAD_DIMS} and equal for q, k and v")
    if k.shape != v.shape:
        _fail(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ", "k and v need one shape")
    axis = 1 if packed else 1
    hq, hk = q.shape[axis], k.shape[axis]
    if hk == 0 or hq % hk:
        _fail(f"{hq} query heads are not a multiple of {hk} key/value heads",
              "grouped-query attention needs the kv head count to divide the q head count")
    if not packed and q.shape[0] != k.shape[0]:
        _fail(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}", "use one batch size")


def programs(backend: str, tiles: int) -> int:
    """Programs to launch for ``tiles`` tiles (the kernel loops over its share of them):
    one per AI core on Ascend (persistent), one per tile elsewhere."""
    if backend in ("ascend", "ascend-sim"):
        from xsync.backends.ascend import core_count
        return max(1, min(tiles, core_count()[0]))
    return max(1, tiles)


def _run(q2, k2, v2, o2, lse2, cu_q, cu_k, max_q, batch, hq, hk, d, causal, scale, layout):
    from xsync.backends import select

    backend = select()
    blocks = block_sizes(backend)
    tiles = math.ceil(max_q / (2 * blocks["BM"])) * batch * hq
    grid = (programs(backend, tiles),)
    attention_fwd[grid](q2, k2, v2, o2, lse2, cu_q, cu_k, float(scale), hq, hq // hk, batch,
                        int(max_q), *layout, D=d, CAUSAL=int(bool(causal)), backend=backend,
                        **blocks)


def attention_impl(q, k, v, causal=False, sm_scale=None):
    _check(q, k, v, packed=False)
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    o = torch.empty_like(q)
    lse = torch.empty((b * hq, sq), dtype=torch.float32, device=q.device)
    if sq == 0 or b == 0:
        return o, lse.view(b, hq, sq)
    ar = torch.arange(0, b + 1, dtype=torch.int32, device=q.device)
    # [B, H, S, D] as [B*H*S, D]: token t of sequence b, head h is row
    # (b*H + h)*S + t = cu[b]*H + h*S + t with cu[b] = b*S, column 0.
    layout = (hq, sq, 0, hk, sk, 0, hq, 0)
    _run(q.view(-1, d), k.view(-1, d), v.view(-1, d), o.view(-1, d), lse, ar * sq, ar * sk,
         sq, b, hq, hk, d, causal, scale, layout)
    return o, lse.view(b, hq, sq)


def attention_varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          causal=False, sm_scale=None):
    _check(q, k, v, packed=True)
    total_q, hq, d = q.shape
    hk = k.shape[1]
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.device != q.device:
            _fail(f"{name} must be a 1-D int32 tensor on {q.device}", f"pass {name}.int()")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        _fail("cu_seqlens_q and cu_seqlens_k have different lengths", "one entry per sequence + 1")
    batch = cu_seqlens_q.numel() - 1
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    o = torch.empty_like(q)
    lse = torch.empty((hq, total_q), dtype=torch.float32, device=q.device)
    if batch <= 0 or total_q == 0:
        return o, lse
    # packed [total, H, D] as [total, H*D]: sequence b, head h starts at row cu[b], column h*D.
    layout = (1, 0, d, 1, 0, d, 0, 1)
    _run(q.view(total_q, hq * d), k.view(-1, hk * d), v.view(-1, hk * d), o.view(total_q, hq * d),
         lse, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), batch, hq, hk, d, causal, scale, layout)
    return o, lse


@torch.library.custom_op("xsync::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return attention_impl(q, k, v, causal, sm_scale)


@_attention_op.register_fake
def _(q, k, v, causal, sm_scale):
    b, hq, sq, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, hq, sq), dtype=torch.float32)


@torch.library.custom_op("xsync::attention_varlen", mutates_args=())
def _attention_varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                         max_seqlen_k: int, causal: bool,
                         sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return attention_varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 causal, sm_scale)


@_attention_varlen_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, sm_scale):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def attention(q, k, v, causal: bool = False, sm_scale: float | None = None):
    """Attention forward on [B, H, S, D] tensors; returns (o, lse)."""
    _check(q, k, v, packed=False)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return _attention_op(q, k, v, bool(causal), float(scale))


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     causal: bool = False, sm_scale: float | None = None):
    """Variable-length attention forward on packed [total, H, D] tensors; returns (o, lse)."""
    _check(q, k, v, packed=True)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return _attention_varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                int(max_seqlen_k), bool(causal), float(scale))
