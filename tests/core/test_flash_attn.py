"""The single flash-attention source on the CPU emulator vs a float64 torch reference."""
import math

import pytest
import torch

import xsync as xs
from xsync.kernels.flash_attn import attention, attention_varlen


def reference(q, k, v, causal, scale):
    """float64 attention on [B, H, S, D]; bottom-right causal alignment; (o, lse)."""
    qf, kf, vf = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
    s = qf @ kf.transpose(-1, -2) * scale
    sq, sk = q.shape[2], k.shape[2]
    if causal:
        i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    return torch.softmax(s, -1) @ vf, torch.logsumexp(s, -1)


CASES = [  # B, Hq, Hkv, Sq, Sk, D, causal
    (1, 2, 2, 33, 33, 64, False),      # partial last block
    (2, 4, 4, 37, 37, 64, True),
    (1, 4, 2, 40, 40, 64, True),       # GQA 2:1
    (1, 4, 1, 29, 29, 128, False),     # MQA, d=128
    (2, 2, 2, 24, 53, 64, True),       # Sq < Sk, bottom-right causal
    (1, 2, 2, 70, 50, 128, False),     # Sq > Sk
]


@pytest.mark.parametrize("B,Hq,Hkv,Sq,Sk,D,causal", CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dense_matches_float64(B, Hq, Hkv, Sq, Sk, D, causal, dtype):
    torch.manual_seed(B * 1000 + Sq + Sk)
    q = torch.randn(B, Hq, Sq, D).to(dtype)
    k = torch.randn(B, Hkv, Sk, D).to(dtype)
    v = torch.randn(B, Hkv, Sk, D).to(dtype)
    o, lse = attention(q, k, v, causal=causal)
    ro, rl = reference(q, k, v, causal, 1 / math.sqrt(D))
    assert o.dtype == dtype and o.shape == q.shape and lse.shape == (B, Hq, Sq)
    torch.testing.assert_close(o.double(), ro, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), rl, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("scale", [0.3, 1e-3, 0.0, -0.3, -2.0, 1e-39, 1e-300])
def test_custom_scale(scale):
    # A positive scale takes the kernel's scaled-max path (SCALE_POSITIVE), zero, negative and
    # float32-subnormal scales (0 in the kernel: -inf * 0 would be NaN) the one that scales
    # every score first; Sq > Sk: the first causal rows see no key
    torch.manual_seed(1)
    q = torch.randn(1, 2, 40, 64).bfloat16()
    k, v = (torch.randn(1, 2, 27, 64).bfloat16() for _ in range(2))
    for causal in (False, True):
        o, lse = attention(q, k, v, causal=causal, sm_scale=scale)
        ro, rl = reference(q, k, v, causal, scale)
        seen = torch.isfinite(rl)          # rows that saw a key; the others: o = 0, lse = +inf
        assert (o[~seen] == 0).all() and (lse[~seen] == float("inf")).all()
        torch.testing.assert_close(o.double()[seen], ro[seen], atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse.double()[seen], rl[seen], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_per_sequence_reference(causal):
    torch.manual_seed(2)
    lens_q, lens_k = [5, 33, 17], [9, 33, 40]
    hq, hk, d = 4, 2, 64
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(sum(lens_q), hq, d).bfloat16()
    k = torch.randn(sum(lens_k), hk, d).bfloat16()
    v = torch.randn(sum(lens_k), hk, d).bfloat16()
    o, lse = attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
    assert o.shape == q.shape and lse.shape == (hq, sum(lens_q))
    for b in range(len(lens_q)):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ro, rl = reference(q[qs].transpose(0, 1)[None], k[ks].transpose(0, 1)[None],
                           v[ks].transpose(0, 1)[None], causal, 1 / math.sqrt(d))
        torch.testing.assert_close(o[qs].transpose(0, 1)[None].double(), ro, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse[:, qs][None].double(), rl, atol=1e-4, rtol=1e-4)


def test_registered_as_custom_op_and_compiles():
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 16, 64).bfloat16() for _ in range(3))
    assert hasattr(torch.ops.xsync, "attention")
    compiled = torch.compile(lambda a, b, c: attention(a, b, c, causal=True)[0] * 2, fullgraph=True,
                             backend="eager")
    out = compiled(q, k, v)
    ro, _ = reference(q, k, v, True, 1 / 8)
    torch.testing.assert_close(out.double(), 2 * ro, atol=4e-2, rtol=2e-2)


@pytest.mark.parametrize("bad,match", [
    (lambda q: (q[0], q, q), "expected 4 dims"),
    (lambda q: (q.float(), q.float(), q.float()), "dtype torch.float32"),
    (lambda q: (q[..., :32], q[..., :32], q[..., :32]), "head_dim"),
    (lambda q: (q, q[:, :3].contiguous(), q[:, :3].contiguous()), "not a multiple"),
    (lambda q: (torch.randn(1, 4, 8, 80).bfloat16(),) * 3, "head_dim"),     # 64, 96, 128, 256 only
    (lambda q: (q, q.half(), q), "dtypes differ"),
])
def test_input_validation(bad, match):
    q = torch.randn(1, 4, 8, 64).bfloat16()
    with pytest.raises(xs.LaunchError, match=match) as info:
        attention(*bad(q))
    assert info.value.fix
