"""The attention backward's generated Ascend code (three kernels: preprocess on the vector
cores, dK/dV and dQ split cube/vector with GM-slot hand-offs) executed in the cube/vector
simulator (XSYNC_BACKEND=ascend-sim), gradients against float64 autograd. Small shapes: the
simulator interprets every core."""
import math

import pytest
import torch

from xsync.kernels.flash_attn import attention, attention_varlen

pytestmark = pytest.mark.usefixtures("triton_ascend")


@pytest.fixture(autouse=True)
def on_simulator(monkeypatch):
    monkeypatch.setenv("XSYNC_BACKEND", "ascend-sim")


def reference_grads(q, k, v, causal, grad_o):
    """float64 attention gradients (bottom-right causal; rows that see no key give 0)."""
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kr, vr = kd.repeat_interleave(group, 1), vd.repeat_interleave(group, 1)
    s = qd @ kr.transpose(-1, -2) / math.sqrt(q.shape[-1])
    sq, sk = q.shape[2], k.shape[2]
    if causal:
        s = s.masked_fill(torch.arange(sk)[None, :] > torch.arange(sq)[:, None] + (sk - sq), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    ((p @ vr) * grad_o.double()).sum().backward()
    return qd.grad, kd.grad, vd.grad


def assert_close(name, got, want, floor):
    """Relative Frobenius error; ``floor`` (the largest reference gradient of the problem)
    stands in for gradients that are 0 in exact arithmetic (dq, dk of a one-key sequence)."""
    err = (got.double() - want).norm().item() / max(want.norm().item(),
                                                    0.1 * floor * want.numel() ** 0.5, 1e-6)
    # bf16 rounded to nearest even stays under 2.5e-3 here; truncation reaches 6e-3
    assert torch.isfinite(got).all() and err < 5e-3, f"{name}: relative error {err:.3g}"


@pytest.mark.parametrize("hq,hk,sq,sk,d,causal,dtype", [
    (4, 2, 70, 90, 64, True, torch.bfloat16),      # GQA 2:1, Sq < Sk, boundary blocks
    (2, 2, 33, 33, 128, False, torch.float16),
    (2, 1, 80, 40, 64, True, torch.bfloat16),      # MQA; rows that see no key
    (4, 2, 40, 50, 96, True, torch.bfloat16),      # d96: 128-wide tiles, zero columns
    (2, 1, 40, 50, 256, False, torch.bfloat16),    # d256: 16 rows a replica (schedule.py)
    # several steps a tile: the cube's rotated loops (prologue, steps ahead, the last step;
    # the later stage's Q/dO or K loaded again, cross-agent-pipeline rule 9)
    (2, 1, 300, 280, 64, True, torch.bfloat16),
    (1, 1, 270, 390, 128, False, torch.float16),
    # d128 causal: dQ in four sub-tile replicas of 256 keys (schedule.py), Sq > Sk
    (1, 1, 390, 270, 128, True, torch.float16),
])
def test_attention_backward_dense(hq, hk, sq, sk, d, causal, dtype):
    torch.manual_seed(sq + sk)
    q = torch.randn(1, hq, sq, d).to(dtype).requires_grad_()
    k, v = (torch.randn(1, hk, sk, d).to(dtype).requires_grad_() for _ in range(2))
    o, _ = attention(q, k, v, causal=causal)
    grad_o = torch.randn_like(o)
    o.backward(grad_o)
    want = reference_grads(q, k, v, causal, grad_o)
    for name, t, w in zip(("dq", "dk", "dv"), (q, k, v), want):
        assert_close(name, t.grad, w, max(x.abs().max().item() for x in want))


def test_attention_backward_varlen():
    torch.manual_seed(7)
    lens = [17, 1, 40]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v = (torch.randn(sum(lens), 2, 64).bfloat16().requires_grad_() for _ in range(3))
    o, _ = attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    grad_o = torch.randn_like(o)
    o.backward(grad_o)
    for b in range(len(lens)):
        s = slice(cu[b], cu[b + 1])
        dense = [t[s].transpose(0, 1)[None] for t in (q, k, v)]
        want = reference_grads(*dense, True, grad_o[s].transpose(0, 1)[None])
        for name, t, w in zip(("dq", "dk", "dv"), (q, k, v), want):
            assert_close(f"{name} of sequence {b}", t.grad[s].transpose(0, 1)[None], w,
                         max(x.abs().max().item() for x in want))
