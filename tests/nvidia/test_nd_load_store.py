"""xs.load / xs.store on tensors of 1 to 4 dimensions on Hopper (issue 38), compiled offline for
sm_90a with the installed Triton: a tensor of 1, 3 or 4 dimensions takes its sizes and strides
as kernel arguments (``<t>_size<i>``, ``<t>_stride<i>``) and masked pointer loads/stores, the
leading offsets in int64 (``gl.to_tensor``: they may be constants); a 2-D tensor keeps its
``_rows``/``_cols``/``_stride`` and its TMA copies; a pipe slot filled from a 3-D tensor is a
pointer load and an arrive (no TMA). Numerics need a GPU (the CPU emulator's are tests/core)."""
import pytest

import xsync as xs
from tests.core.nd_kernels import (add_3d, batched_gemm, bias_add, bounded_4d, heads_4d, row_sums, rows_as_vectors,
                                   scale_3d)
from xsync.backends.nvidia import compile_ptx

F = xs.float32
CASES = [
    (bias_add, dict(BM=64, BN=64), dict(X=F, B=F, OUT=F),
     ["gl.load(B + xs_cols", "< B_size0)", "x + b[None, :]"]),
    (row_sums, dict(BM=64, BN=64), dict(X=F, OUT=F), ["gl.store(OUT + xs_cols", "< OUT_size0)"]),
    (rows_as_vectors, dict(BN=128), dict(X=F, OUT=F),
     ["gl.load(X + gl.to_tensor(r).to(gl.int64) * X_stride + xs_cols", "(r < X_rows)"]),
    (scale_3d, dict(BM=64, D=64), dict(X=xs.bfloat16, OUT=xs.bfloat16),
     ["gl.to_tensor(b).to(gl.int64) * X_stride0", "(b < X_size0)"]),
    (heads_4d, dict(BM=64, D=128), dict(Q=xs.float16, OUT=xs.float16),
     ["gl.to_tensor(bh // H).to(gl.int64) * Q_stride0 + gl.to_tensor(bh % H).to(gl.int64) * Q_stride1",
      "(bh % H < OUT_size1)"]),
    (bounded_4d, dict(BM=64, D=64), dict(Q=F, OUT=F), ["< s_end)", "(bh % H < H)"]),
    (add_3d, dict(BM=64, D=64, STAGES=2), dict(X=F, OUT=F),
     ['gl.atomic_add(OUT + gl.to_tensor(0).to(gl.int64) * OUT_stride0']),
    (batched_gemm, dict(BM=64, BN=64, BK=64, STAGES=2), dict(a=xs.bfloat16, b=xs.bfloat16, bias=F, c=F),
     ["warpgroup_mma(", "gl.to_tensor(z).to(gl.int64) * a_stride0"]),
]


@pytest.mark.parametrize("kernel,constexprs,dtypes,spelled", CASES, ids=[c[0].__name__ for c in CASES])
def test_compiles_for_sm90a(kernel, constexprs, dtypes, spelled):
    r = compile_ptx(kernel, constexprs, dtypes)
    assert ".target sm_90a" in r.ptx and len(r.cubin) > 4_000
    for s in spelled:
        assert s in r.source, s


def test_rank_of_each_tensor_in_the_signature():
    r = compile_ptx(heads_4d, dict(BM=64, D=64), dict(Q=F, OUT=F))
    assert ("def heads_4d(Q, Q_size0, Q_size1, Q_size2, Q_size3, Q_stride0, Q_stride1, Q_stride2, "
            "OUT, OUT_size0, OUT_size1, OUT_size2, OUT_size3, OUT_stride0, OUT_stride1, OUT_stride2, H, S)") in r.source
    r = compile_ptx(bias_add, dict(BM=64, BN=64), dict(X=F, B=F, OUT=F))
    assert "X, X_rows, X_cols, X_stride, B, B_size0," in r.source       # 2-D spelling unchanged


def test_3d_pipe_is_not_a_tma_pipe():
    r = compile_ptx(batched_gemm, dict(BM=64, BN=64, BK=64, STAGES=2), dict(a=xs.bfloat16, b=xs.bfloat16, bias=F, c=F))
    assert "xs_tma_load(" not in r.source.split("def batched_gemm_producer")[1]
    assert "mbarrier.arrive(xs_bars.index(TILES_FULL" in r.source
