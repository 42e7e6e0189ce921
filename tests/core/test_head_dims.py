"""Head dims 96 and 256 (issue 37.3) on the CPU emulator against float64 references, forward and
backward (causal and not, GQA, varlen, a strided view), the verifier's verdict of their
specializations on every backend, and the error for a head dim outside the supported set."""
import pytest
import torch

import xsync
from xsync.errors import LaunchError
from xsync.kernels.flash_attn import attention_fwd, grad, ops
from xsync.kernels.flash_attn.backward import attention_bwd_dkdv, attention_bwd_dq, attention_bwd_preprocess
from xsync.kernels.flash_attn.ops import attention, attention_varlen


def _ref(q, k, v, causal, scale):
    """float64 attention, causal bottom-right aligned, GQA by repeating kv heads ([B, H, S, D])."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq), float("-inf"))
    return torch.softmax(s, -1) @ v


def _leaves(*shapes):
    return [torch.randn(*s, dtype=torch.bfloat16).requires_grad_() for s in shapes]


def _compare(out, grads, q, k, v, go, ref_fn):
    """out and grads (of q, k, v) against ref_fn's float64 output and gradients."""
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    r = ref_fn(qd, kd, vd)
    r.backward(go.double())
    assert (out.double() - r).abs().max().item() < 2e-2
    for got, want in zip(grads, (qd.grad, kd.grad, vd.grad)):
        assert (got.double() - want).abs().max().item() < 5e-2 * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("d", [96, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_gqa_forward_backward(d, causal):
    torch.manual_seed(d + causal)
    q, k, v = _leaves((1, 4, 40, d), (1, 2, 50, d), (1, 2, 50, d))
    o, _ = attention(q, k, v, causal)
    go = torch.randn_like(o)
    o.backward(go)
    _compare(o, (q.grad, k.grad, v.grad), q, k, v, go, lambda a, b, c: _ref(a, b, c, causal, d ** -0.5))


@pytest.mark.parametrize("d", [96, 256])
def test_varlen_causal_forward_backward(d):
    """Packed sequences of different lengths: d96 runs head-major ([H, T, D]) inside, O and the
    gradients come back as packed [T, H, D]."""
    torch.manual_seed(d)
    lens_q, lens_k = [17, 30], [25, 30]
    q, k, v = _leaves((sum(lens_q), 4, d), (sum(lens_k), 2, d), (sum(lens_k), 2, d))
    cu_q = torch.tensor([0, 17, 47], dtype=torch.int32)
    cu_k = torch.tensor([0, 25, 55], dtype=torch.int32)
    o, _ = attention_varlen(q, k, v, cu_q, cu_k, 30, 30, causal=True)
    assert o.shape == q.shape and o.is_contiguous()
    go = torch.randn_like(o)
    o.backward(go)

    def ref(a, b, c):
        outs = []
        for i in range(2):
            qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
            outs.append(_ref(a[qs].transpose(0, 1)[None], b[ks].transpose(0, 1)[None],
                             c[ks].transpose(0, 1)[None], True, d ** -0.5)[0].transpose(0, 1))
        return torch.cat(outs)
    _compare(o, (q.grad, k.grad, v.grad), q, k, v, go, ref)


def test_d96_strided_view_reads_whole_heads():
    """flash-attn's [B, S, H, D] layout puts head h + 1's columns right of head h's: a 128-wide
    tile would read them, so d96 copies such a view into whole heads (the result is right)."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 24, 2, 96, dtype=torch.bfloat16) for _ in range(3))
    o = xsync.flash_attn_func(q, k, v, causal=True)
    want = _ref(*(t.transpose(1, 2).double() for t in (q, k, v)), True, 96 ** -0.5).transpose(1, 2)
    assert (o.double() - want).abs().max().item() < 2e-2


@pytest.mark.parametrize("call", [
    lambda q: attention(q, q, q),
    lambda q: xsync.sdpa(q, q, q),
    lambda q: xsync.flash_attn_func(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2)),
], ids=["attention", "sdpa", "flash_attn_func"])
def test_unsupported_head_dim_names_the_supported_ones(call):
    q = torch.randn(1, 2, 8, 80, dtype=torch.bfloat16)
    with pytest.raises(LaunchError) as e:
        call(q)
    msg = str(e.value)
    assert "head_dim 80 is not supported" in msg and "64, 96, 128, 256" in msg
    assert "fix:" in msg and "96" in msg.split("fix:")[1]


@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
@pytest.mark.parametrize("d", [96, 256])
def test_specializations_proven(backend, d):
    """Every kernel the ops launch at d96/d256 is proven on its placement (and, on Ascend, fits
    UB/L1/L0: the memory model rejects at lowering what does not)."""
    for causal in (0, 1):
        cx = {**ops.block_sizes(backend, d, bool(causal)), **ops.dim_constexprs(d), "CAUSAL": causal}
        assert attention_fwd.lower(backend, cx).report.proven
        for k in (attention_bwd_dkdv, attention_bwd_dq):
            cx = {**grad.block_sizes(backend, d, bool(causal)), **ops.dim_constexprs(d), "CAUSAL": causal}
            assert k.lower(backend, cx).report.proven
    pre = {"BM": grad.preprocess_bm(d), **ops.dim_constexprs(d)}
    assert attention_bwd_preprocess.lower(backend, pre).report.proven


def test_tile_dims():
    assert [ops.tile_dim(d) for d in ops.HEAD_DIMS] == [64, 128, 128, 256]
    assert ops.dim_constexprs(128) == {"D": 128} and ops.dim_constexprs(96) == {"D": 96, "D_PAD": 32}
