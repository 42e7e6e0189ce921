"""The examples users copy from (kernels/examples/): every kernel is proven on every placement
(`xsync check`), and the torch functions that launch them match torch in float64 on the CPU
emulator, on shapes the tiles do not divide and with fewer programs than tiles (persistent)."""
import os
import re
import subprocess
import sys

import pytest
import torch

from xsync.kernels.examples import gemm_epilogue, norms, row_softmax, split_k

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _spec(kernel, **over):
    return kernel, {**kernel.specialization()[0], **over}


# every kernel at the specializations the functions launch (the constexprs that change the code)
SPECS = [
    _spec(gemm_epilogue.gemm_bias_act, ACT=0), _spec(gemm_epilogue.gemm_bias_act, ACT=1),
    _spec(gemm_epilogue.gemm_bias_act, ACT=2),
    _spec(split_k.gemm_split_k),
    _spec(norms.rmsnorm_fwd), _spec(norms.rmsnorm_bwd), _spec(norms.layernorm_fwd), _spec(norms.layernorm_bwd),
    _spec(row_softmax.softmax_rows),
]


@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
def test_every_example_is_proven(backend):
    for kernel, cx in SPECS:
        report = kernel.lower(backend, cx).report
        assert report.proven, f"{kernel.__name__} {cx}: {report.summary()}"


def test_xsync_check_proves_an_example():
    r = subprocess.run([sys.executable, "-m", "xsync", "check", "xsync.kernels.examples.norms:rmsnorm_bwd"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("verdict: OK") == 3, r.stdout


def _close(got, want, tol):
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


# ---------------------------------------------------------------- GEMM + bias + activation
@pytest.mark.parametrize("activation,approximate", [("none", None), ("gelu", "none"), ("gelu_tanh", "tanh")])
def test_matmul_bias_act_matches_torch(activation, approximate):
    torch.manual_seed(0)
    M, N, K = 100, 70, 50                                   # no dimension a multiple of a tile
    a, b, bias = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16(), torch.randn(N)
    c = gemm_epilogue.matmul_bias_act(a, b, bias, activation, out_dtype=torch.float32, backend="cpu",
                                      block=(32, 32, 16), stages=2, programs=3)   # 12 tiles, 3 programs
    h = a.double() @ b.double() + bias.double()
    _close(c, h if approximate is None else torch.nn.functional.gelu(h, approximate=approximate), 1e-5)
    c16 = gemm_epilogue.matmul_bias_act(a, b, None, activation, backend="cpu", block=(64, 64, 32), stages=2)
    assert c16.dtype == torch.bfloat16
    h = a.double() @ b.double()
    _close(c16, h if approximate is None else torch.nn.functional.gelu(h, approximate=approximate), 2e-2)


def test_matmul_bias_act_refuses_an_unknown_activation():
    with pytest.raises(ValueError, match="gelu_tanh"):
        gemm_epilogue.matmul_bias_act(torch.zeros(4, 4), torch.zeros(4, 4), activation="relu", backend="cpu")


# ---------------------------------------------------------------- split-K GEMM
@pytest.mark.parametrize("splits", [None, 1, 3, 100])
def test_matmul_split_k_matches_torch(splits):
    torch.manual_seed(0)
    M, N, K = 100, 70, 300                   # 19 K steps of 16: a short last split for most counts
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = split_k.matmul_split_k(a, b, splits, out_dtype=torch.float32, backend="cpu", block=(32, 32, 16),
                               stages=2)
    _close(c, a.double() @ b.double(), 1e-5)
    assert split_k.matmul_split_k(a, b, 2, backend="cpu", block=(64, 64, 32)).dtype == torch.bfloat16


# ---------------------------------------------------------------- RMSNorm
@pytest.mark.parametrize("M,N,programs", [(37, 50, 2), (64, 256, None)])
def test_rms_norm_forward_and_backward_match_torch(M, N, programs):
    torch.manual_seed(0)
    x, w, dy = torch.randn(M, N).bfloat16(), torch.randn(N), torch.randn(M, N).bfloat16()
    y = norms.rms_norm_forward(x, w, 1e-5, backend="cpu", programs=programs)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    ref = torch.nn.functional.rms_norm(xd, (N,), wd, 1e-5)
    ref.backward(dy.double())
    _close(y, ref.detach(), 2e-2)
    dx, dw = norms.rms_norm_backward(dy, x, w, 1e-5, backend="cpu", programs=programs)
    _close(dx, xd.grad, 3e-2)
    _close(dw, wd.grad, 1e-4)


def test_rms_norm_autograd():
    torch.manual_seed(1)
    x = torch.randn(2, 5, 24, dtype=torch.float32, requires_grad=True)
    w = torch.randn(24, requires_grad=True)
    y = norms.rms_norm(x, w, 1e-6, backend="cpu")
    y.backward(torch.ones_like(y))
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = torch.nn.functional.rms_norm(xd, (24,), wd, 1e-6)
    ref.backward(torch.ones_like(ref))
    _close(y.detach(), ref.detach(), 1e-5)
    _close(x.grad, xd.grad, 1e-4)
    _close(w.grad, wd.grad, 1e-4)


# ---------------------------------------------------------------- LayerNorm
@pytest.mark.parametrize("M,N,programs", [(37, 50, 2), (64, 256, None)])
def test_layer_norm_forward_and_backward_match_torch(M, N, programs):
    torch.manual_seed(0)
    x, dy = torch.randn(M, N).bfloat16() * 3 + 1, torch.randn(M, N).bfloat16()
    w, b = torch.randn(N), torch.randn(N)
    y = norms.layer_norm_forward(x, w, b, 1e-5, backend="cpu", programs=programs)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
    ref = torch.nn.functional.layer_norm(xd, (N,), wd, bd, 1e-5)
    ref.backward(dy.double())
    _close(y, ref.detach(), 3e-2)
    dx, dw, db = norms.layer_norm_backward(dy, x, w, 1e-5, backend="cpu", programs=programs)
    _close(dx, xd.grad, 3e-2)
    _close(dw, wd.grad, 1e-4)
    _close(db, bd.grad, 1e-4)


def test_layer_norm_autograd():
    torch.manual_seed(1)
    x = torch.randn(3, 4, 40, requires_grad=True)
    w, b = torch.randn(40, requires_grad=True), torch.randn(40, requires_grad=True)
    y = norms.layer_norm(x, w, b, 1e-5, backend="cpu")
    y.backward(torch.cos(y.detach()))
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    ref = torch.nn.functional.layer_norm(xd, (40,), wd, bd, 1e-5)
    ref.backward(torch.cos(ref.detach()))
    _close(y.detach(), ref.detach(), 1e-5)
    for got, want in ((x.grad, xd.grad), (w.grad, wd.grad), (b.grad, bd.grad)):
        _close(got, want, 1e-4)


# ---------------------------------------------------------------- softmax
@pytest.mark.parametrize("M,N,block", [(37, 50, None), (20, 300, (8, 64)), (33, 1000, (4, 128))])
def test_softmax_matches_torch(M, N, block):
    """One column tile a row, and rows of 5 and 8 column tiles, the last one cut."""
    torch.manual_seed(0)
    x = torch.randn(M, N) * 5
    y = row_softmax.softmax(x, backend="cpu", block=block, programs=3)
    _close(y, torch.softmax(x.double(), -1), 1e-6)
    y16 = row_softmax.softmax(x.bfloat16().reshape(M, 1, N), backend="cpu", block=block)
    assert y16.shape == (M, 1, N) and y16.dtype == torch.bfloat16
    _close(y16.reshape(M, N), torch.softmax(x.bfloat16().double(), -1), 1e-2)


# ---------------------------------------------------------------- local attention
def test_local_attention_matches_a_masked_reference():
    """The flagship's kernels with WINDOW on (tests/core/test_window_attention.py is the full
    matrix): 40 rows, each sees itself and the 7 keys before it; gradients through autograd."""
    from xsync.kernels.examples import local_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 40, 2, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    o = local_attention(q, k, v, 7)
    i, j = torch.arange(40)[:, None], torch.arange(40)[None, :]
    keep = (j <= i) & (j >= i - 7)
    qd, kd, vd = (t.detach().double().transpose(1, 2).requires_grad_() for t in (q, k, v))
    s = (qd @ kd.transpose(-1, -2)) / 8.0
    ref = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ vd
    _close(o.transpose(1, 2), ref, 2e-2)
    go = torch.randn_like(o)
    o.backward(go)
    ref.backward(go.double().transpose(1, 2))
    for got, want in ((q, qd), (k, kd), (v, vd)):
        _close(got.grad.transpose(1, 2), want.grad, 5e-2)


# ---------------------------------------------------------------- the benchmark's calls
def test_benchmark_rows_run_on_the_emulator():
    """benchmarks/examples.py (timed on a Hopper GPU) calls each example and its torch
    equivalent; here both, sizes divided by 16, on the CPU emulator: same shapes and dtypes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("xsync_bench_examples",
                                                  os.path.join(ROOT, "benchmarks", "examples.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for name, (ours, theirs) in bench.cases("cpu", 16, "cpu").items():
        got, want = ours(), theirs()
        got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
        assert [(g.shape, g.dtype) for g in got] == [(w.shape, w.dtype) for w in want], name
        assert all(g.isfinite().all() for g in got), name


# ---------------------------------------------------------------- edges found by a new user
@pytest.mark.parametrize("row", [[-3e30, -2e30, -4e30], [-1e32] * 8, [float("-inf")] * 16, [float("-inf")] * 5,
                                 [float("-inf")] * 20 + [1.0, 2.0]])
def test_softmax_of_rows_below_any_sentinel(row):
    """Was: a running max starting at -1e30 and padding columns of -1e30 gave rows of huge
    negative values 0 (padding counted exp(0) = 1), and a -inf row 0 or NaN by its width."""
    x = torch.tensor([row])
    for block in (None, (4, 16)):
        y = row_softmax.softmax(x, backend="cpu", block=block)
        torch.testing.assert_close(y, torch.softmax(x.double(), -1).float(), equal_nan=True)


def test_the_example_wrappers_take_empty_inputs_and_name_bad_arguments():
    assert split_k.matmul_split_k(torch.randn(0, 8), torch.randn(8, 5), backend="cpu").shape == (0, 5)
    assert split_k.matmul_split_k(torch.randn(4, 8), torch.randn(8, 0), backend="cpu").shape == (4, 0)
    assert row_softmax.softmax(torch.randn(3, 0), backend="cpu").shape == (3, 0)
    assert norms.rms_norm(torch.randn(3, 0), torch.randn(0), backend="cpu").shape == (3, 0)
    x = torch.randn(0, 8, requires_grad=True)
    norms.layer_norm(x, torch.randn(8), backend="cpu").sum().backward()
    assert x.grad.shape == (0, 8)
    for call, words in [
        (lambda: norms.rms_norm(torch.randn(4, 40), torch.randn(39), backend="cpu"), "weight has shape (39,)"),
        (lambda: norms.layer_norm(torch.randn(4, 40), torch.randn(40), torch.randn(41), backend="cpu"),
         "bias has shape (41,)"),
        (lambda: gemm_epilogue.matmul_bias_act(torch.randn(4, 8), torch.randn(8, 50), torch.randn(49),
                                               backend="cpu"), "bias has shape (49,)"),
        (lambda: gemm_epilogue.matmul_bias_act(torch.randn(8), torch.randn(8, 5), backend="cpu"), "a has shape (8,)"),
        (lambda: row_softmax.softmax(torch.tensor(1.0), backend="cpu"), "0-d tensor"),
        (lambda: row_softmax.softmax(torch.randn(4, 4), backend="cpu", block=(0, 16)), "block=(0, 16)"),
        (lambda: norms.rms_norm_forward(torch.randn(4, 8), torch.randn(8), backend="cpu", block_rows=0),
         "block_rows=0: give a positive integer"),
        (lambda: split_k.matmul_split_k(torch.randn(4, 8), torch.randn(8, 5), backend="cpu", block=(16, 16)),
         "block=(16, 16)"),
    ]:
        with pytest.raises(ValueError, match=re.escape(words)):
            call()
