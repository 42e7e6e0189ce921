"""N -> 1 pipes on Hopper, compiled offline for sm_90a with the installed Triton: each producer
replica (a consumer warpgroup, or a copy warp) commits into its own ring of full/empty mbarriers
and shared-memory slots; the one consumer waits on the full barrier of every ring and arrives
on every ring's empty barrier, reading ring r for ``slot[r].field``. On a Hopper GPU: numerics
against torch."""
import re

import pytest

from tests.core.many_to_one_kernels import (copy_gather_into_mma, gemm_split_k_gather, pair_sum_gather,
                                             row_sum_gather, scaled_mma_gather)
from tests.nvidia.conftest import gpu_reason
from xsync.backends.nvidia import compile_ptx


def _lines(src, pattern):
    return [l.strip() for l in src.splitlines() if re.search(pattern, l)]


def test_split_k_gather_compiles_with_a_ring_per_replica():
    r = compile_ptx(gemm_split_k_gather)
    assert len(r.cubin) > 10_000
    src = r.source
    # two rings (one per 'mma' replica) of one stage: full and empty arrays of two mbarriers
    assert "part_acc = gl.allocate_shared_memory(gl.float32, [2, 64, 64]" in src
    waits = _lines(src, r"mbarrier\.wait\(xs_bars\.index\(PART_FULL \+ [01] \+ got\)")
    assert len(waits) == 2 and "replica 0's ring" in waits[0] and "replica 1's ring" in waits[1]
    assert len(_lines(src, r"mbarrier\.arrive\(xs_bars\.index\(PART_EMPTY \+ [01] \+ part_released % 1\)")) == 2
    # each producer replica commits into its own ring, and the consumer reads both
    assert _lines(src, r"mbarrier\.arrive\(xs_bars\.index\(PART_FULL \+ REPLICA \* 1 \+ part_committed % 1\)")
    assert "part_acc.index(0 + got).load(" in src and "part_acc.index(1 + got).load(" in src
    assert len(_lines(r.ptx, r"mbarrier\.try_wait\.parity")) >= 4


def test_row_sum_gather_compiles():
    r = compile_ptx(row_sum_gather)
    assert len(r.cubin) > 10_000
    assert "part_s.index(0 + got)" in r.source and "part_s.index(1 + got)" in r.source


def test_vector_replicas_into_a_matrix_role_compile():
    r = compile_ptx(scaled_mma_gather, dict(BM=64, BN=64, BK=32))
    assert len(r.cubin) > 10_000
    src = r.source
    assert len(_lines(src, r"mbarrier\.wait\(xs_bars\.index\(OPS_FULL \+ [02] \+ got\)")) == 2
    assert len(_lines(src, r"mbarrier\.arrive\(xs_bars\.index\(OPS_EMPTY \+ [02] \+ ops_released % 2\)")) == 2
    # the wgmma A operands come from both replicas' rings
    assert "ops_a.index(0 + got)" in src and "ops_a.index(2 + got)" in src


def test_copy_replicas_fill_their_rings_by_tma():
    r = compile_ptx(pair_sum_gather)
    assert len(r.cubin) > 10_000
    src = r.source
    # each copy warp's TMA completes its own ring's full barrier (expect-tx on its slot)
    assert "mbarrier.expect(xs_bars.index(RING_FULL + s), 8192)" in src
    assert "s = REPLICA * 2 + ring_acquired % 2" in src
    assert len(_lines(src, r"mbarrier\.wait\(xs_bars\.index\(RING_FULL \+ [02] \+ got\)")) == 2
    assert _lines(r.ptx, r"cp\.async\.bulk\.tensor\.2d")


def test_copy_replicas_into_a_matrix_role_compile():
    r = compile_ptx(copy_gather_into_mma)
    assert len(r.cubin) > 10_000
    # the wgmma operands of both rounds' rings come from shared memory, ring r at r * stages
    assert "ab_a.index(0 + got)" in r.source and "ab_a.index(2 + got)" in r.source


GPU = gpu_reason()


@pytest.mark.skipif(bool(GPU), reason=f"needs a Hopper GPU: {GPU}")
@pytest.mark.parametrize("M,N,K", [(256, 192, 512), (130, 72, 200)])   # 72: rows of 144 B, as TMA needs
def test_split_k_gather_numerics_on_gpu(M, N, K):
    import torch

    torch.manual_seed(0)
    a = torch.randn(M, K, device="cuda").bfloat16()
    b = torch.randn(K, N, device="cuda").bfloat16()
    c = torch.zeros(M, N, device="cuda")
    gemm_split_k_gather[(-(-M // 64), -(-N // 64))](a, b, c, M, N, K, BM=64, BN=64, BK=32, STAGES=2,
                                                    backend="nvidia")
    torch.testing.assert_close(c, a.double().mm(b.double()).float(), atol=2e-3, rtol=2e-3)


@pytest.mark.skipif(bool(GPU), reason=f"needs a Hopper GPU: {GPU}")
def test_split_k_gather_refuses_rows_tma_cannot_read():
    """N = 70 bf16 gives B rows of 140 B: refused before launch, naming `b` and the padding that
    fixes it, with C untouched."""
    import torch

    from xsync.errors import LaunchError

    a = torch.randn(130, 200, device="cuda").bfloat16()
    b = torch.randn(200, 70, device="cuda").bfloat16()
    c = torch.full((130, 70), 7.0, device="cuda")
    with pytest.raises(LaunchError, match=r"`b`.*row stride 140 B") as err:
        gemm_split_k_gather[(3, 2)](a, b, c, 130, 70, 200, BM=64, BN=64, BK=32, STAGES=2, backend="nvidia")
    assert "multiple of 8 elements" in str(err.value)
    assert (c == 7.0).all()


@pytest.mark.skipif(bool(GPU), reason=f"needs a Hopper GPU: {GPU}")
def test_row_sum_gather_numerics_on_gpu():
    import torch

    torch.manual_seed(1)
    x = torch.randn(100, 300, device="cuda")
    out = torch.zeros(100, device="cuda")
    row_sum_gather[(-(-100 // 16),)](x, out, 100, 300, BM=16, BN=32, backend="nvidia")
    torch.testing.assert_close(out, x.double().sum(1).float(), atol=1e-4, rtol=1e-5)
