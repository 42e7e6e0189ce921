"""Examples to copy from: each module is one xsync kernel source (proven for every backend,
compiled for Hopper and Ascend; split-K's Ascend form needs triton-ascend 3.2.1+, split_k.py)
plus the torch function that launches it. docs/tutorial.md §12 walks through norms.py.

| module | kernel | torch function |
|---|---|---|
| gemm_epilogue.py | persistent GEMM, C = act(A @ B + bias), GELU erf / tanh | ``matmul_bias_act`` |
| split_k.py | split-K GEMM, partial tiles reduce-added into fp32, then cast | ``matmul_split_k`` |
| norms.py | RMSNorm and LayerNorm, forward and backward (dx, dweight, dbias) | ``rms_norm``, ``layer_norm`` (autograd) and their ``*_forward`` / ``*_backward`` |
| row_softmax.py | row softmax, online over column blocks for wide rows | ``softmax`` |
| local_attention.py | sliding-window attention: the flagship's kernels with WINDOW on (no copy) | ``local_attention`` |

Every function takes ``backend=`` (a name such as "cpu", "nvidia", "ascend", "ascend-sim", or a
Backend); left out, ``XSYNC_BACKEND`` / ``xsync.options(backend=...)`` decides, and unset the
first available backend (a Hopper GPU, an Ascend NPU, else the CPU emulator).
"""
from xsync.kernels.examples.gemm_epilogue import gemm_bias_act, matmul_bias_act  # noqa: F401
from xsync.kernels.examples.split_k import gemm_split_k, matmul_split_k  # noqa: F401
from xsync.kernels.examples.norms import (layer_norm, layer_norm_backward, layer_norm_forward,  # noqa: F401
                                          layernorm_bwd, layernorm_fwd, rms_norm, rms_norm_backward,
                                          rms_norm_forward, rmsnorm_bwd, rmsnorm_fwd)
from xsync.kernels.examples.local_attention import local_attention  # noqa: F401
from xsync.kernels.examples.row_softmax import softmax, softmax_rows  # noqa: F401
