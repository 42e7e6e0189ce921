"""The attention ops at torch's edges (issue 35, deliverable 5; docs/torch_ops.md): torch.func
transforms and double backward are refused by name (jvp returned zero tangents), scales that
are not finite in float32 are refused like inf, NaN propagation follows the documented rule,
and torch.compile(dynamic=True) traces varlen."""
import pytest
import torch

from xsync.errors import LaunchError, UnsupportedError
from xsync.kernels.flash_attn import attention, attention_varlen, ops

D = 64


def qkv(s=16, seed=0):
    torch.manual_seed(seed)
    return [torch.randn(1, 2, s, D).bfloat16() for _ in range(3)]


def test_jvp_is_refused_instead_of_zero_tangents():
    q, k, v = qkv()
    with pytest.raises(UnsupportedError) as info:
        torch.func.jvp(lambda x: attention(x, k, v)[0], (q,), (torch.ones_like(q),))
    err = info.value
    assert isinstance(err, NotImplementedError)
    assert "torch.func.jvp" in str(err) and "reverse-mode autograd" in err.fix


@pytest.mark.parametrize("transform,name", [
    (lambda f, q: torch.func.grad(lambda x: f(x).float().sum())(q), "torch.func.grad"),
    (lambda f, q: torch.func.vmap(f)(q.unsqueeze(0)), "torch.func.vmap"),
    (lambda f, q: torch.func.vjp(f, q), "torch.func.grad (or vjp/jacrev)"),
], ids=["grad", "vmap", "vjp"])
def test_func_transforms_are_refused_by_name(transform, name):
    q, k, v = qkv()
    with pytest.raises(UnsupportedError) as info:
        transform(lambda x: attention(x, k, v)[0], q)
    assert name in str(info.value) and info.value.fix


def test_varlen_refuses_transforms_too():
    q = torch.randn(32, 2, D).bfloat16()
    cu = torch.tensor([0, 16, 32], dtype=torch.int32)
    with pytest.raises(UnsupportedError, match="torch.func.vmap"):
        torch.func.vmap(lambda x: attention_varlen(x, x, x, cu, cu, 16, 16)[0])(q.unsqueeze(0))


def test_forward_mode_dual_tensors_are_refused():
    import torch.autograd.forward_ad as fwAD

    q, k, v = qkv()
    with fwAD.dual_level(), pytest.raises(UnsupportedError, match="forward-mode AD"):
        attention(fwAD.make_dual(q, torch.ones_like(q)), k, v)


def test_a_transform_over_other_inputs_still_runs():
    """Only inputs the transform wraps are refused: the op inside torch.func.grad of another
    variable runs as usual."""
    q, k, v = qkv()
    o_ref, _ = attention(q, k, v)
    got = torch.func.grad(lambda w: (w * attention(q, k, v)[0].float()).sum())(torch.ones(()))
    torch.testing.assert_close(got, o_ref.float().sum())


def test_double_backward_is_refused_and_first_order_is_right():
    q, k, v = qkv()
    leaf = q.clone().requires_grad_()
    g, = torch.autograd.grad(attention(leaf, k, v)[0].float().sum(), leaf, create_graph=True)
    plain = q.clone().requires_grad_()
    ref, = torch.autograd.grad(attention(plain, k, v)[0].float().sum(), plain)
    torch.testing.assert_close(g, ref)
    with pytest.raises(UnsupportedError) as info:
        torch.autograd.grad(g.float().sum(), leaf)
    assert "double backward" in str(info.value) and "create_graph=False" in info.value.fix


@pytest.mark.parametrize("scale", [1e300, -1e300, 3e38, float("inf"), float("nan")])
def test_scales_not_finite_in_float32_are_refused(scale):
    q, k, v = qkv()
    with pytest.raises(LaunchError) as info:
        attention(q, k, v, sm_scale=scale)
    assert "not finite" in str(info.value) and "sm_scale" in info.value.fix or "scale" in info.value.fix


def test_scales_finite_in_float32_still_run():
    q, k, v = qkv()
    for scale in (1e-300, 1e30, -0.5):
        o, _ = attention(q, k, v, sm_scale=scale)
        assert torch.isfinite(o).all(), scale


def test_refused_scales_under_compile_too():
    q, k, v = qkv()
    f = torch.compile(lambda a, b, c: attention(a, b, c, sm_scale=1e300)[0], backend="eager", fullgraph=True)
    with pytest.raises(Exception) as info:     # dynamo wraps the fake op's error
        f(q, k, v)
    assert "not finite in float32" in str(info.value)


@pytest.mark.parametrize("j", [5, 100, 200, 255])
def test_nan_in_v_follows_the_documented_rule(j):
    """docs/torch_ops.md: a NaN in v at key j, column c reaches column c only; rows that see j
    are NaN (as in SDPA); causal rows that cannot see j are NaN exactly when their row tile
    reaches j's key block."""
    s, c = 256, 3
    q, k, v = (t[:, :1] for t in qkv(s, seed=j))
    v = v.clone()
    v[0, 0, j, c] = float("nan")
    o, lse = attention(q, k, v, causal=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    nan_rows = o[0, 0].isnan().any(-1)
    assert o[0, 0].isnan().any(0).nonzero().flatten().tolist() == [c]
    assert sdpa[0, 0].isnan().any(0).nonzero().flatten().tolist() == [c]
    assert torch.isfinite(lse).all()
    sees = torch.arange(s) >= j
    assert nan_rows[sees].all() and sdpa[0, 0, sees].isnan().any(-1).all()   # where SDPA defines it
    plan = ops.launched_schedule("cpu", D, True, s, q.dtype)
    tr, bn = plan.tile_rows, plan.BN
    rule = torch.tensor([j // bn <= (min((i // tr + 1) * tr, s) - 1) // bn for i in range(s)])
    assert torch.equal(nan_rows, rule)


def test_compile_dynamic_over_varlen():
    """Was: "max_seqlen_q=s68 is not a length" from the fake op (a SymInt)."""
    q = torch.randn(48, 2, D).bfloat16()
    cu = torch.tensor([0, 16, 48], dtype=torch.int32)

    def f(x, cu, m):
        return attention_varlen(x, x, x, cu, cu, m, m)[0]

    compiled = torch.compile(f, dynamic=True, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, cu, 32), f(q, cu, 32))
    q2 = torch.randn(40, 2, D).bfloat16()
    cu2 = torch.tensor([0, 24, 40], dtype=torch.int32)
    torch.testing.assert_close(compiled(q2, cu2, 24), f(q2, cu2, 24))
