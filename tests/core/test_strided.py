"""Strided q, k, v, o and gradients (issue 37): the attention ops address the layouts models
pass without copies (kernels/flash_attn/layouts.py), copy once where the strides cannot be
addressed, and give the float64 reference's outputs and gradients either way (CPU emulator)."""
import pytest
import torch

from xsync.kernels.flash_attn import attention, attention_varlen, layouts
from tests.core.test_flash_attn_backward import assert_grad_close, reference, reference_grads

B, HQ, HK, S, D = 2, 4, 2, 40, 64


def hf_view(b, h, s, d):
    """What a Hugging Face attention layer passes: view(b, s, h, d).transpose(1, 2)."""
    return torch.randn(b, s, h * d).bfloat16().view(b, s, h, d).transpose(1, 2)


def fused(b, s, hq, hk, d):
    """q, k, v as slices of one fused projection [b, s, (hq + 2 hk) d], transposed."""
    x = torch.randn(b, s, (hq + 2 * hk) * d).bfloat16()
    q, k, v = x.split([hq * d, hk * d, hk * d], dim=-1)
    return (q.view(b, s, hq, d).transpose(1, 2), k.view(b, s, hk, d).transpose(1, 2),
            v.view(b, s, hk, d).transpose(1, 2))


def sliced_batch(b, h, s, d):
    return torch.randn(2 * b + 1, h, s, d).bfloat16()[1::2]


def seq_slice(b, h, s, d):      # a batch stride of 47 rows per 40-token sequence: one copy
    return torch.randn(b, h, s + 7, d).bfloat16()[:, :, :s]


def column_strided(b, h, s, d):  # stride(-1) != 1: one copy
    return torch.randn(b, h, d, s).bfloat16().transpose(-1, -2)


# (name, make(b, h, s, d), addressed in place)
PATTERNS = [
    ("contiguous", lambda b, h, s, d: torch.randn(b, h, s, d).bfloat16(), True),
    ("hf-transpose", hf_view, True),
    ("sliced-batch", sliced_batch, True),
    ("bshd-padded-rows", lambda b, h, s, d: torch.randn(b, s, h, d + 8).bfloat16()[..., :d].transpose(1, 2), True),
    ("seq-slice", seq_slice, False),
    ("column-strided", column_strided, False),
]


@pytest.mark.parametrize("name,make,direct", PATTERNS, ids=[p[0] for p in PATTERNS])
def test_layout_of(name, make, direct):
    """Which layouts are addressed in place: the kernels' triple reproduces every element."""
    torch.manual_seed(0)
    t = make(B, HQ, S, D)
    lay = layouts.Layout.of(t, packed=False)
    assert (lay is not None) == direct, name
    if lay is None:
        return
    v = lay.view2d(t, packed=False)
    assert v.data_ptr() == t.data_ptr()
    for b in range(B):
        for h in range(HQ):
            row = b * S * lay.cu_rows + h * lay.head_rows
            col = h * lay.head_cols
            assert torch.equal(v[row:row + S, col:col + D], t[b, h])
    o = lay.empty(t.shape, t.dtype, t.device)
    assert layouts.Layout.of(o, packed=False) == lay     # the output mirrors the input's layout


@pytest.mark.parametrize("name,make,direct", PATTERNS[1:], ids=[p[0] for p in PATTERNS[1:]])
def test_forward_backward(name, make, direct):
    """GQA causal forward and backward on each pattern (q, k and v all in it) vs float64."""
    torch.manual_seed(1)
    q, k, v = make(B, HQ, S, D), make(B, HK, S, D), make(B, HK, S, D)
    assert layouts.prepare(q, k, v, packed=False)[-1] == direct
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o, lse = attention(q, k, v, causal=True)
    ro, rlse = reference(q.detach().double(), k.detach().double(), v.detach().double(), True, D ** -0.5)
    torch.testing.assert_close(o.double(), ro, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), rlse, atol=1e-2, rtol=1e-3)
    if direct and not q.is_contiguous():
        assert o.stride() == layouts.Layout.of(q, False).empty(q.shape, q.dtype, q.device).stride()
    go = torch.randn_like(o)
    (o * go).sum().backward()
    for nm, got, want in zip("qkv", (q.grad, k.grad, v.grad), reference_grads(q, k, v, True, D ** -0.5, go)):
        assert_grad_close(f"d{nm}", got, want)


def test_fused_qkv_and_mqa_expand():
    """Slices of one fused projection (pitch (Hq + 2 Hk) D) are read in place; K and V expanded
    over the heads (stride 0: MQA as HF's expand gives it) run as one kv head, and the
    gradient reaches the unexpanded tensor."""
    torch.manual_seed(2)
    q, k, v = fused(B, S, HQ, HK, D)
    assert layouts.prepare(q, k, v, packed=False)[-1]
    o, _ = attention(q, k, v, causal=False)
    torch.testing.assert_close(o.double(), reference(q.double(), k.double(), v.double(), False, D ** -0.5)[0],
                               atol=2e-2, rtol=2e-2)
    k1 = torch.randn(B, 1, S, D).bfloat16().requires_grad_()
    v1 = torch.randn(B, 1, S, D).bfloat16().requires_grad_()
    qh = hf_view(B, HQ, S, D).requires_grad_()
    o, _ = attention(qh, k1.expand(B, HQ, S, D), v1.expand(B, HQ, S, D), causal=True)
    go = torch.randn_like(o)
    (o * go).sum().backward()
    want = reference_grads(qh, k1, v1, True, D ** -0.5, go)
    for nm, got, w in zip("qkv", (qh.grad, k1.grad, v1.grad), want):
        assert_grad_close(f"d{nm}", got, w)


def test_grad_o_layouts():
    """The gradient autograd passes may have any strides (o.sum()'s is expanded): copied into
    o's layout; a transposed-view gradient (HF's output projection) is used in place."""
    torch.manual_seed(3)
    q, k, v = (hf_view(1, 2, 24, D).requires_grad_() for _ in range(3))
    o, _ = attention(q, k, v, causal=True)
    o.sum().backward()
    want = reference_grads(q, k, v, True, D ** -0.5, torch.ones(o.shape, dtype=torch.float64))
    for nm, got, w in zip("qkv", (q.grad, k.grad, v.grad), want):
        assert_grad_close(f"d{nm}", got, w)


def test_varlen_strided():
    """Packed q, k, v as slices of a fused [total, 3, H, D] tensor: pitch 3 H D, read in place."""
    torch.manual_seed(4)
    lens = [7, 19, 12]
    cu = torch.tensor([0, 7, 26, 38], dtype=torch.int32)
    total = 38
    qkv = torch.randn(total, 3, HK, D).bfloat16().requires_grad_()
    q, k, v = qkv.unbind(1)                              # strides (3 H D, D, 1): views
    assert not q.is_contiguous() and layouts.prepare(q, k, v, packed=True)[-1]
    o, lse = attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    go = torch.randn_like(o)
    (o * go).sum().backward()
    grads = qkv.grad.unbind(1)
    for i, n in enumerate(lens):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        per = [t.detach()[sl].transpose(0, 1)[None] for t in (q, k, v)]
        ro, _ = reference(*(p.double() for p in per), True, D ** -0.5)
        torch.testing.assert_close(o[sl].transpose(0, 1)[None].double(), ro, atol=2e-2, rtol=2e-2)
        want = reference_grads(*per, True, D ** -0.5, go[sl].transpose(0, 1)[None])
        for nm, got, w in zip("qkv", grads, want):
            assert_grad_close(f"d{nm}[{i}]", got[sl].transpose(0, 1)[None], w)


def test_compile_sees_the_real_strides():
    """The fake implementation allocates O in q's layout as the real op does (torch.compile
    relies on the fake's strides)."""
    torch.manual_seed(5)
    q, k, v = (hf_view(1, 2, 16, D) for _ in range(3))
    fn = torch.compile(lambda a, b, c: attention(a, b, c, causal=True)[0], fullgraph=True, backend="aot_eager")
    got = fn(q, k, v)
    eager = attention(q, k, v, causal=True)[0]
    assert got.stride() == eager.stride()
    torch.testing.assert_close(got, eager)
