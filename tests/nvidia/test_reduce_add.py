"""Reduce-add (``xs.store(..., reduce="add")``) on Hopper, compiled offline for sm_90a with the
installed Triton (3.6 and 3.9 in the matrix): a staged whole tile leaves as a TMA bulk
reduce-add (``cp.reduce.async.bulk.tensor ... .add``, waited like a TMA store), the masked
fallback and one-row stores as relaxed atomic adds (3.9 PTX: ``red.global.add``; 3.6 spells
``atom.global.add`` with the result unused). On a Hopper GPU: split-K numerics vs torch."""
import re

import pytest

import xsync as xs
from tests.core.reduce_kernels import column_sum, gemm_split_k
from tests.nvidia.conftest import gpu_reason
from xsync.backends.nvidia import compile_ptx

SPLIT = dict(BM=128, BN=128, BK=64, STAGES=4, DET=0)   # a 128 KB ring: C's staging tile fits beside it


def _ops(ptx, pattern):
    return [l.strip() for l in ptx.splitlines() if re.search(pattern, l)]


@pytest.mark.parametrize("c_dtype,suffix", [(xs.float32, r"\.f32"), (xs.bfloat16, r"\.noftz\.bf16"),
                                            (xs.float16, r"\.noftz\.f16")])
def test_split_k_tile_leaves_as_tma_bulk_reduce(c_dtype, suffix):
    r = compile_ptx(gemm_split_k, SPLIT, dict(a=xs.bfloat16, b=xs.bfloat16, c=c_dtype))
    assert len(r.cubin) > 10_000
    assert "xs_tma_reduce_add(c_store_desc" in r.source and "gl.atomic_add(" in r.source
    bulk = _ops(r.ptx, r"cp\.reduce\.async\.bulk\.tensor\.2d\.global\.shared::cta\.add")
    assert len(bulk) == 1, bulk
    # the staging tile is reused only once the previous bulk reduce has read it, and the
    # partition waits for its bulk operations before it ends
    assert len(_ops(r.ptx, r"cp\.async\.bulk\.wait_group\.read\s+0")) >= 2
    # tiles a bound cuts: per-element relaxed atomic adds, no store
    assert _ops(r.ptx, rf"(red|atom)\.global\.gpu\.relaxed\.add{suffix}")
    assert not _ops(r.ptx, r"st\.global")


def test_unstaged_reduce_add_is_a_masked_atomic_add():
    # three stages (96 KB) leave room for two CTAs an SM, so C is not staged (staging rule 7)
    r = compile_ptx(gemm_split_k, {**SPLIT, "STAGES": 3})
    assert "xs_tma_reduce_add" not in r.source and not _ops(r.ptx, r"cp\.reduce\.async\.bulk")
    assert _ops(r.ptx, r"(red|atom)\.global\.gpu\.relaxed\.add\.f32")
    assert not _ops(r.ptx, r"st\.global")


def test_one_row_reduce_add_keeps_its_layout():
    r = compile_ptx(column_sum)
    assert "gl.atomic_add(out + " in r.source and "< N)" in r.source     # bounds=[1, N] masks it
    assert _ops(r.ptx, r"(red|atom)\.global\.gpu\.relaxed\.add\.f32")
    assert not _ops(r.ptx, r"st\.global")


GPU = gpu_reason()


@pytest.mark.skipif(bool(GPU), reason=f"needs a Hopper GPU: {GPU}")
@pytest.mark.parametrize("stages", [3, 4])          # masked atomic adds / TMA bulk reduce-add
def test_split_k_numerics_on_gpu(stages):
    import torch

    torch.manual_seed(0)
    M, N, K, splits = 1000, 712, 2056, 4          # tiles cut at M and N; row strides 16-byte aligned
    a = torch.randn(M, K, device="cuda").bfloat16()
    b = torch.randn(K, N, device="cuda").bfloat16()
    big = torch.full((M + 8, N + 16), 5.0, device="cuda")   # padding must stay untouched
    c = big[:M, :N]
    c.zero_()
    per = -(-(-(-K // splits)) // 64) * 64
    grid = (-(-M // 128) * -(-N // 128), splits)
    gemm_split_k[grid](a, b, c, M, N, K, per, **{**SPLIT, "STAGES": stages}, backend="nvidia")
    torch.cuda.synchronize()
    torch.testing.assert_close(c, a.double().mm(b.double()).float(), atol=2e-2, rtol=2e-3)
    assert (big[M:, :] == 5.0).all() and (big[:, N:] == 5.0).all()
