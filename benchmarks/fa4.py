"""FlashAttention-4 (``flash_attn.cute``, its SM90 path) as a timed reference beside xsync and
cuDNN, where it is importable (``bash ../shared/tools/fa4_bundle.sh`` builds a bundle the device
machine can install; its header says how). Where it is not, every row says why instead of a
number: the comparison is absent, never silently replaced.

FA4 takes [B, S, H, D] (and packed [T, H, D] for varlen): the layouts are made once, outside
the timed region, so each implementation is timed on its own native layout."""
from __future__ import annotations

_missing: str | None = None


def available() -> str | None:
    """None when FA4 imports, else why not (said in each row)."""
    global _missing
    if _missing is None:
        try:
            from flash_attn.cute import flash_attn_func, flash_attn_varlen_func  # noqa: F401
            _missing = ""
        except Exception as exc:  # noqa: BLE001 - any import failure is the row's reason
            _missing = f"FA4 not importable: {type(exc).__name__}: {str(exc)[:160]}"
    return _missing or None


def _out(result):
    return result[0] if isinstance(result, tuple) else result


def forward(q, k, v, causal: bool):
    """A [b, h, s, d] -> [b, h, s, d] attention forward through FA4 (the inputs re-laid out
    once, here)."""
    from flash_attn.cute import flash_attn_func

    qs, ks, vs = (x.transpose(1, 2).contiguous().detach().requires_grad_(x.requires_grad) for x in (q, k, v))

    def run(*_):
        return _out(flash_attn_func(qs, ks, vs, causal=causal)).transpose(1, 2)
    return run, (qs, ks, vs)


def varlen_forward(q, k, v, cu, max_len: int, causal: bool):
    from flash_attn.cute import flash_attn_varlen_func

    def run():
        return _out(flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                           max_seqlen_q=max_len, max_seqlen_k=max_len, causal=causal))
    return run
