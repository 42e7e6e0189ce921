"""Clusters on Hopper (tests/core/cluster_kernels.py, xsync.kernels.gemm.gemm_cluster), compiled
offline for sm_90a. Where the installed Gluon has TMA multicast (Triton >= 3.8) and the kernel's
shape allows it (xsync/backends/nvidia/cluster_ctas.py), a cluster is one Gluon program over its
CTAs; otherwise its programs compile as independent programs, each loading its own copy of a
multicast field (the allocation table says which and why). Without a GPU the PTX is checked; with
one, the cluster GEMM runs against float64."""
import re

import pytest

from tests.core import cluster_kernels as C
from tests.nvidia.conftest import gpu_reason
from xsync.backends.nvidia import compile_ptx
from xsync.kernels.flash_attn.cluster import attention_cluster, attention_fwd_cluster
from xsync.kernels.gemm import gemm_cluster, gemm_cluster_2wg


def _code(ptx: str) -> str:
    return "\n".join(l for l in ptx.splitlines() if not l.lstrip().startswith((".loc", ".file")))


def test_cluster_gemm_compiles():
    """Triton >= 3.8: one Gluon program over the cluster's 2 CTAs (A split by rows, B multicast by
    the lead CTA, per-CTA expect-tx, the multicast slot's empty barrier on the lead); 3.6: the
    programs compile independently, each loading its own B."""
    cx = dict(BM=128, BN=128, BK=64, STAGES=4, CLUSTER=2)
    r = compile_ptx(gemm_cluster, cx)
    assert len(r.cubin) > 10_000
    code = _code(r.ptx)
    assert re.search(r"wgmma\.mma_async", code)
    table = gemm_cluster.lower("nvidia").allocation.table()
    if not _multicast_gluon():
        assert "% 2" in r.source and "// 2" in r.source      # rank and cluster from the program id
        assert re.search(r"cp\.async\.bulk\.tensor\.2d", code) and "multicast::cluster" not in code
        assert "each program loads its own copy" in table and "rule 1: this Triton's Gluon has no TMA multicast" in table
        assert r.render.num_ctas == 1
        return
    assert r.render.num_ctas == 2 and "% 2" not in r.source and "// 2" not in r.source
    assert ".reqnctapercluster 2" in code
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx::bytes"
                     r"\.multicast::cluster", code)
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global", code)        # A: its own rows
    per_cta = cx["BM"] * cx["BK"] * 2 + cx["BK"] * cx["BN"] * 2
    assert re.findall(r"mbarrier\.arrive\.expect_tx\.shared::cta\.b64 _, \[%r\d+\], (\d+);", code) == [str(per_cta)]
    assert re.search(r"mbarrier\.arrive\.shared::cluster\.b64", code)                     # release -> lead
    assert re.search(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], 2;", code)            # lead: 1 per CTA
    assert "fence.mbarrier_init.release.cluster" in code and "skipWait" in code
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in code                          # TMA store, per CTA
    assert "TMA multicast to the 2 CTAs (lead CTA issues)" in table and "multicast empty barriers" in table
    assert r.metadata.num_ctas == 2


@pytest.mark.parametrize("n", [2, 4])
def test_cluster_gemm_2wg_compiles(n):
    """Two consumer warpgroups a CTA (each its band of rows, A through its own ring) and B one
    broadcast ring: Triton >= 3.8 spells one Gluon program over the n CTAs -- each replica's A tile
    split by rows, B multicast by the lead CTA to 2 warpgroups x n CTAs, each CTA arming its own
    full barriers with its bytes (its A rows of both replicas + the whole B), every replica's
    release routed to the lead's group barrier (2 per CTA); 3.6: independent programs."""
    BM, BN, BK = 128, 128, 64
    cx = dict(BM=BM, BN=BN, BK=BK, STAGES=4, CLUSTER=n)
    r = compile_ptx(gemm_cluster_2wg, cx)
    assert len(r.cubin) > 10_000
    code = _code(r.ptx)
    assert len(re.findall(r"wgmma\.mma_async", code)) >= 8
    table = gemm_cluster_2wg.lower("nvidia", cx).allocation.table()
    if not _multicast_gluon():
        assert f"program_id(0) % {n}" in r.source and f"program_id(0) // {n}" in r.source   # rank, cluster
        assert r.render.num_ctas == 1
        assert re.search(r"cp\.async\.bulk\.tensor\.2d", code) and "multicast::cluster" not in code
        assert "each program loads its own copy" in table and "rule 1: this Triton's Gluon has no TMA multicast" in table
        return
    assert r.render.num_ctas == n and not re.search(rf"program_id\(0\)\)? (%|//) {n}", r.source)
    assert r.metadata.num_ctas == n and f".reqnctapercluster {n}" in code
    mc = re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx::bytes"
                    r"\.multicast::cluster .*, (%rs\d+);", code)
    assert mc and re.search(rf"mov\.b16\s+{re.escape(mc[0])}, {(1 << n) - 1};", code)     # CTA mask: all n
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global", code)         # A: its own rows
    expect = sorted(int(x) for x in re.findall(r"mbarrier\.arrive\.expect_tx\.shared::cta\.b64 _, \[%r\d+\], (\d+);", code))
    # one expect per A replica's ring (its BM rows) and one for B's (the whole tile): per CTA and K step
    assert expect == [BM * BK * 2] * 2 + [BK * BN * 2] and sum(expect) == 2 * BM * BK * 2 + BK * BN * 2
    assert len(re.findall(r"mbarrier\.arrive\.shared::cluster\.b64", code)) >= 2                # both replicas
    assert re.search(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], " + str(2 * n) + ";", code)  # lead: 2 per CTA
    assert "fence.mbarrier_init.release.cluster" in code and "skipWait" in code
    assert f"TMA multicast to the {n} CTAs (lead CTA issues)" in table
    assert f"count {2 * n} (2 per CTA, 1 per consumer replica)" in table
    # fp32 C leaves through masked register stores (no room for staging): the accumulator's rows
    # are its CTA's share of the n x BM rows, the row index offset by the CTA's rank x BM
    rank = re.search(r"mov\.u32\s+(%r\d+), %cluster_ctarank;", code)
    assert rank and re.search(rf"shl\.b32\s+%r\d+, {rank.group(1)}, 7;", code) and "st.global.b32" in code


def test_cluster_gemm_2wg_bf16_tma_store_compiles():
    """STAGES=3 with bf16 C fits a [256, 128] staging tile per consumer replica beside the ring:
    C leaves through TMA stores, each CTA its own rows of both replicas' tiles."""
    import xsync as xs
    if not _multicast_gluon():
        pytest.skip("this Gluon has no TMA multicast (Triton >= 3.8)")
    r = compile_ptx(gemm_cluster_2wg, dict(BM=128, BN=128, BK=64, STAGES=3, CLUSTER=2),
                    dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.bfloat16))
    code = _code(r.ptx)
    assert r.render.num_ctas == 2 and "multicast::cluster" in code
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in code
    assert "TMA-store staging: one [256, 128] bfloat16 tile per 'consumer' replica" in r.source


def test_rank_rows_compiles():
    """cluster_rank as a value (rank_rows adds it to the tile): no CTA split (cluster_ctas rule 3)
    under any Triton; each program loads its own copy."""
    r = compile_ptx(C.rank_rows, dict(BLOCK=64, STAGES=2, CLUSTER=4))
    assert len(r.cubin) > 5_000
    assert "% 4" in r.source and r.render.num_ctas == 1
    table = C.rank_rows.lower("nvidia", dict(BLOCK=64, STAGES=2, CLUSTER=4)).allocation.table()
    assert "each program loads its own copy" in table
    assert ("rule 3: line" in table) == _multicast_gluon()


@pytest.mark.parametrize("d", [64, 128])
def test_attention_cluster_compiles(d):
    """The attention forward with K/V multicast (xsync.kernels.flash_attn.cluster). Triton >= 3.8:
    one program over the 2 CTAs -- each replica's Q rows split over them, K and V (one ring: the
    merge-pipes pass) multicast by the lead CTA, each CTA arming its K/V full barrier with the whole
    K and V tiles and its Q barriers with its own rows, every release routed to the lead; the
    softmax's row reductions, P from registers as the PV wgmma's A and K^T as the S wgmma's B all on
    CGA layouts, with the flagship's overlapped schedule. 3.6: the programs compile independently,
    each loading its own K and V."""
    cx = dict(BM=64, BN=128, D=d, STAGES=3, REPLICAS=2, CLUSTER=2)
    r = compile_ptx(attention_fwd_cluster, cx)
    code = _code(r.ptx)
    assert re.search(r"wgmma\.mma_async", code) and len(r.cubin) > 10_000
    table = attention_fwd_cluster.lower("nvidia", cx).allocation.table()
    if not _multicast_gluon():
        assert r.render.num_ctas == 1 and "multicast::cluster" not in code
        assert "each program loads its own copy" in table
        return
    assert r.render.num_ctas == 2 and ".reqnctapercluster 2" in code
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx::bytes"
                     r"\.multicast::cluster", code)
    armed = set(re.findall(r"mbarrier\.arrive\.expect_tx\.shared::cta\.b64 _, \[%r\d+\], (\d+);", code))
    assert armed == {str(2 * 128 * d * 2), str(64 * d * 2)}          # K + V whole; Q: its 64 rows
    assert re.search(r"mbarrier\.arrive\.shared::cluster\.b64", code)
    assert "TMA multicast to the 2 CTAs (lead CTA issues)" in table


def _multicast_gluon() -> bool:
    from xsync.backends.nvidia import gluon_compat
    return gluon_compat.cluster_multicast()


def test_cluster_multicast_feature_follows_triton():
    """Triton 3.6/3.7 Gluon has no TMA multicast (the cluster kernels fall back to one program per
    CTA, each loading its own copy); 3.8+ has it."""
    import triton
    major, minor = (int(x) for x in triton.__version__.split(".")[:2])
    assert _multicast_gluon() == ((major, minor) >= (3, 8))


@pytest.mark.parametrize("n", [2, 4])
def test_multicast_reference_protocol_ptx(n):
    """The protocol a multicast lowering spells (tests/nvidia/multicast_reference.py), compiled for
    sm_90a: the lead CTA multicasts B to the cluster's CTAs, each CTA arms its own full barrier with
    the bytes it receives (its A share + the whole B), the multicast slot's empty barrier lives on
    the lead (count n) and every CTA's release reaches it as a cluster-scope remote arrive."""
    if not _multicast_gluon():
        pytest.skip("this Gluon has no TMA multicast (Triton >= 3.8)")
    from tests.nvidia import multicast_reference

    BM, BN, BK = 128, 128, 64
    ptx = multicast_reference.compile_offline(n, BM, BN, BK).asm["ptx"]
    code = "\n".join(l for l in ptx.splitlines() if not l.lstrip().startswith((".loc", ".file")))
    assert f".reqnctapercluster {n}" in code
    mc = re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx::bytes"
                    r"\.multicast::cluster .*, (%rs\d+);", code)
    assert mc, "no multicast TMA"
    assert re.search(rf"mov\.b16\s+{re.escape(mc[0])}, {(1 << n) - 1};", code)      # CTA mask: all n
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global", code)    # A: each CTA its share
    expect = re.findall(r"mbarrier\.arrive\.expect_tx\.shared::cta\.b64 _, \[%r\d+\], (\d+);", code)
    assert expect == [str(BM * BK * 2 + BK * BN * 2)]                               # per CTA
    assert re.search(r"mbarrier\.arrive\.shared::cluster\.b64", code)               # release -> lead
    assert re.search(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], " + str(n) + ";", code)
    assert "fence.mbarrier_init.release.cluster" in code
    assert "skipWait" in code                                                       # lead-only wait
    assert len(re.findall(r"wgmma\.mma_async", code)) >= 4


def test_cluster_split_refuses_hang_debug_mode():
    """The hang debug mode polls xs_bars by a shared-memory offset; a kernel spread over a cluster's
    CTAs keeps per-CTA and lead-CTA barriers, which it does not poll: a clear error, not a wrong poll."""
    if not _multicast_gluon():
        pytest.skip("this Gluon has no TMA multicast (Triton >= 3.8)")
    from xsync.errors import BackendError

    with pytest.raises(BackendError, match="hang debug mode does not poll"):
        compile_ptx(gemm_cluster, dict(BM=128, BN=128, BK=64, STAGES=4, CLUSTER=2), debug_hang=True)


@pytest.mark.skipif(bool(gpu_reason()), reason=f"needs a Hopper GPU: {gpu_reason()}")
@pytest.mark.parametrize("cluster", [2, 4])
@pytest.mark.parametrize("M,N,K", [(1000, 776, 520), (384, 256, 64), (136, 8, 8)])
def test_cluster_gemm_numerics_on_gpu(cluster, M, N, K):
    """gemm_cluster on the GPU against float64, fp32 and bf16 C, shapes off the tile grid: the
    multicast protocol where this Triton has it (one program over the cluster's CTAs), the
    independent programs otherwise. A hang here is a protocol bug (run under a timeout)."""
    import torch
    import triton

    torch.manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    want = a.double() @ b.double()
    clusters = triton.cdiv(M, cluster * 128) * triton.cdiv(N, 128)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for dtype, tol in ((torch.float32, 2e-3), (torch.bfloat16, 1e-2)):
        c = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
        gemm_cluster[(min(sms // cluster, clusters) * cluster,)](a, b, c, M, N, K, BM=128, BN=128, BK=64, STAGES=4,
                                                                  CLUSTER=cluster, backend="nvidia")
        torch.cuda.synchronize()
        assert not c.isnan().any()
        assert ((c.double() - want).abs().max() / want.abs().max()).item() < tol


@pytest.mark.skipif(bool(gpu_reason()), reason=f"needs a Hopper GPU: {gpu_reason()}")
@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("cluster", [2, 4])
@pytest.mark.parametrize("M,N,K", [(1000, 776, 520), (640, 256, 64), (136, 8, 8), (4096, 4096, 4096)])
def test_cluster_gemm_2wg_numerics_on_gpu(stages, cluster, M, N, K):
    """gemm_cluster_2wg on the GPU against float64, fp32 and bf16 C: two consumer warpgroups a
    CTA sharing each multicast B tile (one Gluon program over the cluster's CTAs where this Triton
    has multicast, independent programs otherwise). STAGES=3 with bf16 C leaves through per-CTA
    TMA stores, the others through masked register stores. A hang here is a protocol bug."""
    import torch
    import triton

    torch.manual_seed(M + N + K + 1)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    want = a.double() @ b.double()
    clusters = triton.cdiv(M, 2 * cluster * 128) * triton.cdiv(N, 128)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for dtype, tol in ((torch.float32, 2e-3), (torch.bfloat16, 1e-2)):
        c = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
        gemm_cluster_2wg[(min(sms // cluster, clusters) * cluster,)](a, b, c, M, N, K, BM=128, BN=128, BK=64,
                                                                      STAGES=stages, CLUSTER=cluster, backend="nvidia")
        torch.cuda.synchronize()
        assert not c.isnan().any()
        assert ((c.double() - want).abs().max() / want.abs().max()).item() < tol


@pytest.mark.skipif(bool(gpu_reason()), reason=f"needs a Hopper GPU: {gpu_reason()}")
@pytest.mark.parametrize("cluster", [1, 2])
@pytest.mark.parametrize("b,h,s,d", [(1, 2, 512, 64), (2, 3, 1024, 128), (1, 1, 256, 128)])
def test_attention_cluster_numerics_on_gpu(cluster, b, h, s, d):
    """attention_fwd_cluster on the GPU against SDPA in float64 (out and LSE): K/V multicast over
    2 CTAs where this Triton has it, the same kernel without a cluster beside it."""
    import torch

    torch.manual_seed(b + h + s + d)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, lse = attention_cluster(q, k, v, cluster=cluster, backend="nvidia")
    torch.cuda.synchronize()
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    lse_want = torch.logsumexp(q.double() @ k.double().transpose(-1, -2) / d ** 0.5, -1)
    assert (o.double() - want).abs().max().item() < 2e-2
    assert (lse.double() - lse_want).abs().max().item() < 1e-2
