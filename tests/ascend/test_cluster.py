"""Clusters on Ascend (tests/core/cluster_kernels.py, xsync.kernels.gemm.gemm_cluster): the AI
cores have no multicast copy, so the programs of a cluster run as independent programs, each
loading its own copy of a multicast field (the allocation table says so). The real triton-ascend
frontend and HIVM compiler (to hivmc) take the same source, and the ascend-sim runs it against
torch."""
import pytest
import torch

from tests.core import cluster_kernels as C
from xsync.backends.ascend import hivm
from xsync.kernels.flash_attn.cluster import attention_cluster, attention_fwd_cluster
from xsync.kernels.gemm import gemm_cluster, gemm_cluster_2wg

pytestmark = pytest.mark.usefixtures("triton_ascend")


@pytest.fixture(scope="module")
def compiler(triton_ascend):
    if hivm.compiler_path() is None:
        pytest.fail("bishengir-compile is missing: the ascend environment installs ascendnpu-ir")


@pytest.mark.parametrize("kernel", [C.rank_rows, gemm_cluster, gemm_cluster_2wg, attention_fwd_cluster],
                         ids=lambda k: k.__name__)
def test_reaches_hivmc(compiler, kernel):
    lowered = kernel.lower("ascend")
    assert "each program loads its own copy" in lowered.allocation.table()
    r = hivm.compile_lowered(lowered, timeout=300)
    assert r.reached_hivmc, r.log[-2000:]


@pytest.mark.parametrize("cluster", [2, 4])
def test_rank_rows_on_the_simulator(cluster):
    torch.manual_seed(cluster)
    n = 3
    x = torch.randn(n * cluster * 16, 16)
    y = torch.zeros_like(x)
    C.rank_rows[(cluster,)](x, y, n, BLOCK=16, STAGES=2, CLUSTER=cluster, backend="ascend-sim")
    torch.testing.assert_close(y, C.rank_rows_ref(x, n, 16, cluster))


def test_cluster_gemm_on_the_simulator():
    torch.manual_seed(5)
    M, N, K = 2 * 2 * 32 - 7, 96, 64
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.zeros(M, N)
    gemm_cluster[(4,)](a, b, c, M, N, K, BM=32, BN=32, BK=32, STAGES=2, CLUSTER=2, backend="ascend-sim")
    torch.testing.assert_close(c, a.double().matmul(b.double()).float(), atol=1e-3, rtol=1e-3)


def test_cluster_gemm_2wg_on_the_simulator():
    """Two matrix replicas a program, B multicast through a 1 -> 2 broadcast pipe: the same source,
    each program loading its own B."""
    torch.manual_seed(6)
    M, N, K = 2 * 2 * 2 * 32 - 7, 96, 64
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.zeros(M, N)
    gemm_cluster_2wg[(4,)](a, b, c, M, N, K, BM=32, BN=32, BK=32, STAGES=2, CLUSTER=2, backend="ascend-sim")
    torch.testing.assert_close(c, a.double().matmul(b.double()).float(), atol=1e-3, rtol=1e-3)


def test_attention_cluster_on_the_simulator():
    """The attention forward whose K and V Hopper multicasts (xsync.kernels.flash_attn.cluster):
    the same source on the simulator, each program loading its own K and V, against SDPA."""
    torch.manual_seed(7)
    q, k, v = (torch.randn(1, 2, 128, 32).bfloat16() for _ in range(3))
    o, lse = attention_cluster(q, k, v, cluster=2, replicas=2, block_m=16, block_n=32, backend="ascend-sim")
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(o.double(), want, atol=1e-2, rtol=1e-2)
    lse_want = torch.logsumexp(q.double() @ k.double().transpose(-1, -2) / 32 ** 0.5, -1)
    torch.testing.assert_close(lse.double(), lse_want, atol=1e-3, rtol=1e-3)
