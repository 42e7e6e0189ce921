"""benchmarks/flash_attn.py calls its torch reference the way the installed torch defines
it. The benchmark itself needs a GPU; this catches a wrong keyword without one (it once
passed `is_causal=True`, which varlen_attn does not take, and fell back to padded SDPA)."""
import importlib.util
import os

import pytest
import torch

from tests.nvidia.conftest import ROOT


def benchmark_module():
    path = os.path.join(ROOT, "benchmarks", "flash_attn.py")
    spec = importlib.util.spec_from_file_location("xsync_bench_flash_attn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_reference_binds_to_the_installed_torch(causal):
    bench = benchmark_module()
    q = torch.zeros(10, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    run, why = bench.varlen_attn_call(q, q, q, cu, 6, causal)
    assert why is None, why
    assert callable(run)


def test_backward_section_runs_its_autograd_calls(monkeypatch):
    """The backward section's runner (timed on the GPU) returns dQ, dK, dV from the retained
    graph, repeatedly; here on the installed torch with the CPU emulator (also on a GPU
    machine, where the backend would otherwise be picked as nvidia)."""
    from xsync.kernels.flash_attn import attention

    monkeypatch.setenv("XSYNC_BACKEND", "cpu")

    bench = benchmark_module()
    q, k, v = (torch.randn(1, 2, 20, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    run, grad_o = bench.backward_runner(lambda q, k, v: attention(q, k, v, causal=True)[0], q, k, v)
    first, second = run(), run()
    assert grad_o.shape == q.shape
    for a, b, t in zip(first, second, (q, k, v)):
        assert a.shape == t.shape and torch.equal(a, b)
    row = dict(kind="backward", d=64, causal=True, s=1024, b=16, h=32, xsync_tflops=1.0)
    assert "| 64 | True | 1024 |" in bench.table([row])
