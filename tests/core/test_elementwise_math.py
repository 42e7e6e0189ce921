"""Elementwise math in the vocabulary (xs.sqrt, rsqrt, exp, log, tanh, erf, sigmoid, abs, pow /
``**``, casts): the CPU emulator against torch (a GEMM with a bias + GELU epilogue, an RMSNorm
through rsqrt, a kernel using every function), every backend lowers and renders them, and the
powers no backend can spell are refused at check naming the line and a fix."""
import inspect

import pytest
import torch

import xsync as xs
from tests.core.math_kernels import cast_chain, every_function, gemm_bias_gelu, rmsnorm_rsqrt
from xsync.errors import KernelSourceError

KERNELS = [gemm_bias_gelu, rmsnorm_rsqrt, every_function, cast_chain]


def every_reference(x):
    p = x.abs() + 0.5
    return (p.sqrt() + p.rsqrt() + (-p).exp() + p.log() + x.tanh() + torch.erf(x) + torch.sigmoid(x)
            + p ** 0.5 + x ** 2 + 1 / p + x.bfloat16().abs().float())


def test_every_function_matches_torch():
    torch.manual_seed(0)
    x, y = torch.randn(40, 32), torch.full((40, 32), float("nan"))
    every_function[(3,)](x, y, BM=16, BN=32, backend="cpu")
    torch.testing.assert_close(y, every_reference(x), rtol=1e-6, atol=1e-6)


def cast_reference(x):
    return (x.bfloat16().half().float() + x.int().float() + (x > 0).float()
            + x.half().bfloat16().float())


def test_cast_pairs_match_torch():
    torch.manual_seed(0)
    x, y = torch.randn(32, 32) * 4, torch.zeros(32, 32)
    cast_chain[(2,)](x, y, BM=16, BN=32, backend="cpu")
    assert torch.equal(y, cast_reference(x))


@pytest.mark.parametrize("tanh", [0, 1])
def test_gemm_bias_gelu_matches_torch(tanh):
    torch.manual_seed(0)
    M, N, K = 100, 70, 64                                   # tiles cut at M and N
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    bias, c = torch.randn(1, N), torch.zeros(M, N).bfloat16()
    gemm_bias_gelu[(2 * 2,)](a, b, bias, c, M, N, K, BM=64, BN=64, BK=32, STAGES=2, TANH=tanh,
                             backend="cpu")
    h = a.float() @ b.float() + bias
    ref = torch.nn.functional.gelu(h, approximate="tanh" if tanh else "none")
    torch.testing.assert_close(c.float(), ref.bfloat16().float(), rtol=2e-2, atol=2e-2)


def test_rmsnorm_rsqrt_matches_torch():
    torch.manual_seed(0)
    M, N = 96, 48
    x, w = torch.randn(M, N).bfloat16(), torch.randn(1, N)
    y = torch.zeros(M, N).bfloat16()
    rmsnorm_rsqrt[(2,)](x, w, y, M, N, 3, BM=16, BN=64, STAGES=2, backend="cpu")
    ref = torch.nn.functional.rms_norm(x.float(), (N,), eps=1e-6) * w
    torch.testing.assert_close(y.float(), ref.bfloat16().float(), rtol=2e-2, atol=2e-2)


def _source(kernel, backend):
    with xs.options(verify=False):
        lowered = kernel.lower(backend)
    args = (lowered.kernel, lowered.placement, lowered.allocation)
    if backend == "nvidia":
        from xsync import config
        from xsync.backends.nvidia import NVIDIA
        from xsync.backends.nvidia.render import render
        return render(*args, config.render_options(NVIDIA, {})).source
    from xsync.backends.ascend import render as ascend_render
    return ascend_render.render_module(*args, "release").source


@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
def test_every_backend_proves_the_math_kernels(backend):
    for k in KERNELS:
        assert k.lower(backend).report.proven


@pytest.mark.parametrize("backend,lib", [("nvidia", "gl"), ("ascend", "tl")])
def test_math_is_spelled_in_float32(backend, lib):
    src = _source(every_function, backend)
    for fn in ("sqrt", "rsqrt", "exp", "log", "erf", "abs"):
        assert f"{lib}.{fn}(" in src, fn
    assert f"{lib}.exp2(0.5 * {lib}.log2(" in src                          # p ** 0.5
    assert "(2.0 / (1.0 + " in src                                         # tanh from exp
    assert f".to({lib}.float32)" in src
    assert "sigmoid" not in src or backend == "ascend"
    assert "1e-06" in _source(rmsnorm_rsqrt, backend) and f"{lib}.rsqrt(" in _source(rmsnorm_rsqrt, backend)


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, B=16))
def tile_exponent(x, y, B: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        v = xs.load(x, [0, 0], [B, B])
        xs.store(y, [0, 0], v ** v)


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, B=16))
def huge_integer_power(x, y, B: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        v = xs.load(x, [0, 0], [B, B])
        xs.store(y, [0, 0], xs.pow(v, 40))


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, B=16))
def python_abs(x, y, B: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        v = xs.load(x, [0, 0], [B, B])
        xs.store(y, [0, 0], abs(v))


def _line(kernel, text):
    lines, start = inspect.getsourcelines(kernel.fn)
    return start + next(i for i, l in enumerate(lines) if text in l)


@pytest.mark.parametrize("kernel,text,words,fix", [
    (tile_exponent, "v ** v", "not a compile-time number", "xs.exp2(y * xs.log2(x))"),
    (huge_integer_power, "xs.pow(v, 40)", "more than 16 products", "float exponent"),
    (python_abs, "abs(v)", "Python's abs() is not a tile op", "xs.abs"),
])
def test_powers_no_backend_spells_are_refused(kernel, text, words, fix):
    with pytest.raises(KernelSourceError) as info:
        kernel.lower("cpu")
    msg = str(info.value)
    assert f"test_elementwise_math.py:{_line(kernel, text)}" in msg and words in msg, msg
    assert fix in info.value.fix

