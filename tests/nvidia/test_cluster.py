"""Clusters on Hopper (tests/core/cluster_kernels.py, xsync.kernels.gemm.gemm_cluster), compiled
offline for sm_90a: the programs of a cluster compile as independent programs, each loading its
own copy of a multicast field by TMA (the allocation table says so and why); cluster_rank and
cluster_id are spelled from the program id."""
import re

from tests.core import cluster_kernels as C
from xsync.backends.nvidia import compile_ptx
from xsync.kernels.gemm import gemm_cluster


def test_cluster_gemm_compiles():
    r = compile_ptx(gemm_cluster, dict(BM=128, BN=128, BK=64, STAGES=4, CLUSTER=2))
    assert len(r.cubin) > 10_000
    assert "% 2" in r.source and "// 2" in r.source      # rank and cluster from the program id
    assert re.search(r"cp\.async\.bulk\.tensor\.2d", r.ptx) and re.search(r"wgmma\.mma_async", r.ptx)
    table = gemm_cluster.lower("nvidia").allocation.table()
    assert "each program loads its own copy" in table and "Triton 3.6 has no TMA multicast" in table


def test_rank_rows_compiles():
    r = compile_ptx(C.rank_rows, dict(BLOCK=64, STAGES=2, CLUSTER=4))
    assert len(r.cubin) > 5_000
    assert "% 4" in r.source
