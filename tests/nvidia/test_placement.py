"""A vector role on a warpgroup of its own (issue 38): the persistent GEMM whose bias + GELU
epilogue is a vector role fed by a 2-slot pipe compiles to sm_90a with three partitions -- the
matrix warpgroup (default partition), the epilogue warpgroup (232 registers) and the TMA
producer warp -- and a shared-memory ring of two fp32 accumulator tiles; with a 1-slot pipe
the epilogue stays in the matrix warpgroup (two CTAs per SM, as before)."""
import re

import pytest

import xsync as xs
from tests.core.placement_kernels import EXAMPLE, gemm_epilogue_role
from tests.nvidia.conftest import gpu_reason
from xsync.backends.nvidia import compile_ptx

SPEC = {k: v for k, v in EXAMPLE.items() if isinstance(v, int)}
DTYPES = {k: v for k, v in EXAMPLE.items() if not isinstance(v, int)}


def regs(ptx, op):
    return {int(x) for x in re.findall(rf"setmaxnreg\.{op}\.sync\.aligned\.u32\s+(\d+);", ptx)}


def test_own_epilogue_warpgroup_compiles():
    lo = gemm_epilogue_role.lower("nvidia", SPEC, DTYPES)
    r = compile_ptx(lo)
    assert [(p.agent, p.warps, p.regs) for p in lo.allocation.partitions] == [
        ("consumer", 4, 232), ("epi", 4, 232), ("producer", 1, 40)]
    # default partition + the epilogue warpgroup + the producer warp padded to a warpgroup
    assert r.metadata.num_warps == 12
    assert 232 in regs(r.ptx, "inc") and 40 in regs(r.ptx, "dec")
    assert ".maxnreg 128" not in r.ptx                      # one CTA per SM: the ring takes 224 KB
    assert len(re.findall(r"mbarrier\.init", r.ptx)) == 2 * 3 + 2 * 2   # tiles + accs rings
    assert r.metadata.shared >= 3 * 32768 + 2 * 65536
    assert re.search(r"\.target sm_90a", r.ptx)
    # the matrix warpgroup hands the accumulator over and goes on; the epilogue does the rest
    consumer = r.source.split("def gemm_epilogue_role_consumer")[1].split("@gluon.jit")[0]
    epi = r.source.split("def gemm_epilogue_role_epi")[1].split("@gluon.jit")[0]
    assert "accs_c.index(out).store(acc)" in consumer and "gl.erf" not in consumer
    assert "gl.erf" in epi and "warpgroup_mma" not in epi
    assert "# epi: worker 1, 4 warp(s), 232 registers" in r.source


def test_epilogue_warpgroup_stores_through_tma_where_room_is_left():
    """128 x 64 tiles leave room for a staging tile: the epilogue warpgroup stores with TMA."""
    r = compile_ptx(gemm_epilogue_role, {**SPEC, "BN": 64, "STAGES": 4}, DTYPES)
    epi = r.source.split("def gemm_epilogue_role_epi")[1].split("@gluon.jit")[0]
    assert "xs_tma_store(c_store_desc" in epi and "tma.store_wait(0)" in epi
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared", r.ptx)
    assert r.metadata.num_warps == 12


def test_single_slot_epilogue_stays_merged():
    r = compile_ptx(gemm_epilogue_role, {**SPEC, "EPI_STAGES": 1}, DTYPES)
    assert r.metadata.num_warps == 8                        # consumer + producer (padded)
    assert ".maxnreg 128" in r.ptx and regs(r.ptx, "dec") == {24}   # two CTAs per SM
    assert "def gemm_epilogue_role_epi" not in r.source and "allocate_shared_memory(gl.float32" not in r.source
    assert "same partition: registers" in r.source
    assert len(re.findall(r"mbarrier\.init", r.ptx)) == 2 * 3


def test_explicit_own_with_one_slot_compiles():
    r = compile_ptx(gemm_epilogue_role, {**SPEC, "EPI_STAGES": 1, "PLACEMENT": "own"}, DTYPES)
    assert r.metadata.num_warps == 12 and 232 in regs(r.ptx, "inc")
    assert len(re.findall(r"mbarrier\.init", r.ptx)) == 2 * 3 + 2


@pytest.mark.skipif(bool(gpu_reason()), reason=f"needs a Hopper GPU: {gpu_reason()}")
@pytest.mark.parametrize("epi_stages", [1, 2])
def test_numerics_on_the_gpu(epi_stages):
    import torch

    torch.manual_seed(0)
    m, n, k = 1000, 600, 320
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(1, n, device="cuda")
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    gemm_epilogue_role[(8,)](a, b, bias, c, m, n, k, **{**SPEC, "EPI_STAGES": epi_stages}, backend="nvidia")
    ref = torch.nn.functional.gelu(a.float() @ b.float() + bias)
    torch.testing.assert_close(c.float(), ref, atol=5e-2, rtol=2e-2)
