"""Sliding-window attention on the H200 (skipped without a Hopper GPU): forward and backward
against the float64 reference of tests/core/test_window_attention.py, and the work skipped
outside the window (a narrow window over a long sequence runs in a fraction of the full time)."""
import pytest

from tests.nvidia.conftest import gpu_reason

REASON = gpu_reason()
pytestmark = pytest.mark.skipif(bool(REASON), reason=f"needs a Hopper GPU: {REASON}")


@pytest.mark.parametrize("d,window", [(64, (256, 0)), (128, (33, 7))])
def test_window_matches_float64_on_hopper(d, window, monkeypatch):
    import torch

    from tests.core.test_window_attention import check, check_lse, reference
    from xsync.kernels.flash_attn import attention

    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    torch.manual_seed(d)
    q = torch.randn(2, 4, 1000, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 2, 777, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    o, lse = attention(q, k, v, window_size=window)
    o.backward(do)
    ro, rlse, rgrads = reference(q.cpu(), k.cpu(), v.cpu(), do.cpu(), *window, d ** -0.5)
    check(o.cpu(), ro, "O")
    check_lse(lse.cpu(), rlse, "LSE")
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), rgrads):
        check(got.cpu(), want, f"d{name}")


def test_window_skips_the_blocks_outside_it(monkeypatch):
    import torch

    from xsync.kernels.flash_attn import attention

    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    q, k, v = (torch.randn(1, 16, 16384, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def best_ms(**kw):
        for _ in range(3):
            attention(q, k, v, **kw)
        times = []
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            attention(q, k, v, **kw)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return min(times)

    # a 256-key window is about 3% of the keys; allow launch and edge-block overheads
    assert best_ms(window_size=(256, 0)) < 0.25 * best_ms()
