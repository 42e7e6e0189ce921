"""Elementwise math (xs.sqrt, rsqrt, exp, log, tanh, erf, sigmoid, abs, pow / ``**``) on Ascend:
the generated triton-ascend source reaches hivmc through the real HIVM compiler, and the
simulator (the Triton interpreter per core) runs it against torch. tl.tanh compiles but the
interpreter has none, so tanh is spelled from tl.exp (xsync/backends/ascend/render.py TL_MATH)."""
import pytest
import torch

from tests.core.math_kernels import cast_chain, every_function, gemm_bias_gelu, rmsnorm_rsqrt
from tests.core.test_elementwise_math import cast_reference, every_reference


@pytest.fixture(scope="module")
def hivm_compiler(triton_ascend):
    from xsync.backends.ascend import hivm
    if hivm.compiler_path() is None:
        pytest.fail("bishengir-compile is missing: the ascend environment installs ascendnpu-ir")
    return hivm


@pytest.mark.parametrize("kernel", [every_function, rmsnorm_rsqrt, gemm_bias_gelu, cast_chain],
                         ids=lambda k: k.__name__)
def test_hivm_compiles_math(kernel, hivm_compiler):
    result = hivm_compiler.compile_lowered(kernel.lower("ascend"), timeout=300)
    assert result.reached_hivmc, result.describe()


def test_simulated_every_function(triton_ascend):
    torch.manual_seed(0)
    x, y = torch.randn(32, 32), torch.full((32, 32), float("nan"))
    every_function[(2,)](x, y, BM=16, BN=32, backend="ascend-sim")
    torch.testing.assert_close(y, every_reference(x), rtol=1e-5, atol=1e-5)


def test_simulated_rmsnorm(triton_ascend):
    torch.manual_seed(0)
    M, N = 32, 48
    x, w = torch.randn(M, N).bfloat16(), torch.randn(1, N)
    y = torch.zeros(M, N).bfloat16()
    rmsnorm_rsqrt[(1,)](x, w, y, M, N, 2, BM=16, BN=64, STAGES=2, backend="ascend-sim")
    ref = torch.nn.functional.rms_norm(x.float(), (N,), eps=1e-6) * w
    torch.testing.assert_close(y.float(), ref.bfloat16().float(), rtol=2e-2, atol=2e-2)


def test_simulated_casts(triton_ascend):
    torch.manual_seed(0)
    x, y = torch.randn(32, 32) * 4, torch.zeros(32, 32)
    cast_chain[(2,)](x, y, BM=16, BN=32, backend="ascend-sim")
    assert torch.equal(y, cast_reference(x))
