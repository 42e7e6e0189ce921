"""xs.load / xs.store on tensors of 1 to 4 dimensions on Ascend (issue 38): the leading offsets
move the base pointer, the tile is a 1-D or 2-D block pointer over the last dimensions, an
out-of-range leading offset empties the block (xsync/backends/ascend/addressing.py). The real
HIVM compiler takes every kernel to hivmc; the simulator runs them against torch; a view whose
last dimension is strided is refused at launch."""
import pytest
import torch

import xsync as xs
from tests.core.nd_kernels import (add_3d, batched_gemm, bias_add, bounded_4d, heads_4d, row_sums, rows_as_vectors,
                                   scale_3d)
from xsync.backends.ascend import hivm
from xsync.errors import LaunchError

F = xs.float32
CASES = [
    (bias_add, dict(BM=16, BN=16), dict(X=F, B=F, OUT=F)),
    (row_sums, dict(BM=16, BN=16), dict(X=F, OUT=F)),
    (rows_as_vectors, dict(BN=32), dict(X=F, OUT=F)),
    (scale_3d, dict(BM=16, D=32), dict(X=xs.bfloat16, OUT=xs.bfloat16)),
    (heads_4d, dict(BM=16, D=32), dict(Q=xs.float16, OUT=xs.float16)),
    (bounded_4d, dict(BM=16, D=32), dict(Q=F, OUT=F)),
    (add_3d, dict(BM=16, D=32, STAGES=2), dict(X=F, OUT=F)),
    (batched_gemm, dict(BM=32, BN=32, BK=32, STAGES=2), dict(a=xs.float16, b=xs.float16, bias=F, c=F)),
]


@pytest.fixture(scope="module")
def compiler(triton_ascend):
    if hivm.compiler_path() is None:
        pytest.fail("bishengir-compile is missing: the ascend environment installs ascendnpu-ir")


@pytest.mark.parametrize("kernel,constexprs,dtypes", CASES, ids=[k.__name__ for k, _, _ in CASES])
def test_hivm_compiles(compiler, kernel, constexprs, dtypes):
    r = hivm.compile_lowered(kernel.lower("ascend", constexprs=constexprs, tensor_dtypes=dtypes), timeout=300)
    assert r.reached_hivmc, r.describe()


def test_generated_addressing():
    lowered = heads_4d.lower("ascend", constexprs=dict(BM=16, D=32), tensor_dtypes=dict(Q=F, OUT=F))
    from xsync import config
    src = lowered.backend.render_source(lowered.kernel, lowered.placement, lowered.allocation,
                                        config.render_options(lowered.backend))
    src = getattr(src, "source", src)
    assert "xs_Q_d0, xs_Q_d1, xs_Q_d2, xs_Q_d3, xs_Q_s0, xs_Q_s1, xs_Q_s2" in src
    assert "tl.make_block_ptr(Q + (bh // H) * xs_Q_s0 + (bh % H) * xs_Q_s1, shape=(xs_Q_d2 * (" in src


def test_simulated_bias_and_row_sums(triton_ascend):
    torch.manual_seed(0)
    x, b = torch.randn(37, 40), torch.randn(40)
    out = torch.full((37, 40), 7.0)
    bias_add[(3, 3)](x, b, out, BM=16, BN=16, backend="ascend-sim")
    torch.testing.assert_close(out, x + b)
    sums = torch.full((37,), -1.0)
    row_sums[(3,)](x[:, :16], sums, BM=16, BN=16, backend="ascend-sim")
    torch.testing.assert_close(sums, x[:, :16].sum(1), atol=1e-5, rtol=1e-5)
    rows = torch.full((5, 24), 3.0)
    rows_as_vectors[(6,)](x[:5, :24], rows, BN=32, backend="ascend-sim")
    torch.testing.assert_close(rows, 2 * x[:5, :24])


def test_simulated_3d_and_4d_views(triton_ascend):
    torch.manual_seed(0)
    x = torch.randn(40, 3, 32).transpose(0, 1)                      # [3, 40, 32], strided
    out = torch.zeros(3, 40, 32)
    scale_3d[(3 * 3,)](x, out, 40, BM=16, D=32, backend="ascend-sim")
    torch.testing.assert_close(out, 2 * x)
    B, S, H, D = 2, 20, 3, 32
    q = torch.randn(B, S, H, D).half().transpose(1, 2)              # [B, H, S, D] view
    got = torch.full((B, S, H, D), 5.0).half()
    heads_4d[(B * H * 2,)](q, got.transpose(1, 2), H, S, BM=16, D=D, backend="ascend-sim")
    torch.testing.assert_close(got, (2 * q + 1).transpose(1, 2))


def test_simulated_bounds_and_reduce_add(triton_ascend):
    torch.manual_seed(0)
    q = torch.randn(2, 2, 32, 32)
    out = torch.zeros(2, 2, 32, 32)
    bounded_4d[(2 * 2 * 2,)](q, out, 2, 32, 21, BM=16, D=32, backend="ascend-sim")
    torch.testing.assert_close(out[:, :, :21], q[:, :, :21])
    assert not out[:, :, 21:].any()
    x = torch.randn(4, 24, 32)
    acc = torch.zeros(1, 24, 32)
    add_3d[(2, 3)](x, acc, 24, 4, BM=16, D=32, STAGES=2, backend="ascend-sim")
    torch.testing.assert_close(acc[0], x.sum(0), atol=1e-5, rtol=1e-5)


def test_simulated_batched_gemm_from_3d_views(triton_ascend):
    torch.manual_seed(0)
    Z, M, N, K = 2, 40, 48, 64
    a = torch.randn(M, Z, K).half().transpose(0, 1)                 # [Z, M, K], strided
    b = torch.randn(Z, K, N).half()
    bias, c = torch.randn(N), torch.zeros(Z, M, N)
    batched_gemm[(2, 2, Z)](a, b, bias, c, M, K, BM=32, BN=32, BK=32, STAGES=2, backend="ascend-sim")
    torch.testing.assert_close(c, (a.float() @ b.float()) + bias, atol=1e-2, rtol=1e-2)


def test_strided_last_dimension_is_refused_at_launch(triton_ascend):
    q = torch.randn(1, 1, 32, 64)[..., ::2]                         # last stride 2
    with pytest.raises(LaunchError) as info:
        heads_4d[(2,)](q, torch.zeros(1, 1, 32, 32), 1, 32, BM=16, D=32, backend="ascend-sim")
    assert "stride 2 in its last dimension" in str(info.value) and "contiguous" in info.value.fix
