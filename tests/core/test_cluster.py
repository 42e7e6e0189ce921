"""Clusters (xs.cluster) and multicast pipe fields on the CPU emulator and at check: results
against torch for clusters of 1, 2 and 4 programs, the frontend's rules (xsync/lowering/cluster.py)
at the user's line on every backend, whole clusters at launch, and the allocation rows that say
what each target does with a multicast field."""
import inspect

import pytest
import torch

import xsync as xs
from tests.core import cluster_kernels as C
from xsync.errors import KernelSourceError, LaunchError
from xsync.kernels.gemm import gemm_cluster, gemm_cluster_2wg

BACKENDS = ("cpu", "nvidia", "ascend")


@pytest.mark.parametrize("cluster", [1, 2, 4])
@pytest.mark.parametrize("programs", [1, 2])
def test_rank_rows(cluster, programs):
    torch.manual_seed(cluster)
    n = 3
    x = torch.randn(n * cluster * 16, 16)
    y = torch.zeros_like(x)
    C.rank_rows[(programs * cluster,)](x, y, n, BLOCK=16, STAGES=2, CLUSTER=cluster, backend="cpu")
    torch.testing.assert_close(y, C.rank_rows_ref(x, n, 16, cluster))


def test_single_tile_clusters():
    n, cluster = 3, 2
    x = torch.randn(n * cluster * 16, 16)
    y = torch.zeros_like(x)
    C.single_tile_rows[(n * cluster,)](x, y, n, BLOCK=16, STAGES=2, CLUSTER=cluster, backend="cpu")
    torch.testing.assert_close(y, C.rank_rows_ref(x, n, 16, cluster))
    with pytest.raises(LaunchError, match=r"for 3 tiles: 1 tile\(s\) would never run"):
        C.single_tile_rows[(4,)](x, y, n, BLOCK=16, STAGES=2, CLUSTER=cluster, backend="cpu")


def test_launch_needs_whole_clusters():
    x = torch.randn(64, 16)
    y = torch.zeros_like(x)
    with pytest.raises(LaunchError) as e:
        C.rank_rows[(3,)](x, y, 2, BLOCK=16, STAGES=2, CLUSTER=2, backend="cpu")
    assert "groups 2 programs into a cluster" in str(e.value) and "launch a multiple of 2" in str(e.value)
    assert e.value.loc.line == inspect.getsourcelines(C.rank_rows.fn)[1] + 4


@pytest.mark.parametrize("cluster", [1, 2, 4])
def test_cluster_gemm(cluster):
    torch.manual_seed(cluster)
    M, N, K = 3 * cluster * 16 - 5, 80, 80
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.zeros(M, N)
    gemm_cluster[(2 * cluster,)](a, b, c, M, N, K, BM=16, BN=32, BK=16, STAGES=2, CLUSTER=cluster,
                                 backend="cpu")
    torch.testing.assert_close(c, a.float() @ b.float(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("cluster", [1, 2, 4])
def test_cluster_gemm_2wg(cluster):
    """Two matrix replicas a program, each its band of the cluster's rows, B multicast (a 1 -> 2
    broadcast pipe): against torch, rows off the tile grid and a ragged last column block."""
    torch.manual_seed(10 + cluster)
    M, N, K = 3 * 2 * cluster * 16 - 5, 80, 80
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.zeros(M, N)
    gemm_cluster_2wg[(2 * cluster,)](a, b, c, M, N, K, BM=16, BN=32, BK=16, STAGES=2, CLUSTER=cluster,
                                     backend="cpu")
    torch.testing.assert_close(c, a.float() @ b.float(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("cluster", [1, 2, 4])
def test_cluster_gemm_2wg_proven(cluster):
    """The verifier proves gemm_cluster_2wg's n-program protocol (a multicast slot is free once
    both replicas of every program released it) on the CPU and Hopper placements."""
    cx = dict(BM=16, BN=16, BK=16, STAGES=2, CLUSTER=cluster)
    for backend in ("cpu", "nvidia"):
        assert gemm_cluster_2wg.lower(backend, cx).report.proven, backend


def _bug_line(kernel) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, t in enumerate(lines) if "# BUG" in t)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kernel,words", C.REFUSED, ids=[k.fn.__name__ for k, _ in C.REFUSED])
def test_refused_at_the_line(kernel, words, backend):
    with pytest.raises(KernelSourceError) as e:
        kernel.lower(backend)
    assert words in str(e.value), str(e.value)
    assert e.value.loc.line == _bug_line(kernel), str(e.value)
    assert e.value.fix


@pytest.mark.parametrize("backend", BACKENDS)
def test_allocation_says_what_multicast_becomes(backend):
    table = gemm_cluster.lower(backend).allocation.table()
    assert "2 consecutive programs of axis 0" in table
    assert "multicast b" in table and "each program loads its own copy" in table


@pytest.mark.parametrize("cluster", [1, 2, 4])
def test_program_id_of_axis_1_may_place_a_multicast_load(cluster):
    """A cluster is programs of axis 0, so program_id(1) is the same for all of them."""
    x = torch.randn(3 * 16, 32)
    y = torch.zeros(3 * cluster * 16, 32)
    C.multicast_by_grid_row[(cluster, 2)](x, y, 3, BLOCK=16, STAGES=2, CLUSTER=cluster, backend="cpu")
    rank = torch.arange(cluster).repeat(3).repeat_interleave(16)[:, None]
    expected = x.reshape(3, 1, 16, 32).expand(3, cluster, 16, 32).reshape(-1, 32) + rank
    torch.testing.assert_close(y, expected)
    for backend in BACKENDS:
        assert C.multicast_by_grid_row.lower(backend, dict(BLOCK=16, STAGES=2, CLUSTER=cluster)).report.proven


def test_a_multicast_field_without_a_cluster_is_a_cluster_of_one():
    """Was: refused at the load as depending on xs.program_id(), the tile of xs.tile_range."""
    x = torch.randn(64, 16)
    y = torch.zeros_like(x)
    C.multicast_without_cluster[(2,)](x, y, 4, BLOCK=16, STAGES=2, backend="cpu")
    torch.testing.assert_close(y, x)
    for backend in BACKENDS:
        assert C.multicast_without_cluster.lower(backend).report.proven


def test_a_deadlock_of_one_programs_placement_does_not_blame_the_cluster():
    """Was: "program 1 of the cluster never releases slot 0 ... ('mma' releases 2 of its 2
    waits)" and a fix about xs.cluster_rank() branches, for a kernel that deadlocks on Ascend
    with clusters of one program too (copy and matrix share the cube)."""
    k = C.gemm_holds_two_multicast_slots
    for cluster in (1, 2):
        assert k.lower("cpu", dict(BM=64, BN=64, BK=32, CLUSTER=cluster)).report.proven
        with pytest.raises(xs.DeadlockError) as info:
            k.lower("ascend", dict(BM=64, BN=64, BK=32, CLUSTER=cluster))
        msg = str(info.value)
        assert "share agent 'cube'" in msg and "cluster:" not in msg and "xs.cluster_rank()" not in msg, msg


def test_a_leftover_that_differs_by_program_names_the_cluster_rule():
    with pytest.raises(xs.LeftoverError) as info:
        C.consumer_trips_by_rank.lower("cpu")
    assert "(program 1 of the cluster)" in str(info.value)
    assert info.value.fix.startswith("every program of the cluster must wait and release")
    assert C.consumer_trips_by_rank.lower("cpu", dict(BLOCK=16, STAGES=2, CLUSTER=1)).report.proven


def test_no_cluster_rows_for_a_cluster_of_one():
    low = C.rank_rows.lower("cpu", dict(BLOCK=16, STAGES=2, CLUSTER=1), dict(x=xs.float32, y=xs.float32))
    assert "consecutive programs" not in low.allocation.table()


def test_cluster_ops_without_a_cluster_are_one_program_clusters():
    x = torch.randn(48, 16)
    y = torch.zeros_like(x)
    C.rank_rows[(2,)](x, y, 3, BLOCK=16, STAGES=2, CLUSTER=1, backend="cpu")
    torch.testing.assert_close(y, C.rank_rows_ref(x, 3, 16, 1))
