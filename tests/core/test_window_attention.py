"""Sliding-window attention in the flagship kernels (issue 37, deliverable 2): flash-attn's
``window_size=(left, right)``, bottom-right aligned, -1 unbounded, causal = right 0.

CPU emulator against a float64 reference with the mask built explicitly, forward and backward
through autograd (the fused-dQ backward the CPU schedule runs, and the unfused one), dense and
packed, GQA, Sq != Sk, d64/d128, bf16/fp16, rows that see no key; the key blocks outside the
window are never visited (NaN planted there stays out); the WINDOW specializations are proven
on every placement; bad windows are refused by name."""
import math

import pytest
import torch

import xsync
from xsync.errors import LaunchError
from xsync.kernels.flash_attn import attention_fwd, grad, ops
from xsync.kernels.flash_attn import window as win
from xsync.kernels.flash_attn.backward import attention_bwd_dkdv, attention_bwd_dq

WINDOWS = [(16, 0), (0, 16), (33, 7), (-1, 5), (5, -1), (200, 200)]


def keep_mask(sq, sk, left, right):
    """Query i sees key j iff i + sk - sq - left <= j <= i + sk - sq + right (-1: unbounded)."""
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i + sk - sq - left
    if right >= 0:
        keep &= j <= i + sk - sq + right
    return keep


def reference(q, k, v, do, left, right, scale):
    """float64 O, LSE and gradients of [B, H, S, D] attention (GQA by repeating K/V heads)."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(g, 1).transpose(-1, -2) * scale
    s = s.masked_fill(~keep_mask(s.shape[-2], s.shape[-1], left, right), float("-inf"))
    lse = torch.logsumexp(s, -1)       # -inf where a row sees no key (the kernels give +inf)
    o = torch.softmax(s, -1).nan_to_num(0) @ v.repeat_interleave(g, 1)
    o.backward(do.double())
    return o.detach(), lse.detach(), (q.grad, k.grad, v.grad)


def check(got, want, what, tol=2e-2):
    err = (got.double() - want).abs().max().item() if got.numel() else 0.0
    assert err <= tol * max(1.0, want.abs().max().item() if want.numel() else 0.0), f"{what}: off by {err}"


def check_lse(lse, want, what):
    empty = torch.isinf(want)
    assert (lse[empty] == float("inf")).all(), f"{what}: a row that sees no key has LSE {lse[empty]}"
    check(lse[~empty], want[~empty], what, 1e-3)


# window, (b, hq, hk, sq, sk), d, dtype: every window once, the shapes and types spread over them
DENSE = [((16, 0), (1, 4, 2, 70, 100), 64, torch.bfloat16),
         ((0, 16), (2, 2, 1, 100, 70), 128, torch.float16),
         ((33, 7), (1, 2, 2, 130, 97), 64, torch.float16),
         ((-1, 5), (1, 4, 1, 60, 150), 64, torch.bfloat16),
         ((5, -1), (1, 2, 1, 150, 60), 128, torch.bfloat16),
         ((200, 200), (1, 2, 1, 90, 40), 64, torch.float16)]


@pytest.mark.parametrize("window,shape,d,dtype", DENSE, ids=[f"w{w[0]}_{w[1]}" for w, *_ in DENSE])
def test_dense_window_matches_float64(window, shape, d, dtype):
    """flash_attn_func ([B, S, H, D]) with window_size, forward and backward."""
    b, hq, hk, sq, sk = shape
    torch.manual_seed(sq + sk + d)
    q = torch.randn(b, sq, hq, d, dtype=dtype, requires_grad=True)
    k = torch.randn(b, sk, hk, d, dtype=dtype, requires_grad=True)
    v = torch.randn(b, sk, hk, d, dtype=dtype, requires_grad=True)
    do = torch.randn(b, sq, hq, d, dtype=dtype)
    out, lse, _ = xsync.flash_attn_func(q, k, v, window_size=window, return_attn_probs=True)
    out.backward(do)
    ro, rlse, rgrads = reference(*(t.transpose(1, 2) for t in (q, k, v, do)), *window, d ** -0.5)
    check(out.transpose(1, 2), ro, "O")
    check_lse(lse, rlse, "LSE")
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), rgrads):
        check(got.transpose(1, 2), want, f"d{name}")


@pytest.mark.parametrize("fused", [True, False], ids=["fused-dq", "dq-kernel"])
def test_both_backward_paths(fused):
    """The fused-dQ backward (the CPU's schedule) and the dQ kernel, through ops.attention."""
    torch.manual_seed(5)
    q = torch.randn(1, 4, 90, 64, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(1, 2, 120, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn(1, 4, 90, 64, dtype=torch.bfloat16)
    with xsync.options(attn_fused_dq=fused):
        o, lse = ops.attention(q, k, v, sm_scale=0.1, window_size=(33, 7))
        o.backward(do)
    ro, rlse, rgrads = reference(q, k, v, do, 33, 7, 0.1)
    check(o, ro, "O")
    check_lse(lse, rlse, "LSE")
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), rgrads):
        check(got, want, f"d{name}")


@pytest.mark.parametrize("causal,window", [(False, (33, 7)), (True, (16, -1))], ids=["w33_7", "causal-w16"])
def test_varlen_window_matches_float64(causal, window):
    """flash_attn_varlen_func: the window per sequence (Sq < Sk, Sq > Sk, a one-token one)."""
    lens_q, lens_k, hq, hk, d = [1, 40, 100], [30, 100, 40], 4, 2, 64
    torch.manual_seed(len(window) + causal)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(lens_q), hq, d, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(sum(lens_k), hk, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn(sum(lens_q), hq, d, dtype=torch.bfloat16)
    out, lse, _ = xsync.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                               window_size=window, return_attn_probs=True)
    out.backward(do)
    left, right = window[0], 0 if causal else window[1]
    for i in range(len(lens_q)):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        dense = [t[s].transpose(0, 1)[None] for t, s in ((q, qs), (k, ks), (v, ks), (do, qs))]
        ro, rlse, rgrads = reference(*dense, left, right, d ** -0.5)
        check(out[qs].transpose(0, 1)[None], ro, f"O of sequence {i}")
        check_lse(lse[:, qs][None], rlse, f"LSE of sequence {i}")
        for name, t, s, want in zip("qkv", (q, k, v), (qs, ks, ks), rgrads):
            check(t.grad[s].transpose(0, 1)[None], want, f"d{name} of sequence {i}")


def test_rows_that_see_no_key():
    """Sq > Sk with a narrow window: the first rows' windows end before key 0 (and, with a
    window right of the diagonal only, the last rows' start past the last key). Their output is
    0, their LSE +inf, and every gradient finite."""
    torch.manual_seed(2)
    q = torch.randn(1, 2, 100, 64, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(1, 2, 30, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    for window in ((3, 0), (-1, 2)):
        q.grad = k.grad = v.grad = None
        o, lse = ops.attention(q, k, v, window_size=window)
        o.float().sum().backward()
        blind = ~keep_mask(100, 30, *window).any(1)
        assert blind.sum() >= 60, window
        assert (o[:, :, blind] == 0).all() and (lse[:, :, blind] == float("inf")).all(), window
        assert (q.grad[:, :, blind] == 0).all(), window
        assert all(torch.isfinite(g).all() for g in (q.grad, k.grad, v.grad)), window
        ro, rlse, _ = reference(q, k, v, torch.ones_like(o), *window, 64 ** -0.5)
        check(o, ro, f"O {window}")


def test_blocks_outside_the_window_are_never_visited():
    """NaN in every K and V row no query's window reaches, in the blocks before the window:
    had any kernel (forward, dK/dV, dQ) visited such a block, 0 * NaN would reach its output."""
    sq, sk, d = 16, 1024, 64
    torch.manual_seed(4)
    q = torch.randn(1, 1, sq, d, dtype=torch.bfloat16, requires_grad=True)
    k, v = torch.randn(2, 1, 1, sk, d, dtype=torch.bfloat16)
    seen_from = sk - sq - 16           # window (16, 0): keys 992..1023 are seen
    # the keys before the 256-aligned block holding the first one seen: every block of every
    # kernel (at most 256 keys, aligned) that holds one of them holds no key any query sees
    poisoned = seen_from // 256 * 256
    k[:, :, :poisoned], v[:, :, :poisoned] = float("nan"), float("nan")
    k.requires_grad_(), v.requires_grad_()
    for fused in (True, False):
        q.grad = k.grad = v.grad = None
        with xsync.options(attn_fused_dq=fused):
            o, lse = ops.attention(q, k, v, window_size=(16, 0))
            o.float().sum().backward()
        assert torch.isfinite(o).all() and torch.isfinite(lse).all()
        assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad[:, :, poisoned:]).all()
        assert (k.grad[:, :, :poisoned] == 0).all() and (v.grad[:, :, :poisoned] == 0).all()


def test_causal_window_and_the_no_window_cases():
    """causal=True sets right = 0; (-1, -1) is no window, (-1, 0) under causal the causal mask."""
    assert win.normalize((8, -1), True) == (False, (8, 0))
    assert win.normalize((-1, -1), False) == (False, None)
    assert win.normalize((-1, 0), False) == (True, None)
    assert win.normalize([-1, 7], True) == (True, None)
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 2, 40, 64, dtype=torch.bfloat16) for _ in range(3))
    a = ops.attention(q, k, v, causal=True, window_size=(8, -1))[0]
    b = ops.attention(q, k, v, window_size=(8, 0))[0]
    assert torch.equal(a, b)
    assert torch.equal(ops.attention(q, k, v, window_size=(-1, -1))[0], ops.attention(q, k, v)[0])


BAD = [(-2, 0), (0, -5), (1.5, 0), (True, 0), "ab", (1, 2, 3), 4, None]


@pytest.mark.parametrize("bad", BAD[:-1], ids=[repr(b) for b in BAD[:-1]])
def test_bad_window_is_refused_by_name(bad):
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(LaunchError) as err:
        xsync.flash_attn_func(q, q, q, window_size=bad)
    assert "window_size" in err.value.what and "window_size" in err.value.objects
    assert "-1" in err.value.fix and "(left, right)" in err.value.fix
    with pytest.raises(LaunchError, match="window_size"):
        ops.attention(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2), window_size=bad)


PLACEMENTS = [("cpu", None), ("nvidia", None), ("ascend", "release"), ("ascend", "scope")]


@pytest.mark.parametrize("backend,form", PLACEMENTS, ids=[f"{b}-{f}" if f else b for b, f in PLACEMENTS])
def test_window_kernels_are_proven_everywhere(backend, form):
    """The WINDOW specializations the ops launch (forward; dK/dV with and without the fused
    dQ; dQ) at d64 and d128: proven, not bounded."""
    opts = {"ascend_form": form} if form else {}
    for d in (64, 128):
        dims = ops.dim_constexprs(d)
        cases = [(attention_fwd, dict(ops.block_sizes(backend, d, window=True), **dims)),
                 (attention_bwd_dkdv, dict(grad.block_sizes(backend, d), **dims)),
                 (attention_bwd_dkdv, dict(grad.fused_block_sizes(backend, d), **dims)),
                 (attention_bwd_dq, dict(grad.block_sizes(backend, d), **dims))]
        for kernel, cx in cases:
            base, dtypes = kernel.specialization()
            with xsync.options(**opts):
                low = kernel.lower(backend, dict(base, **cx, CAUSAL=0, WINDOW=1), dtypes)
            assert low.report.proven, (kernel.fn.__name__, backend, form, d, low.report.summary())


def test_extents_stay_in_int32():
    assert win.extents((-1, 5), 100, 30) == (130, 5)
    assert win.extents((10 ** 12, -1), 100, 30) == (130, 130)
    assert math.isfinite(sum(win.extents((0, 0), 2 ** 30, 2 ** 30)))


def test_window_traces_under_torch_compile():
    """The window travels as two int arguments of the custom ops (forward and backward)."""
    torch.manual_seed(8)
    q, k, v = (torch.randn(1, 2, 40, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    f = torch.compile(lambda a, b, c: ops.attention(a, b, c, window_size=(5, 3))[0], fullgraph=True,
                      backend="eager")
    o = f(q, k, v)
    o.float().sum().backward()
    ro, _, rgrads = reference(q, k, v, torch.ones_like(o), 5, 3, 64 ** -0.5)
    check(o, ro, "O")
    check(q.grad, rgrads[0], "dq")
