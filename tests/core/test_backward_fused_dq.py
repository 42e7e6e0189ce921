"""The attention backward with dQ fused into the dK/dV kernel (backward.py, FUSED_DQ=1): the
dS K share of every step reduce-added into an fp32 accumulator by the grad (vector) role.

Proven by the verifier on every placement it lowers to (not bounded), selected on the CPU by
the backward schedule, and equal to a float64 reference through autograd at odd shapes
(Sq != Sk, lengths 1/17/100, GQA, varlen, d64 and d128, causal or not)."""
import math

import pytest
import torch

import xsync
from xsync.config import ConfigError
from xsync.errors import AllocationError
from xsync.kernels.flash_attn import grad, ops
from xsync.kernels.flash_attn.backward import attention_bwd_dkdv

PLACEMENTS = [("cpu", None), ("nvidia", None), ("ascend", "release"), ("ascend", "scope")]


@pytest.mark.parametrize("backend,form", PLACEMENTS, ids=[f"{b}-{f}" if f else b for b, f in PLACEMENTS])
def test_fused_kernel_is_proven_on_every_placement(backend, form):
    opts = {"ascend_form": form} if form else {}
    seqs = (0, 4096) if backend == "cpu" else (0,)     # the CPU's short and long rows
    for d in ops.HEAD_DIMS:
        for causal in (0, 1):
            for max_seq in seqs:
                cx, dtypes = attention_bwd_dkdv.specialization()
                cx.update(grad.fused_block_sizes(backend, d, bool(causal), max_seq),
                          **ops.dim_constexprs(d), CAUSAL=causal)
                assert cx["FUSED_DQ"] == 1
                if backend == "nvidia" and d == 256:
                    # dQ's [64, 256] fp32 hand-off does not fit beside the d256 tiles: said, not launched
                    with pytest.raises(AllocationError, match="shared memory"):
                        attention_bwd_dkdv.lower(backend, cx, dtypes)
                    continue
                with xsync.options(**opts):
                    low = attention_bwd_dkdv.lower(backend, cx, dtypes)
                assert low.report.proven, (backend, form, d, causal, max_seq, low.report)


def test_selection_is_data_per_backend():
    # the CPU fuses; Hopper and Ascend keep the dQ kernel (untimed / not simulated yet)
    assert grad.fused_dq("cpu", 64, True, 17) and grad.fused_dq("cpu", 128, False, 4096)
    assert not grad.fused_dq("nvidia", 128, True, 4096) and not grad.fused_dq("ascend", 64, False, 100)
    with xsync.options(attn_fused_dq=False):
        assert not grad.fused_dq("cpu", 64, True, 17)
    with xsync.options(attn_fused_dq=True):
        assert grad.fused_dq("nvidia", 64, True, 17)
    # Hopper's fused dK/dV steps 64 query rows at least (dQ's share is a wgmma result, M >= 64)
    assert grad.fused_block_sizes("nvidia", 128)["BN"] == 64


def test_bad_option_value_names_the_variable():
    with pytest.raises(ConfigError) as e:
        with xsync.options(attn_fused_dq="maybe"):
            pass
    assert "attn_fused_dq" in str(e.value) and "maybe" in str(e.value)


def _reference(q, k, v, do, causal, scale):
    """float64 gradients of attention (bottom-right causal, GQA by repeating K/V heads)."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ kk.transpose(-1, -2) * scale
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.arange(sk)[None, :] > torch.arange(sq)[:, None] + sk - sq, float("-inf"))
    (torch.softmax(s, -1).nan_to_num(0) @ vv).backward(do.double())
    return q.grad, k.grad, v.grad


def _check(got, want, what):
    for name, g, w in zip("qkv", got, want):
        err = (g.double() - w).abs().max().item()
        # bf16 inputs and outputs: a few units of bf16 rounding of the largest gradient
        assert err <= 2e-2 * max(1.0, w.abs().max().item()), f"{what}: d{name} off by {err}"


DENSE = [  # b, hq, hk, sq, sk, d, causal
    (1, 4, 2, 17, 100, 64, True),
    (2, 2, 1, 100, 17, 128, False),
    (1, 2, 2, 1, 33, 64, True),
    (1, 2, 1, 100, 1, 128, True),
    (1, 2, 1, 33, 17, 64, False),
]


@pytest.mark.parametrize("shape", DENSE, ids=[f"b{b}h{hq}:{hk}-q{sq}k{sk}-d{d}-{'c' if c else 'f'}"
                                              for b, hq, hk, sq, sk, d, c in DENSE])
def test_fused_dense_gradients_match_float64(shape):
    b, hq, hk, sq, sk, d, causal = shape
    assert grad.fused_dq("cpu", d, causal, max(sq, sk))
    torch.manual_seed(sq * 7 + sk)
    q = torch.randn(b, hq, sq, d, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, hk, sk, d, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, hk, sk, d, dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(b, hq, sq, d, dtype=torch.bfloat16)
    o, _ = ops.attention(q, k, v, causal=causal)
    o.backward(do)
    _check((q.grad, k.grad, v.grad), _reference(q, k, v, do, causal, 1 / math.sqrt(d)), str(shape))


@pytest.mark.parametrize("d,causal", [(64, True), (128, False)])
def test_fused_varlen_gradients_match_float64(d, causal):
    lens_q, lens_k, hq, hk = [1, 17, 100], [17, 100, 1], 4, 2
    torch.manual_seed(d + causal)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(lens_q), hq, d, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(sum(lens_k), hk, d, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(sum(lens_k), hk, d, dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(sum(lens_q), hq, d, dtype=torch.bfloat16)
    o, _ = ops.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
    o.backward(do)
    for i in range(len(lens_q)):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        dense = [t[s].transpose(0, 1)[None] for t, s in ((q, qs), (k, ks), (v, ks), (do, qs))]
        want = _reference(*dense, causal, 1 / math.sqrt(d))
        got = [t.grad[s].transpose(0, 1)[None] for t, s in ((q, qs), (k, ks), (v, ks))]
        _check(got, want, f"sequence {i} (q {lens_q[i]}, k {lens_k[i]})")


def test_fused_and_unfused_agree():
    """The two paths compute the same sums in other orders: equal to bf16 rounding."""
    torch.manual_seed(3)
    q = torch.randn(1, 4, 40, 64, dtype=torch.bfloat16)
    k, v = torch.randn(2, 1, 2, 70, 64, dtype=torch.bfloat16)
    do = torch.randn(1, 4, 40, 64, dtype=torch.bfloat16)
    o, lse = ops.attention(q, k, v, causal=True)
    outs = []
    for fused in (True, False):
        with xsync.options(attn_fused_dq=fused):
            outs.append(grad.attention_backward(do, None, q, k, v, o, lse, causal=True))
    for a, b in zip(*outs):
        assert (a.float() - b.float()).abs().max().item() <= 2e-2
