"""Flash-attention forward written once in the xsync API (kernel.py) and its torch entry
points (ops.py)."""
from xsync.kernels.flash_attn.kernel import attention_fwd  # noqa: F401
from xsync.kernels.flash_attn.ops import attention, attention_varlen  # noqa: F401
