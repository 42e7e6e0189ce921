"""Holding two slots (split counters) and interleaved rings on Hopper, compiled offline for
sm_90a (tests/core/holding_kernels.py): the consumer's wait and release counters index the
mbarriers apart; an interleaved ring is one set of 4 full/empty mbarriers and one shared-memory
ring that the two replica pairs share with stride 2. On a Hopper GPU the same kernels run
against torch."""
import re

import pytest

from tests.core import holding_kernels as H
from tests.nvidia.conftest import gpu_reason
from xsync.backends.nvidia import compile_ptx


def test_pair_sums_compiles_with_split_counters():
    r = compile_ptx(H.pair_sums, dict(BLOCK=64, STAGES=2))
    assert len(r.cubin) > 5_000
    src = r.source
    # two waits before the first release: each counter indexes its own slot and phase
    assert src.count("ring_waited % 2") == 2 and src.count("ring_released % 2") == 2
    assert re.search(r"mbarrier\.try_wait\.parity", r.ptx)


def test_interleaved_gemm_shares_one_ring():
    r = compile_ptx(H.interleaved_gemm, dict(BM=64, BN=64, BK=32, STAGES=4))
    assert len(r.cubin) > 10_000
    src = r.source
    assert "REPLICA + 2 * (ring_acquired % 2)" in src and "REPLICA + 2 * (ring_waited % 2)" in src
    assert "((ring_acquired // 2) & 1) ^ 1" in src and "(ring_waited // 2) & 1" in src
    assert "[4, 64, 32]" in src and "[4, 32, 64]" in src      # one ring of 4 slots, not 2 x 4
    assert re.search(r"wgmma\.mma_async", r.ptx)


def test_sliding_sums_compiles_with_a_carried_slot():
    r = compile_ptx(H.sliding_sums, dict(BLOCK=64, STAGES=2))
    assert len(r.cubin) > 5_000
    assert r.source.count("ring_released % 2") == 3 and r.source.count("ring_waited % 2") == 3


GPU = gpu_reason()


@pytest.mark.skipif(bool(GPU), reason=f"needs a Hopper GPU: {GPU}")
@pytest.mark.parametrize("n", [1, 3, 8])
def test_pair_sums_on_gpu(n):
    """Both slots of a 2-stage ring held, released oldest first, n rounds."""
    import torch

    torch.manual_seed(n)
    x = torch.randn(2 * n * 64, 64, device="cuda")
    y = torch.full_like(x, float("nan"))
    H.pair_sums[(1,)](x, y, n, BLOCK=64, STAGES=2, backend="nvidia")
    torch.cuda.synchronize()
    torch.testing.assert_close(y, H.pair_sums_ref(x, n, 64))


@pytest.mark.skipif(bool(GPU), reason=f"needs a Hopper GPU: {GPU}")
@pytest.mark.parametrize("n", [1, 4, 9])
def test_sliding_sums_on_gpu(n):
    """A held slot carried from one step into the next (two names alternating)."""
    import torch

    torch.manual_seed(n)
    x = torch.randn((2 * n + 1) * 64, 64, device="cuda")
    y = torch.full((2 * n * 64, 64), float("nan"), device="cuda")
    H.sliding_sums[(1,)](x, y, n, BLOCK=64, STAGES=2, backend="nvidia")
    torch.cuda.synchronize()
    torch.testing.assert_close(y, H.sliding_sums_ref(x, n, 64))


@pytest.mark.skipif(bool(GPU), reason=f"needs a Hopper GPU: {GPU}")
@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("K", [32, 96, 512])
def test_interleaved_gemm_on_gpu(stages, K):
    """Two replica pairs on one ring with stride 2; at stages=2 each pair has one slot, which the
    Hopper passes must count per pair (the wgmma kept in flight over a K step needs a second)."""
    import torch

    torch.manual_seed(K + stages)
    a = torch.randn(128, K, device="cuda").bfloat16()
    b = torch.randn(K, 64, device="cuda").bfloat16()
    c = torch.full((128, 64), float("nan"), device="cuda")
    H.interleaved_gemm[(1,)](a, b, c, K, BM=64, BN=64, BK=32, STAGES=stages, backend="nvidia")
    torch.cuda.synchronize()
    torch.testing.assert_close(c, a.double().mm(b.double()).float(), atol=2e-3, rtol=2e-3)
