"""Flash attention written once in the xsync API: the forward (kernel.py) and the backward
(backward.py) kernels, their torch entry points (ops.py, grad.py: custom ops, and autograd
registered on the forward ops)."""
from xsync.kernels.flash_attn.kernel import attention_fwd  # noqa: F401
from xsync.kernels.flash_attn.ops import attention, attention_varlen  # noqa: F401
from xsync.kernels.flash_attn.grad import attention_backward, attention_varlen_backward  # noqa: F401
from xsync.kernels.flash_attn.entry import flash_attn_func, flash_attn_varlen_func, sdpa  # noqa: F401
