"""The variant kernels (kernels/flash_attn/variants.py, kernels/gemm_variants.py) mean what
their flagships mean: on the CPU emulator they compute the same outputs, and they verify on
every target they can be placed on."""
import pytest
import torch

from xsync.kernels import gemm_variants
from xsync.kernels.flash_attn import attention_fwd, variants
from xsync.kernels.gemm import gemm

GEMMS = ["gemm_split", "gemm_two_pipes", "gemm_two_pipes_split", "gemm_2wg", "gemm_2wg_split"]


@pytest.mark.parametrize("causal", [False, True])
def test_attention_variants_compute_the_flagship_outputs(causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 48, 64).bfloat16() for _ in range(3))     # a partial last block
    ref_o, ref_lse = variants.run_dense(attention_fwd, q, k, v, causal, backend="cpu")
    for name, kernel in variants.VARIANTS.items():
        o, lse = variants.run_dense(kernel, q, k, v, causal, backend="cpu")
        torch.testing.assert_close(o, ref_o, atol=2e-2, rtol=0, msg=name)
        torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=0, msg=name)


def test_gemm_variants_compute_the_flagship_output():
    torch.manual_seed(0)
    M, N, K = 64, 32, 64
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    ref = torch.zeros(M, N)
    tiles = dict(BM=16, BN=16, BK=16, STAGES=2)
    gemm[(M // 16, N // 16)](a, b, ref, M, N, K, **tiles, backend="cpu")
    torch.testing.assert_close(ref, a.float() @ b.float(), atol=1e-3, rtol=1e-3)
    for name in GEMMS:
        c = torch.zeros(M, N)
        rows = 32 if "2wg" in name else 16
        getattr(gemm_variants, name)[(M // rows, N // 16)](a, b, c, M, N, K, **tiles, backend="cpu")
        torch.testing.assert_close(c, ref, atol=1e-4, rtol=0, msg=name)


@pytest.mark.parametrize("name", GEMMS)
def test_gemm_variants_verify_on_every_target(name):
    for backend in ("cpu", "nvidia", "ascend"):
        assert getattr(gemm_variants, name).lower(backend).report.complete, (name, backend)
