"""The examples (kernels/examples/) on Ascend: each kernel, at the specializations its torch
function launches, reaches hivmc through the real HIVM compiler, and the torch functions run
on the simulator (``backend="ascend-sim"``: the generated triton-ascend module, per core)
against torch in float64, on shapes the tiles do not divide."""
import pytest
import torch

from tests.core.test_examples import SPECS
import xsync as xs
from xsync.errors import UnsupportedError
from xsync.kernels.examples import gemm_epilogue, norms, row_softmax, split_k

# The split-K kernel's reduce-add runs in a vector role of a kernel with matrix work: only the
# scope form (triton-ascend 3.2.1+, `al`) lets one vector core add, and the installed 3.2.0 has
# no `al` to compile it with; the release form is refused at check (test below).
HIVM = [(k, cx) for k, cx in SPECS if k is not split_k.gemm_split_k]


@pytest.fixture(scope="module")
def hivm_compiler(triton_ascend):
    from xsync.backends.ascend import hivm
    if hivm.compiler_path() is None:
        pytest.fail("bishengir-compile is missing: the ascend environment installs ascendnpu-ir")
    return hivm


@pytest.mark.parametrize("kernel,constexprs", HIVM,
                         ids=[f"{k.__name__}-{i}" for i, (k, _) in enumerate(HIVM)])
def test_hivm_compiles_the_example(kernel, constexprs, hivm_compiler):
    result = hivm_compiler.compile_lowered(kernel.lower("ascend", constexprs), timeout=300)
    assert result.reached_hivmc, result.describe()


def _close(got, want, tol):
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("activation,approximate", [("gelu", "none"), ("gelu_tanh", "tanh")])
def test_simulated_matmul_bias_act(triton_ascend, activation, approximate):
    torch.manual_seed(0)
    M, N, K = 40, 40, 40
    a, b, bias = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16(), torch.randn(N)
    c = gemm_epilogue.matmul_bias_act(a, b, bias, activation, out_dtype=torch.float32, backend="ascend-sim",
                                      block=(32, 32, 16), stages=2, programs=2)
    h = a.double() @ b.double() + bias.double()
    _close(c, torch.nn.functional.gelu(h, approximate=approximate), 1e-5)


def test_simulated_rms_norm(triton_ascend):
    torch.manual_seed(0)
    M, N = 37, 50
    x, w, dy = torch.randn(M, N).bfloat16(), torch.randn(N), torch.randn(M, N).bfloat16()
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    ref = torch.nn.functional.rms_norm(xd, (N,), wd, 1e-6)
    ref.backward(dy.double())
    _close(norms.rms_norm_forward(x, w, backend="ascend-sim", programs=2), ref.detach(), 2e-2)
    dx, dw = norms.rms_norm_backward(dy, x, w, backend="ascend-sim", programs=2)
    _close(dx, xd.grad, 3e-2)
    _close(dw, wd.grad, 1e-4)


def test_split_k_release_form_is_refused():
    with pytest.raises(UnsupportedError) as info:
        split_k.gemm_split_k.compile("ascend-sim")
    assert "split_k.py:" in str(info.value) and "scope" in info.value.fix


def test_simulated_matmul_split_k_scope_form(triton_ascend):
    torch.manual_seed(0)
    M, N, K = 100, 70, 200
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    with xs.options(ascend_form="scope"):
        c = split_k.matmul_split_k(a, b, 3, out_dtype=torch.float32, backend="ascend-sim", block=(32, 32, 16),
                                   stages=2)
    _close(c, a.double() @ b.double(), 1e-5)


def test_simulated_softmax(triton_ascend):
    torch.manual_seed(0)
    x = torch.randn(20, 300) * 5
    y = row_softmax.softmax(x, backend="ascend-sim", block=(8, 64), programs=2)
    _close(y, torch.softmax(x.double(), -1), 1e-6)


def test_simulated_layer_norm(triton_ascend):
    torch.manual_seed(0)
    M, N = 37, 50
    x, dy = torch.randn(M, N).bfloat16() * 3 + 1, torch.randn(M, N).bfloat16()
    w, b = torch.randn(N), torch.randn(N)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
    ref = torch.nn.functional.layer_norm(xd, (N,), wd, bd, 1e-5)
    ref.backward(dy.double())
    _close(norms.layer_norm_forward(x, w, b, backend="ascend-sim", programs=2), ref.detach(), 3e-2)
    dx, dw, db = norms.layer_norm_backward(dy, x, w, backend="ascend-sim", programs=2)
    _close(dx, xd.grad, 3e-2)
    _close(dw, wd.grad, 1e-4)
    _close(db, bd.grad, 1e-4)


def test_rows_too_wide_for_the_unified_buffer_take_smaller_blocks(triton_ascend):
    """A LayerNorm backward row block of 4 x 2048 does not fit a vector core's UB (xsync's
    estimate refuses it at compile, before anything runs); the function halves the block until
    one fits (here 1 row) and remembers it."""
    from xsync.kernels.examples import _host

    torch.manual_seed(0)
    M, N = 6, 1500
    x, dy, w = torch.randn(M, N).bfloat16(), torch.randn(M, N).bfloat16(), torch.randn(N)
    dx, dw, db = norms.layer_norm_backward(dy, x, w, backend="ascend-sim", programs=2)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, torch.zeros(N)))
    torch.nn.functional.layer_norm(xd, (N,), wd, bd, 1e-5).backward(dy.double())
    _close(dx, xd.grad, 3e-2)
    _close(dw, wd.grad, 1e-4)
    fitted = [bm for (k, b, cx, start), bm in _host._FITTED.items()
              if k is norms.layernorm_bwd and b.name == "ascend-sim" and dict(cx)["BN"] == 2048]
    assert fitted == [1]
