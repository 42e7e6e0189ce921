"""Entry points with the semantics users already compare against (docs/entry_points.md).

    sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False) -> out
        torch.nn.functional.scaled_dot_product_attention: [B, H, S, D], causal mask aligned
        TOP-LEFT (query i sees keys j <= i), returns one tensor.
    flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False) -> out | (out, lse, None)
        flash-attn 2's: [B, S, H, D], causal mask aligned BOTTOM-RIGHT (query i sees keys
        j <= i + Sk - Sq), sliding window (left, right) as flash-attn's (window.py), lse [B, H, S].
    flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)
        packed [total, H, D], bottom-right per sequence, lse [H, total].

All three run ``xsync.kernels.flash_attn.attention`` / ``attention_varlen`` on views of the
caller's tensors (no copies where the strides allow: layouts.py), so autograd and
torch.compile work as for those ops. What the kernels do not compute (a general attn_mask,
dropout, softcap, ALiBi) raises UnsupportedError naming the argument; nothing falls back
silently. Sliding windows (``window_size``) run in the kernels, forward and backward.
"""
from __future__ import annotations

import torch

from xsync.compiler import caller_loc
from xsync.errors import LaunchError, UnsupportedError
from xsync.kernels.flash_attn import layouts
from xsync.kernels.flash_attn import window as _window
from xsync.kernels.flash_attn.ops import attention, attention_varlen


def _unsupported(entry: str, arg: str, value, fix: str):
    raise UnsupportedError(f"{entry}: {arg}={value!r} is not supported by xsync's attention kernels",
                           loc=caller_loc(), objects=(arg,), fix=fix)


def _dims(entry: str, layout: str, want: int, **tensors):
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise LaunchError(f"{entry}: {name} is a {type(t).__name__}", loc=caller_loc(), objects=(name,),
                              fix="pass torch tensors")
        if t.dim() != want:
            raise LaunchError(f"{entry}: {name} has shape {tuple(t.shape)}; expected {want} dims {layout}",
                              loc=caller_loc(), objects=(name,), fix=f"pass {layout} tensors")


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False):
    """``torch.nn.functional.scaled_dot_product_attention`` on xsync's kernels: same signature,
    same result. Layout [B, H, S, D]; ``is_causal`` aligns the mask top-left as torch does
    (query i sees keys j <= i, also when Sq != Sk); a row that sees no key (Sk = 0) is 0, as
    torch's CPU SDPA gives. Key/value heads fewer than query heads need ``enable_gqa=True``
    (as torch). ``attn_mask`` must be None and ``dropout_p`` 0: anything else raises
    UnsupportedError naming it. Differentiable (reverse mode)."""
    entry = "xsync.sdpa"
    _dims(entry, "[batch, heads, seq, head_dim]", 4, query=query, key=key, value=value)
    if attn_mask is not None:
        _unsupported(entry, "attn_mask", f"<{type(attn_mask).__name__}>",
                     "pass attn_mask=None (use is_causal=True for a causal mask); a general mask "
                     "needs torch.nn.functional.scaled_dot_product_attention")
    if dropout_p:
        _unsupported(entry, "dropout_p", dropout_p, "pass dropout_p=0.0 (in eval, or without attention "
                     "dropout); dropout needs torch.nn.functional.scaled_dot_product_attention")
    hq, hk = query.shape[1], key.shape[1]
    if hq != hk and not enable_gqa:
        raise LaunchError(f"{entry}: query has {hq} heads and key {hk}, and enable_gqa is False",
                          loc=caller_loc(), objects=("enable_gqa",),
                          fix="pass enable_gqa=True for grouped-query attention (as torch requires)")
    sq, sk = query.shape[2], key.shape[2]
    if not is_causal or sq == sk:
        return attention(query, key, value, bool(is_causal), scale)[0]
    if sq < sk:
        # top-left: no query sees a key at or past Sq; on the first Sq keys top-left and
        # bottom-right coincide
        return attention(query, key[:, :, :sq], value[:, :, :sq], True, scale)[0]
    # sq > sk: rows below Sk see all keys (no mask); the first Sk rows are a square causal block
    tail = attention(query[:, :, sk:], key, value, False, scale)[0]
    if sk == 0:
        return tail
    head = attention(query[:, :, :sk], key, value, True, scale)[0]
    return torch.cat([head, tail], dim=2)


def _flash_args(entry, dropout_p, window_size, softcap, alibi_slopes):
    """Refuse what the kernels do not compute; the window as attention takes it."""
    if dropout_p:
        _unsupported(entry, "dropout_p", dropout_p, "pass dropout_p=0.0 (flash-attn's own kernels do dropout)")
    _window.normalize(window_size, False, entry)
    if softcap:
        _unsupported(entry, "softcap", softcap, "pass softcap=0.0")
    if alibi_slopes is not None:
        _unsupported(entry, "alibi_slopes", "<tensor>", "pass alibi_slopes=None")
    return None if window_size is None else tuple(window_size)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """``flash_attn.flash_attn_func`` on xsync's kernels: q [B, Sq, Hq, D], k/v [B, Sk, Hk, D]
    (Hk divides Hq), causal aligned bottom-right (query i sees keys j <= i + Sk - Sq; rows that
    see none give 0). ``window_size=(left, right)``: query i sees keys i + Sk - Sq - left ..=
    i + Sk - Sq + right (-1: unbounded; causal sets right = 0), computed by the kernels, which
    skip the key blocks outside the window. Returns out [B, Sq, Hq, D] (contiguous when q is),
    with ``return_attn_probs`` the tuple (out, softmax_lse [B, Hq, Sq] float32, None); the
    backward is always deterministic."""
    entry = "xsync.flash_attn_func"
    _dims(entry, "[batch, seq, heads, head_dim]", 4, q=q, k=k, v=v)
    window = _flash_args(entry, dropout_p, window_size, softcap, alibi_slopes)
    o, lse = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bool(causal), softmax_scale,
                       window_size=window)
    out = o.transpose(1, 2)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    """``flash_attn.flash_attn_varlen_func`` on xsync's kernels: packed q [total_q, Hq, D],
    k/v [total_k, Hk, D], int32 cumulative lengths; causal and ``window_size`` bottom-right per
    sequence (as flash_attn_func). Returns
    out [total_q, Hq, D], with ``return_attn_probs`` (out, softmax_lse [Hq, total_q], None)."""
    entry = "xsync.flash_attn_varlen_func"
    _dims(entry, "[total, heads, head_dim]", 3, q=q, k=k, v=v)
    window = _flash_args(entry, dropout_p, window_size, softcap, alibi_slopes)
    if block_table is not None:
        _unsupported(entry, "block_table", "<tensor>", "pass contiguous packed k and v (block_table=None)")
    k, v = layouts.mqa_heads(k, v, 1, q.shape[1])
    o, lse = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              bool(causal), softmax_scale, window_size=window)
    return (o, lse, None) if return_attn_probs else o
