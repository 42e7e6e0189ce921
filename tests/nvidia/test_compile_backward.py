"""The attention backward kernels (kernels/flash_attn/backward.py) at every specialization
grad.py launches on Hopper go through Gluon and ptxas to an sm_90a cubin (no GPU needed).
tests/nvidia/test_gpu_backward.py runs them on the H200."""
import re

import pytest

from xsync.backends.nvidia import compile_ptx
from xsync.kernels.flash_attn import grad, ops
from xsync.kernels.flash_attn.backward import attention_bwd_dkdv, attention_bwd_dq, attention_bwd_preprocess
from tests.nvidia.test_compile import _stack_bytes


def launched():
    # d256's delta kernel keeps 88 B of stack a thread (not its rows' registers: 16 rows keep 96)
    out = [pytest.param(attention_bwd_preprocess, dict(BM=grad.preprocess_bm(d), **ops.dim_constexprs(d)),
                        id=f"preprocess-d{d}",
                        marks=[pytest.mark.xfail(reason="d256 delta kernel: 88 B of stack", strict=False)]
                        if d == 256 else []) for d in ops.HEAD_DIMS]
    for kernel, name in ((attention_bwd_dkdv, "dkdv"), (attention_bwd_dq, "dq")):
        for d in ops.HEAD_DIMS:
            for causal in (0, 1):
                cx = dict(grad.block_sizes("nvidia", d, bool(causal)), **ops.dim_constexprs(d), CAUSAL=causal)
                # d256 dK/dV: two 64 x 256 fp32 accumulators a warpgroup cannot stay in registers
                # (about 1.2 KB of stack a thread); splitting them over warpgroups, as FA3 does,
                # needs a GPU to tune (issue 37)
                marks = [pytest.mark.xfail(reason="d256 dK/dV spills: accumulators need a split over "
                                                  "warpgroups", strict=False)] if (d, name) == (256, "dkdv") else []
                out.append(pytest.param(kernel, cx, id=f"{name}-d{d}-{'causal' if causal else 'full'}", marks=marks))
    return out


@pytest.mark.parametrize("kernel,constexprs", launched())
def test_backward_kernels_compile_for_hopper(kernel, constexprs):
    cx, dtypes = kernel.specialization()
    cx.update(constexprs)
    r = compile_ptx(kernel.lower("nvidia", cx, dtypes), scalar_types={"sm_scale": "fp32"})
    assert re.search(r"\.target sm_90a", r.ptx) and len(r.cubin) > 10_000
    # no local memory: a spill in the hot loop costs more than any schedule gains (the d128
    # dK/dV kernel once held K and V in registers beside its accumulators: 744 B a thread)
    assert not _stack_bytes(r.cubin), f"{_stack_bytes(r.cubin)} B of stack a thread (ptxas spilled)"
    if kernel is not attention_bwd_preprocess:
        # Sᵀ/S and dPᵀ/dP, then the accumulating dV, dK or dQ products: all wgmma
        assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16", r.ptx)
        assert re.search(r"mbarrier\.try_wait\.parity", r.ptx)


def fused():
    out = []
    for d in ops.HEAD_DIMS:
        for causal in (0, 1):
            if d == 256:
                continue    # refused at lowering (shared memory): tests/core/test_backward_fused_dq.py
            cx = dict(grad.fused_block_sizes("nvidia", d, bool(causal)), **ops.dim_constexprs(d), CAUSAL=causal)
            out.append(pytest.param(cx, id=f"dkdv-fused-dq-d{d}-{'causal' if causal else 'full'}"))
    return out


@pytest.mark.parametrize("constexprs", fused())
def test_fused_dq_backward_compiles_for_hopper(constexprs):
    """The dK/dV kernel with FUSED_DQ=1 (dQ's share reduce-added from the consumer warpgroup):
    not grad.py's default on Hopper (untimed), so it may spill; its stack is reported, not held
    at zero (d64 88-96 B, d128 1.2-1.4 KB a thread under Triton 3.6: dQ's [64, D] fp32 share
    beside dK and dV)."""
    cx, dtypes = attention_bwd_dkdv.specialization()
    cx.update(constexprs)
    r = compile_ptx(attention_bwd_dkdv.lower("nvidia", cx, dtypes), scalar_types={"sm_scale": "fp32"})
    assert re.search(r"\.target sm_90a", r.ptx) and len(r.cubin) > 10_000
    # Sᵀ, dPᵀ, dV, dK and the dQ share: all wgmma; the share added with red/atom.global.add
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16", r.ptx)
    assert re.search(r"(red|atom)\.global(\.\w+)*\.add\.f32", r.ptx)
    print(f"stack {_stack_bytes(r.cubin)} B a thread")
