"""benchmarks/attention.py calls its torch reference the way the installed torch defines
it. The benchmark itself needs a GPU; this catches a wrong keyword without one (it once
passed `is_causal=True`, which varlen_attn does not take, and fell back to padded SDPA)."""
import importlib.util
import os

import pytest
import torch

from tests.nvidia.conftest import ROOT


def benchmark_module():
    path = os.path.join(ROOT, "benchmarks", "attention.py")
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


def test_every_ab_candidate_names_real_schedule_fields_and_options():
    """benchmarks/flash_attn_ab.py's candidates (timed only on the GPU, where device time is
    scarce): each override names Schedule fields and builds a schedule whose fixed options are
    valid, each renderer option and constexpr set belongs to a candidate and validates."""
    import dataclasses

    from xsync import config
    from xsync.kernels.flash_attn import schedule

    spec = importlib.util.spec_from_file_location("xsync_bench_ab", os.path.join(ROOT, "benchmarks", "flash_attn_ab.py"))
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    fields = {f.name for f in dataclasses.fields(schedule.Schedule)}
    for name, (override, _merge) in ab.CANDIDATES.items():
        assert set(override) <= fields, (name, set(override) - fields)
        plan = dataclasses.replace(schedule.lookup("nvidia", 64, True, 1024), **override)
        with config.options(**plan.fixed_options()):
            pass
    for table in (ab.OPTIONS, ab.CONSTEXPRS):
        assert set(table) <= set(ab.CANDIDATES), set(table) - set(ab.CANDIDATES)
    for name, options in ab.OPTIONS.items():
        with config.options(**options):
            pass
    assert {"prefetch", "exp2_quarter", "exp2_half"} <= set(ab.CANDIDATES)


def test_attention_cluster_benchmark_names_the_multicast_decision():
    """benchmarks/attention_cluster.py (the K/V multicast A/B, timed on a GPU) labels each row
    with the allocation table's decision: multicast under Triton >= 3.8, own copies under 3.6."""
    from xsync.backends.nvidia import gluon_compat

    path = os.path.join(ROOT, "benchmarks", "attention_cluster.py")
    spec = importlib.util.spec_from_file_location("xsync_bench_attention_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for d in (64, 128):
        text = module.multicast_decision(d)
        if gluon_compat.cluster_multicast():
            assert text.startswith("TMA multicast to the 2 CTAs (lead CTA issues) rules 1-5"), text
        else:
            assert text.startswith("each program loads its own copy rule 1:"), text
