"""Numerics on an Ascend NPU (gemm, gemm_softmax, flash attention vs torch). Every test
here is reported as skipped, with the reason, on a machine without torch_npu / an NPU."""
import pytest
import torch

from xsync.kernels.gemm import gemm
from xsync.kernels.gemm_softmax import gemm_softmax
from xsync.backends.ascend import availability

OK, WHY = availability()
npu = pytest.mark.skipif(not OK, reason=f"needs an Ascend NPU: {WHY}")


@npu
@pytest.mark.parametrize("M,N,K", [(256, 256, 256), (200, 136, 72)])
def test_gemm(M, N, K):
    torch.manual_seed(0)
    a = torch.randn(M, K, dtype=torch.bfloat16, device="npu")
    b = torch.randn(K, N, dtype=torch.bfloat16, device="npu")
    c = torch.zeros(M, N, dtype=torch.float32, device="npu")
    BM, BN = 128, 128
    gemm[(triton_cdiv(M, BM), triton_cdiv(N, BN))](a, b, c, M, N, K, BM=BM, BN=BN, BK=64, STAGES=3,
                                                  backend="ascend")
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=2e-2, atol=2e-1)


@npu
def test_gemm_softmax():
    torch.manual_seed(0)
    M, N, K, BM, BN, TILES = 128, 256, 128, 64, 64, 2
    a = torch.randn(M, K, dtype=torch.bfloat16, device="npu")
    b = torch.randn(K, N, dtype=torch.bfloat16, device="npu")
    out = torch.zeros(M, N, dtype=torch.float32, device="npu")
    grid = (M // BM, N // (BN * TILES))
    gemm_softmax[grid](a, b, out, M, N, K, BM=BM, BN=BN, BK=64, STAGES=2, TILES=TILES,
                       backend="ascend")
    ref = (a.float() @ b.float()).view(M, -1, BN).softmax(-1).view(M, N)
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-3)


@npu
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention(causal):
    fa = pytest.importorskip("xsync.kernels.flash_attn")
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 256, 128, dtype=torch.bfloat16, device="npu") for _ in range(3))
    o, _ = fa.attention(q, k, v, causal=causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                           is_causal=causal)
    torch.testing.assert_close(o.float(), ref, rtol=2e-2, atol=2e-2)


def triton_cdiv(a, b):
    return -(-a // b)
