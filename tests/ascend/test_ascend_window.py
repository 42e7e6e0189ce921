"""The sliding-window specializations (WINDOW=1) of the attention forward and backward on Ascend:
through the real HIVM compiler (every pass to hivmc, xsync's flags only, nothing over the
memories), and executed in the cube/vector simulator (XSYNC_BACKEND=ascend-sim) against the
float64 reference of tests/core/test_window_attention.py, forward and backward."""
import pytest
import torch

from test_ascend_hivm import live_pipes
from tests.core.test_window_attention import check, check_lse, reference
from xsync.backends.ascend import hivm
from xsync.kernels.flash_attn import attention, attention_fwd, grad, ops
from xsync.kernels.flash_attn.backward import attention_bwd_dkdv, attention_bwd_dq

pytestmark = pytest.mark.usefixtures("triton_ascend")


def specializations():
    out = []
    for d in (64, 128):
        cx = dict(ops.dim_constexprs(d), CAUSAL=0, WINDOW=1)
        out.append(pytest.param(attention_fwd, dict(ops.block_sizes("ascend", d, window=True), **cx), id=f"fwd-d{d}"))
        bwd = dict(grad.block_sizes("ascend", d), **cx)
        out.append(pytest.param(attention_bwd_dkdv, bwd, id=f"dkdv-d{d}"))
        out.append(pytest.param(attention_bwd_dq, bwd, id=f"dq-d{d}"))
    return out


@pytest.mark.parametrize("kernel,constexprs", specializations())
def test_window_kernels_pass_every_hivm_pass(kernel, constexprs):
    if hivm.compiler_path() is None:
        pytest.fail("bishengir-compile is missing: the ascend environment installs ascendnpu-ir")
    cx, dtypes = kernel.specialization()
    cx.update(constexprs)
    lowered = kernel.lower("ascend", cx, dtypes)
    result = hivm.compile_lowered(lowered, scalars={"sm_scale": "fp32"}, timeout=180)
    assert result.reached_hivmc, result.describe()
    assert result.overflow is None
    for fn, peaks in result.memory().items():
        for space, used in peaks.items():
            assert used <= hivm.CAPACITY.get(space, used), (fn, space, used)
    live = live_pipes(lowered.kernel)      # the unfused dK/dV's FUSED_DQ hand-off is folded away
    flags = {flag for name, flag in lowered.allocation.event_ids if name.split(":")[0] in live}
    assert result.flags(result.after_split) == flags and result.flags() == flags


@pytest.mark.parametrize("window,hq,hk,sq,sk", [((33, 7), 2, 1, 70, 90), ((3, 0), 2, 2, 80, 30)],
                         ids=["w33_7-gqa", "w3_0-blind-rows"])
def test_window_attention_on_the_simulator(monkeypatch, window, hq, hk, sq, sk):
    monkeypatch.setenv("XSYNC_BACKEND", "ascend-sim")
    torch.manual_seed(sq + sk)
    q = torch.randn(1, hq, sq, 64, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(1, hk, sk, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn(1, hq, sq, 64, dtype=torch.bfloat16)
    o, lse = attention(q, k, v, window_size=window)
    o.backward(do)
    ro, rlse, rgrads = reference(q, k, v, do, *window, 64 ** -0.5)
    check(o, ro, "O")
    check_lse(lse, rlse, "LSE")
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), rgrads):
        check(got, want, f"d{name}")
