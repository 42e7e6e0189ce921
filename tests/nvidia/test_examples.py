"""The examples (kernels/examples/) on Hopper: each kernel, at the specializations its torch
function launches, compiles offline for sm_90a with the installed Triton (3.6 and 3.9 in the
matrix), no GPU needed. On a Hopper GPU: the torch functions against torch."""
import pytest

from tests.core.test_examples import SPECS
from tests.nvidia.conftest import gpu_reason
from xsync.backends.nvidia import compile_ptx


@pytest.mark.parametrize("kernel,constexprs", SPECS,
                         ids=[f"{k.__name__}-{i}" for i, (k, _) in enumerate(SPECS)])
def test_example_compiles_for_sm90a(kernel, constexprs):
    r = compile_ptx(kernel, constexprs)
    assert ".target sm_90a" in r.ptx and len(r.cubin) > 10_000


GPU = gpu_reason()


@pytest.mark.skipif(bool(GPU), reason=f"needs a Hopper GPU: {GPU}")
def test_examples_on_gpu():
    import torch

    from xsync.kernels.examples import (layer_norm_backward, layer_norm_forward, matmul_bias_act, matmul_split_k,
                                       rms_norm_backward, rms_norm_forward, softmax)

    torch.manual_seed(0)
    M, N, K = 1000, 712, 520                 # tiles cut at M and N; odd inner size padded on the host
    a = torch.randn(M, K, device="cuda").bfloat16()
    b = torch.randn(K, N, device="cuda").bfloat16()
    bias = torch.randn(N, device="cuda")
    c = matmul_bias_act(a, b, bias, "gelu", out_dtype=torch.float32, backend="nvidia")
    ref = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
    torch.testing.assert_close(c.double(), ref, rtol=2e-3, atol=2e-3)

    c = matmul_split_k(a[:128], b, 4, out_dtype=torch.float32, backend="nvidia")
    torch.testing.assert_close(c.double(), a[:128].double() @ b.double(), rtol=1e-3, atol=1e-3)

    x, w, dy = (torch.randn(M, 1000, device="cuda").bfloat16(), torch.randn(1000, device="cuda"),
                torch.randn(M, 1000, device="cuda").bfloat16())
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    y_ref = torch.nn.functional.rms_norm(xd, (1000,), wd, 1e-6)
    y_ref.backward(dy.double())
    torch.testing.assert_close(rms_norm_forward(x, w, backend="nvidia").double(), y_ref.detach(),
                               rtol=2e-2, atol=2e-2)
    dx, dw = rms_norm_backward(dy, x, w, backend="nvidia")
    torch.testing.assert_close(dx.double(), xd.grad, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(dw.double(), wd.grad, rtol=1e-3, atol=1e-3)

    b0 = torch.randn(1000, device="cuda")
    xd, wd, bd = x.double().requires_grad_(), w.double().requires_grad_(), b0.double().requires_grad_()
    y_ref = torch.nn.functional.layer_norm(xd, (1000,), wd, bd, 1e-5)
    y_ref.backward(dy.double())
    torch.testing.assert_close(layer_norm_forward(x, w, b0, backend="nvidia").double(), y_ref.detach(),
                               rtol=3e-2, atol=3e-2)
    dx, dw, db = layer_norm_backward(dy, x, w, backend="nvidia")
    torch.testing.assert_close(dx.double(), xd.grad, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(dw.double(), wd.grad, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(db.double(), bd.grad, rtol=1e-3, atol=1e-3)

    s = torch.randn(300, 5000, device="cuda") * 5        # 5 column tiles of 1024, the last cut
    torch.testing.assert_close(softmax(s, backend="nvidia").double(), torch.softmax(s.double(), -1),
                               rtol=1e-5, atol=1e-6)
