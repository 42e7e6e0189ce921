"""Reduce-add (``xs.store(..., reduce="add")``) on Ascend: ``tl.atomic_add`` (triton-ascend
3.2.0 takes fp32, fp16 and int32; bf16 is refused at check). The real HIVM compiler turns it
into an atomic GM store (``hivm.hir.store ... atomic = <add>``) on a vector core and reaches
hivmc; the simulator adds exactly (a vector-only kernel is one vector core a program; in a mix
kernel, scope form, vector core 0 adds). The release form of a mix kernel is refused: both
vector cores would add."""
import re

import pytest
import torch

import xsync as xs
from tests.core.reduce_kernels import column_sum, gemm_split_k_reducer
from xsync.backends.ascend import hivm
from xsync.errors import UnsupportedError


@pytest.fixture(scope="module")
def compiler(triton_ascend):
    if hivm.compiler_path() is None:
        pytest.fail("bishengir-compile is missing: the ascend environment installs ascendnpu-ir")


@pytest.mark.parametrize("dtype", [xs.float32, xs.float16, xs.int32], ids=lambda d: d.name)
def test_vector_reduce_add_reaches_hivmc_as_an_atomic_store(compiler, dtype):
    lowered = column_sum.lower("ascend", None, dict(x=xs.float32, out=dtype))
    r = hivm.compile_lowered(lowered, timeout=180)
    assert r.reached_hivmc, r.log[-2000:]
    atomics = [ln for t in r.functions.values() for ln in t.splitlines()
               if re.search(r"hivm\.hir\.store .*address_space<gm>>\) atomic = <add>", ln)]
    assert len(atomics) == 1, atomics
    assert 'mix_mode = "aiv"' in r.after_split


def test_release_form_mix_kernel_is_refused():
    with pytest.raises(UnsupportedError) as info:
        gemm_split_k_reducer.compile("ascend-sim")
    msg = str(info.value)
    assert "reduce_kernels.py:" in msg and "both vector cores" in msg and "each add" in msg and "scope" in info.value.fix


def test_column_sum_on_the_simulator():
    torch.manual_seed(1)
    M, N = 77, 50
    x = torch.randn(M, N)
    out = torch.full((2, 64), 7.0)
    column_sum[(3, 2)](x, out, M, N, 32, BM=16, BN=32, STAGES=2, backend="ascend-sim")
    torch.testing.assert_close(out[0, :N], 7.0 + x.double().sum(0).float(), atol=1e-4, rtol=1e-5)
    assert torch.equal(out[0, N:], torch.full((64 - N,), 7.0)) and torch.equal(out[1], torch.full((64,), 7.0))


def test_split_k_reducer_on_the_simulator_scope_form():
    torch.manual_seed(0)
    M, N, K, BM, BN, BK = 100, 70, 200, 32, 32, 16
    a, b, c = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16(), torch.zeros(M, N)
    grid = (-(-M // BM) * -(-N // BN), 3)
    with xs.options(ascend_form="scope"):
        src = gemm_split_k_reducer.compile("ascend-sim").source
        gemm_split_k_reducer[grid](a, b, c, M, N, K, 80, BM=BM, BN=BN, BK=BK, STAGES=2, DET=0,
                                   backend="ascend-sim")
    assert "if al.sub_vec_id() == 0:" in src and "tl.atomic_add(" in src
    torch.testing.assert_close(c, a.double().mm(b.double()).float(), atol=2e-4, rtol=2e-4)
