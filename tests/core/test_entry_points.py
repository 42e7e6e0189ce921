"""xsync.sdpa, xsync.flash_attn_func, xsync.flash_attn_varlen_func (issue 37): the semantics of
the functions they stand in for (SDPA's top-left causal mask, flash-attn's bottom-right one and
layouts), forward and backward on the CPU emulator, and what they refuse, by name."""
import os

import pytest
import torch
import torch.nn.functional as F

import xsync
from xsync.errors import LaunchError, UnsupportedError
from tests.core.test_flash_attn_backward import assert_grad_close, reference

D = 64
HERE = os.path.abspath(__file__)


def bf(*shape):
    return torch.randn(*shape).bfloat16()


def torch_sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw)


@pytest.mark.parametrize("sq,sk,causal", [(40, 40, True), (24, 56, True), (56, 24, True), (24, 56, False)])
def test_sdpa_matches_torch(sq, sk, causal):
    """Top-left causal as torch, also for Sq != Sk; GQA with enable_gqa; a given scale."""
    torch.manual_seed(sq + sk)
    q, k, v = bf(2, 4, sq, D), bf(2, 2, sk, D), bf(2, 2, sk, D)
    got = xsync.sdpa(q, k, v, is_causal=causal, scale=0.1, enable_gqa=True)
    want = torch_sdpa(q, k, v, is_causal=causal, scale=0.1, enable_gqa=True)
    torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)


def test_sdpa_backward_more_queries_than_keys():
    """Sq > Sk causal (two launches: the square block and the rows that see every key)
    differentiates as torch's SDPA, on HF's transposed views."""
    torch.manual_seed(7)
    q, k, v = (bf(1, s, 2, D).transpose(1, 2).requires_grad_() for s in (48, 20, 20))
    out = xsync.sdpa(q, k, v, is_causal=True)
    go = torch.randn_like(out)
    (out * go).sum().backward()
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    (F.scaled_dot_product_attention(qd, kd, vd, is_causal=True) * go.double()).sum().backward()
    for nm, got, want in zip("qkv", (q.grad, k.grad, v.grad), (qd.grad, kd.grad, vd.grad)):
        assert_grad_close(f"d{nm}", got, want)


SDPA_ERRORS = [
    ("attn_mask", lambda q: xsync.sdpa(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool)), UnsupportedError),
    ("dropout_p", lambda q: xsync.sdpa(q, q, q, dropout_p=0.1), UnsupportedError),
    ("enable_gqa", lambda q: xsync.sdpa(q, q[:, :1], q[:, :1]), LaunchError),
    ("window_size", lambda q: xsync.flash_attn_func(q, q, q, window_size=(-2, 0)), LaunchError),
    ("dropout_p", lambda q: xsync.flash_attn_func(q, q, q, 0.1), UnsupportedError),
    ("softcap", lambda q: xsync.flash_attn_func(q, q, q, softcap=30.0), UnsupportedError),
    ("alibi_slopes", lambda q: xsync.flash_attn_func(q, q, q, alibi_slopes=torch.ones(2)), UnsupportedError),
    ("window_size", lambda q: xsync.flash_attn_varlen_func(q[0], q[0], q[0], torch.tensor([0, 8], dtype=torch.int32),
                                                           torch.tensor([0, 8], dtype=torch.int32), 8, 8,
                                                           window_size=(2, 2.5)), LaunchError),
]


@pytest.mark.parametrize("arg,call,cls", SDPA_ERRORS, ids=[f"{i}-{e[0]}" for i, e in enumerate(SDPA_ERRORS)])
def test_refused_by_name(arg, call, cls):
    """Never a silent fallback: the argument is named, with the caller's line and a fix."""
    with pytest.raises(cls) as err:
        call(bf(1, 2, 8, D))
    assert arg in err.value.what and err.value.fix
    assert err.value.loc is not None and err.value.loc.file == HERE, err.value


def test_flash_attn_func_bottom_right():
    """[B, S, H, D] tensors, causal aligned bottom-right (Sq < Sk: the last query sees every
    key), return_attn_probs gives (out, lse [B, H, S], None); gradients reach the inputs."""
    torch.manual_seed(8)
    q, k, v = bf(2, 24, 4, D).requires_grad_(), bf(2, 56, 2, D).requires_grad_(), bf(2, 56, 2, D).requires_grad_()
    out, lse, probs = xsync.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (2, 4, 24) and probs is None
    ro, rlse = reference(*(t.detach().transpose(1, 2).double() for t in (q, k, v)), True, D ** -0.5)
    torch.testing.assert_close(out.transpose(1, 2).double(), ro, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), rlse, atol=1e-2, rtol=1e-3)
    out.float().sum().backward()
    assert q.grad.shape == q.shape and torch.isfinite(k.grad).all() and v.grad.abs().sum() > 0


def test_flash_attn_varlen_func():
    """Packed sequences, bottom-right causal per sequence (Sq < Sk in the second)."""
    torch.manual_seed(9)
    cu_q = torch.tensor([0, 10, 18], dtype=torch.int32)
    cu_k = torch.tensor([0, 10, 40], dtype=torch.int32)
    q, k, v = bf(18, 2, D), bf(40, 2, D), bf(40, 2, D)
    out, lse, _ = xsync.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 10, 30, causal=True, return_attn_probs=True)
    assert lse.shape == (2, 18)
    for i in range(2):
        qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        ro, _ = reference(*(t.transpose(0, 1)[None].double() for t in (q[qs], k[ks], v[ks])), True, D ** -0.5)
        torch.testing.assert_close(out[qs].transpose(0, 1)[None].double(), ro, atol=2e-2, rtol=2e-2)


def test_exported_and_documented():
    from xsync.kernels.flash_attn import ops

    assert xsync.sdpa is xsync.kernels.flash_attn.entry.sdpa
    for name in ("sdpa", "flash_attn_func"):
        assert name in ops.attention.__doc__


def test_varlen_with_no_keys_at_all_gives_zeros():
    """Was: a RuntimeError from a 0-element view when k and v held no token."""
    q = torch.randn(8, 2, 64, dtype=torch.bfloat16)
    k = torch.randn(0, 2, 64, dtype=torch.bfloat16)
    cu_q, cu_k = torch.tensor([0, 3, 8], dtype=torch.int32), torch.tensor([0, 0, 0], dtype=torch.int32)
    out = xsync.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 5, 0)
    assert out.shape == q.shape and not out.any()


def test_window_size_none_is_no_window_and_the_raw_op_checks_its_window():
    q = torch.randn(1, 16, 2, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(xsync.flash_attn_func(q, q, q, window_size=None), xsync.flash_attn_func(q, q, q))
    qh = q.transpose(1, 2).contiguous()
    with pytest.raises(LaunchError, match=r"window_size=\(-5, 3\) is not a window"):
        torch.ops.xsync.attention(qh, qh, qh, False, 0.125, -5, 3)


LOWER_ERRORS = [
    ("dtype", lambda q: xsync.kernels.flash_attn.attention(q.double(), q, q)),
    ("head_dim", lambda q: torch.ops.xsync.attention(q, q, q[..., :32], False, 0.125)),
    ("heads", lambda q: xsync.flash_attn_func(q, q[:, :, :1].expand(1, 8, 3, D), q[:, :, :1].expand(1, 8, 3, D))),
    ("window", lambda q: xsync.kernels.flash_attn.attention(q, q, q, window_size=(-5, 0))),
]


@pytest.mark.parametrize("what,call", LOWER_ERRORS, ids=[e[0] for e in LOWER_ERRORS])
def test_checks_below_the_entry_points_name_the_callers_line(what, call):
    """The op's own checks (reached through the attention op, the public torch op and
    torch.ops dispatch) name the user's line, not a frame of xsync or torch."""
    with pytest.raises(LaunchError) as err:
        call(bf(1, 8, 4, D))
    assert err.value.fix
    assert err.value.loc is not None and err.value.loc.file == HERE, err.value


def test_expanded_kv_heads_that_do_not_divide_the_query_heads_are_refused():
    """K/V expanded to 3 heads beside 4 query heads is refused as torch refuses it (it ran as
    one shared kv head); an expansion to a divisor still runs as one kv head."""
    torch.manual_seed(5)
    q, k1, v1 = bf(1, 4, 8, D), bf(1, 1, 8, D), bf(1, 1, 8, D)
    with pytest.raises(LaunchError, match="4 query heads are not a multiple of 3"):
        xsync.sdpa(q, k1.expand(1, 3, 8, D), v1.expand(1, 3, 8, D), enable_gqa=True)
    got = xsync.sdpa(q, k1.expand(1, 2, 8, D), v1.expand(1, 2, 8, D), enable_gqa=True)
    torch.testing.assert_close(got.double(), torch_sdpa(q, k1.expand(1, 4, 8, D), v1.expand(1, 4, 8, D)),
                               atol=2e-2, rtol=2e-2)
