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
