"""N -> 1 pipes on Ascend: matrix replicas (computed in lockstep by the cube) gathered into one
vector role. The cube writes each replica's partial into its own GM ring and sets the FULL flag
once; each vector core waits once and reads both rings (``slot[r].field``); its EMPTY set is
the one the cube's next acquire waits for. The real HIVM compiler reaches hivmc with the flags
xsync placed; the simulator matches torch in both source forms. Vector replicas gathered into a
vector role would need a vector -> vector flag, which Ascend lacks: refused at check."""
import pytest
import torch

import xsync as xs
from tests.core.many_to_one_kernels import (copy_gather_into_mma, gemm_split_k_gather, pair_sum_gather,
                                             row_sum_gather, scaled_mma_gather)
from xsync.backends.ascend import hivm
from xsync.errors import BackendError

SMALL = dict(BM=32, BN=32, BK=16, STAGES=2)


@pytest.fixture(scope="module")
def compiler(triton_ascend):
    if hivm.compiler_path() is None:
        pytest.fail("bishengir-compile is missing: the ascend environment installs ascendnpu-ir")


def test_split_k_gather_reaches_hivmc_with_xsync_flags(compiler):
    lowered = gemm_split_k_gather.lower("ascend", SMALL)
    r = hivm.compile_lowered(lowered, timeout=300)
    assert r.reached_hivmc, r.log[-2000:]
    syncs = [ln.strip() for t in r.functions.values() for ln in t.splitlines() if "hivm.hir.sync_block" in ln]
    ids = dict(lowered.allocation.event_ids)
    full, empty = ids["part:full"], ids["part:empty"]
    # one FULL set per round (after both replicas' slots), one EMPTY wait; no compiler-made flags
    assert sum(f"sync_block_set[<CUBE>" in s and f"flag = {full}" in s for s in syncs) == 1
    assert sum(f"sync_block_wait[<VECTOR>" in s and f"flag = {full}" in s for s in syncs) == 1
    assert sum(f"flag = {empty}" in s for s in syncs) >= 2
    assert all(f"flag = {full}" in s or f"flag = {empty}" in s for s in syncs), syncs


@pytest.mark.parametrize("form", ["release", "scope"])
@pytest.mark.parametrize("M,N,K", [(100, 70, 200), (64, 64, 64)])
def test_split_k_gather_on_the_simulator(form, M, N, K):
    torch.manual_seed(0)
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.zeros(M, N)
    with xs.options(ascend_form=form):
        src = gemm_split_k_gather.compile("ascend-sim", SMALL).source
        gemm_split_k_gather[(-(-M // 32), -(-N // 32))](a, b, c, M, N, K, **SMALL, backend="ascend-sim")
    assert "got_p0_acc = tl.load(" in src and "got_p1_acc = tl.load(" in src
    torch.testing.assert_close(c, a.double().mm(b.double()).float(), atol=2e-4, rtol=2e-4)


def test_vector_replicas_into_a_matrix_role_reach_hivmc(compiler):
    lowered = scaled_mma_gather.lower("ascend")
    r = hivm.compile_lowered(lowered, timeout=300)
    assert r.reached_hivmc, r.log[-2000:]
    ids = dict(lowered.allocation.event_ids)
    syncs = [ln.strip() for t in r.functions.values() for ln in t.splitlines() if "hivm.hir.sync_block" in ln]
    # each vector core sets FULL once per round (after both replicas' slots); the cube waits once
    assert sum("sync_block_set[<VECTOR>" in s and f"flag = {ids['ops:full']}" in s for s in syncs) == 1
    assert sum("sync_block_wait[<CUBE>" in s and f"flag = {ids['ops:full']}" in s for s in syncs) == 1


@pytest.mark.parametrize("form", ["release", "scope"])
def test_vector_replicas_into_a_matrix_role_on_the_simulator(form):
    torch.manual_seed(2)
    M, N, K = 70, 50, 150
    x, w = torch.randn(M, K), torch.randn(K, N).bfloat16()
    y = torch.zeros(M, N)
    with xs.options(ascend_form=form):
        scaled_mma_gather[(3, 2)](x, w, y, M, N, K, BM=32, BN=32, BK=32, backend="ascend-sim")
    torch.testing.assert_close(y, (x * 0.5).bfloat16().double().mm(w.double()).float(), atol=1e-3, rtol=1e-3)


def test_copy_replicas_vector_only_on_the_simulator():
    # no matrix work: one vector core runs both copy replicas and the vector role, the rings
    # in GM in program order
    from tests.core.test_many_to_one import pair_sum_reference
    torch.manual_seed(3)
    x = torch.randn(100, 384).half()
    y = torch.zeros(100, 192)
    src = pair_sum_gather.compile("ascend-sim").source
    pair_sum_gather[(2,)](x, y, 100, 384, BM=64, BN=64, backend="ascend-sim")
    assert "got_p0_t = tl.load(" in src and "got_p1_t = tl.load(" in src and "tl.sync_block" not in src
    torch.testing.assert_close(y, pair_sum_reference(x))


@pytest.mark.parametrize("form", ["release", "scope"])
def test_copy_replicas_into_the_cube_on_the_simulator(form):
    # copy and matrix share the cube: the gathered slots are plain values per replica
    torch.manual_seed(0)
    M, N, K = 70, 50, 150
    a, b, c = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16(), torch.zeros(M, N)
    with xs.options(ascend_form=form):
        copy_gather_into_mma[(3, 2)](a, b, c, M, N, K, BM=32, BN=32, BK=32, backend="ascend-sim")
    torch.testing.assert_close(c, a.double().mm(b.double()).float(), atol=2e-4, rtol=2e-4)


def test_vector_replicas_into_a_vector_role_are_refused():
    with pytest.raises(BackendError) as info:
        row_sum_gather.compile("ascend-sim")
    err = info.value
    assert "many_to_one_kernels.py:" in str(err) and "pipe 'part'" in str(err)
    assert "cube -> vector or vector -> cube" in str(err) and "N -> 1 pipe" in err.fix
