"""``attn_implementation="xsync"`` for Hugging Face transformers.

    import xsync.integrations.transformers as xt
    xt.register()          # also done on import
    model = AutoModelForCausalLM.from_config(config, attn_implementation="xsync")

Registers ``attention_forward`` with ``transformers.AttentionInterface`` and, for masks, the
same mask builder as ``sdpa`` with ``transformers.AttentionMaskInterface`` (without one,
transformers would build no mask at all for an unknown implementation and padding would be
silently ignored). The attention then sees what SDPA sees:

* no mask (an unpadded batch, causal or not): ``is_causal`` as transformers gives it
  (``module.is_causal`` by default), q_length > 1; a causal call with kv_length > q_length
  (prefill into an empty static cache) sees the first q_length keys, as sdpa does;
* a boolean mask [B or 1, 1, Sq, Sk] that is the causal mask aligned bottom-right (the
  lower triangle a prompt continued from a cache gets), or all True: taken as that mask.
  Reading it costs one comparison on the device and a host sync;
* the sliding-window mask of Mistral-style models (the causal mask cut to the last W keys):
  taken as ``window_size=(W - 1, 0)``, so only the window's key blocks are read;
* any other mask (padding, a float bias) raises UnsupportedError naming
  the mask: xsync's kernels cannot express it, and nothing falls back silently.

Dropout (training with ``attention_dropout > 0``), ``softcap`` and ``output_attentions`` are
refused the same way. q, k and v reach the kernels as transformers passes them (the
``transpose(1, 2)`` views, no copy) and GQA stays grouped (no ``repeat_kv``).
"""
from __future__ import annotations

import torch

from xsync.compiler import caller_loc
from xsync.errors import UnsupportedError

NAME = "xsync"


def _refuse(what: str, fix: str):
    raise UnsupportedError(f'attn_implementation="{NAME}": {what}', loc=caller_loc(), objects=("attention_mask",),
                           fix=fix)


def _mask_kind(mask: torch.Tensor, q_len: int, k_len: int) -> tuple[bool, int]:
    """(causal, left window) of the mask: the bottom-right causal mask (-1: no window), a
    sliding window of it (each row sees itself and the ``left`` keys before it: Mistral-style
    models), or all True (False, -1); anything else is refused."""
    if mask.dtype != torch.bool:
        _refuse(f"a {mask.dtype} attention mask (an additive bias) cannot be expressed",
                "use a boolean or no mask (transformers' causal mask for an unpadded batch)")
    if mask.dim() != 4 or mask.shape[-2:] != (q_len, k_len) or mask.shape[1] != 1:
        _refuse(f"an attention mask of shape {tuple(mask.shape)} cannot be expressed",
                "pass batches without padding (one causal mask for all rows and heads)")
    i = torch.arange(q_len, device=mask.device)[:, None]
    j = torch.arange(k_len, device=mask.device)[None, :]
    causal = j <= i + (k_len - q_len)
    if bool((mask == causal).all()):
        return True, -1
    if bool(mask.all()):
        return False, -1
    left = int(mask[0, 0, -1].sum()) - 1        # the last row sees the window's full width
    if left >= 0 and bool((mask == (causal & (j >= i + (k_len - q_len) - left))).all()):
        return True, left
    _refuse("the attention mask is neither causal (aligned bottom-right), a sliding window of it, nor "
            "all True: padding or another pattern xsync's kernels cannot express",
            "pass batches without padding tokens (or pack them and call xsync.flash_attn_varlen_func), "
            "or use attn_implementation=\"sdpa\" for this model")


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' attention signature: query [B, Hq, Sq, D], key/value [B, Hk, Sk, D];
    returns (attn_output [B, Sq, Hq, D], None)."""
    from xsync.kernels.flash_attn.ops import attention

    if dropout:
        _refuse(f"dropout={dropout} (attention dropout in training) is not supported",
                "set the config's attention_dropout to 0.0, or call model.eval()")
    if kwargs.get("softcap") is not None:
        _refuse("softcap is not supported", "use a model without attention logit softcapping")
    if kwargs.get("output_attentions"):
        _refuse("output_attentions=True is not supported (the kernels never form the attention "
                "matrix)", "pass output_attentions=False")
    if kwargs.get("position_bias") is not None or kwargs.get("sinks") is not None:
        _refuse("position_bias / attention sinks are not supported", "use attn_implementation=\"sdpa\"")
    q_len, k_len = query.shape[2], key.shape[2]
    left = -1
    if attention_mask is not None:
        causal, left = _mask_kind(attention_mask, q_len, k_len)
    else:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        causal = bool(causal) and q_len > 1
        if causal and k_len > q_len:
            # sdpa's top-left mask: the first q_len keys (prefill into an empty static cache)
            key, value = key[:, :, :q_len], value[:, :, :q_len]
    out, _ = attention(query, key, value, causal, scaling, window_size=(left, 0 if causal else -1))
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register ``attn_implementation="xsync"`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


register()
