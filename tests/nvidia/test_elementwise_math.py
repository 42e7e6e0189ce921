"""Elementwise math (xs.sqrt, rsqrt, exp, log, tanh, erf, sigmoid, abs, pow / ``**``) on Hopper,
compiled offline for sm_90a with the installed Triton (3.6 and 3.9 in the matrix): Gluon's own
gl.sqrt / rsqrt / exp / log / erf / abs, tanh, sigmoid and powers spelled from gl.exp / exp2 /
log2, every operand float32. Numerics need a GPU (the CPU emulator's are tests/core)."""
import pytest

from tests.core.math_kernels import EVERY, GEMM_GELU, RMSNORM, cast_chain, every_function, gemm_bias_gelu, rmsnorm_rsqrt
from xsync.backends.nvidia import compile_ptx


def _cx(example, **over):
    return {**{k: v for k, v in example.items() if isinstance(v, int)}, **over}


@pytest.mark.parametrize("kernel,constexprs,calls", [
    (gemm_bias_gelu, _cx(GEMM_GELU), ["gl.erf("]),
    (gemm_bias_gelu, _cx(GEMM_GELU, TANH=1), ["gl.exp(-2.0 * "]),
    (rmsnorm_rsqrt, _cx(RMSNORM), ["gl.rsqrt("]),
    (every_function, _cx(EVERY), ["gl.sqrt(", "gl.rsqrt(", "gl.exp(", "gl.log(", "gl.erf(", "gl.abs(",
                                  "gl.exp2(0.5 * gl.log2("]),
    (cast_chain, _cx(EVERY), [".to(gl.bfloat16).to(gl.float16)", ".to(gl.int32)"]),
], ids=["gelu-erf", "gelu-tanh", "rmsnorm", "every", "casts"])
def test_math_kernels_compile_for_sm90a(kernel, constexprs, calls):
    r = compile_ptx(kernel, constexprs)
    assert ".target sm_90a" in r.ptx and len(r.cubin) > 10_000
    for c in calls:
        assert c in r.source, c
    if kernel is every_function:
        for op in ("sqrt.approx", "rsqrt.approx", "ex2.approx", "abs."):
            assert op in r.ptx, op
