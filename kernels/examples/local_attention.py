"""Sliding-window (local) attention: the flagship's kernels with their WINDOW constexpr on, not
a copy of them. A query row i sees keys j with i - left <= j <= i + right (bottom-right aligned
like flash-attn); the key loop starts at the first block any row of a tile can see, so the cost
grows with the window, not with the sequence. Forward and backward (autograd), GQA, varlen
through ``xsync.flash_attn_varlen_func``."""
from __future__ import annotations


def local_attention(q, k, v, window: int, *, causal: bool = True, softmax_scale=None):
    """``q, k, v``: [b, s, h, d] (flash-attn's layout). Each row sees the ``window`` keys before
    it (and, with ``causal=False``, the ``window`` after it)."""
    from xsync.kernels.flash_attn.entry import flash_attn_func

    right = 0 if causal else window
    return flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=(window, right))
