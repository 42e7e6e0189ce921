"""Holding two slots (split counters) and interleaved rings on Hopper, compiled offline for
sm_90a (tests/core/holding_kernels.py): the consumer's wait and release counters index the
mbarriers apart; an interleaved ring is one set of 4 full/empty mbarriers and one shared-memory
ring that the two replica pairs share with stride 2."""
import re

from tests.core import holding_kernels as H
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
