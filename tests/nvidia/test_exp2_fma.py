"""A share of an accumulator tile's exp2 on the FMA pipe (xsync/backends/nvidia/exp2.py, option
exp2_fma): the method's error in float32 over the softmax's range, where the renderer spells it,
and in the sm_90a SASS that MUFU.EX2 drops by the share with no shared-memory round trip and no
spill (no GPU needed). The helper functions as spelled also run
through Triton's interpreter here. tests/nvidia/test_gpu.py runs attention with it on the H200."""
import re

import numpy as np
import pytest

import xsync as xs
from xsync.backends.nvidia import compile_ptx, exp2, render_source
from xsync.kernels.flash_attn import attention_fwd, ops, schedule


def poly_exp2(x: np.ndarray) -> np.ndarray:
    """exp2.py's method step by step in float32 (an FMA: the exact product and sum, rounded once)."""
    def fma(a, b, c):
        return (a.astype(np.float64) * np.float64(np.float32(b)) + np.float64(np.float32(c))).astype(np.float32)

    x = x.astype(np.float32)
    magic = np.float32(exp2.MAGIC)
    with np.errstate(invalid="ignore", over="ignore"):
        t = x + magic
        f = x - (t - magic)
        p = fma(fma(fma(f, exp2.C3, exp2.C2), f, exp2.C1), f, 1.0)
        bits = p.view(np.int32) + (t.view(np.int32) << np.int32(23))
    return np.where(x < np.float32(exp2.UNDERFLOW), np.float32(0.0), bits.view(np.float32))


def test_method_error_over_the_softmax_range():
    x = np.concatenate([np.linspace(-125, 0, 2_000_001), -np.logspace(-8, 0, 1000), [0.0, 0.25, 0.5]])
    got = poly_exp2(x).astype(np.float64)
    rel = np.abs(got / np.exp2(x.astype(np.float32).astype(np.float64)) - 1)
    assert rel.max() < 1.1e-4, rel.max()          # bf16 P keeps 8 bits: its half-ulp is 3.9e-3
    edge = poly_exp2(np.array([-np.inf, -125.5, -200.0, np.nan], dtype=np.float32))
    assert edge[0] == 0 and edge[1] == 0 and edge[2] == 0 and np.isnan(edge[3])
    # continuous and increasing where the rounding of x switches n (x = k + 0.5)
    switch = np.arange(-20, 1) + 0.5
    below, above = poly_exp2(switch - 1e-4), poly_exp2(switch + 1e-4)
    assert np.all(above > below) and np.all(above / below - 1 < 4e-4)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # -inf - -inf: masked
@pytest.mark.parametrize("share,rows", [("1/4", range(8, 16)), ("1/2", range(16))])
def test_the_spelled_helper_places_every_element(share, rows, tmp_path, monkeypatch):
    """The helper functions as the renderer spells them, run by Triton's interpreter on the CPU
    (Gluon has none: gl -> tl, the layout conversions dropped, which only move values between
    registers): every element of a [64, 128] tile comes back where it was, within the method's
    error; the polynomial took the odd columns of the row slots the share names, the unit the rest."""
    import importlib.util

    import torch

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    helpers = re.sub(r"gl\.convert_layout\((.*), (LAYOUT|even\.type\.layout)\)", r"\1",
                     "\n".join(exp2.helper_lines(share)))
    source = "import triton\nimport triton.language as tl\n\n" + helpers.replace("@gluon.jit", "@triton.jit").replace(
        "gl.", "tl.") + f"""


@triton.jit
def probe(x_ptr, y_ptr):
    offsets = tl.arange(0, 64)[:, None] * 128 + tl.arange(0, 128)[None, :]
    tl.store(y_ptr + offsets, {exp2.SHARES[share]}(tl.load(x_ptr + offsets), 0))
"""
    path = tmp_path / "exp2_probe.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("exp2_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    x = -torch.rand(64, 128) * 100
    x[0, :5] = float("-inf")
    x[1, 3] = float("nan")
    y = torch.empty_like(x)
    module.probe[(1,)](x, y)
    seen = torch.isfinite(x)
    err = ((y.double() - torch.exp2(x.double())).abs() / torch.exp2(x.double()))[seen]
    assert err.max() < 1.1e-4 and (y[0, :5] == 0).all() and torch.isnan(y[1, 3])
    poly = torch.zeros_like(x, dtype=torch.bool)
    poly[seen] = err > 2e-6              # the unit's exp2 is exact to a few ulps; the polynomial is not
    r, c = poly.nonzero(as_tuple=True)
    assert (c % 2 == 1).all() and set((r % 16).tolist()) == set(rows)


def _forward(d, causal, length=1024):
    plan = schedule.lookup("nvidia", d, bool(causal), length)
    cx, dtypes = attention_fwd.specialization()
    cx.update(plan.forward_constexprs(), D=d, CAUSAL=causal, **ops.scale_constexprs(None))
    return cx, dtypes


@pytest.mark.parametrize("share,helper", [("1/4", "xs_exp2_quarter_fma"), ("1/2", "xs_exp2_half_fma")])
def test_only_the_score_tile_takes_it(share, helper):
    cx, dtypes = _forward(64, 1)
    lowered = attention_fwd.lower("nvidia", cx, dtypes)
    args = (lowered.kernel, lowered.placement, lowered.allocation)
    base = render_source(*args)
    assert base == render_source(*args, {"exp2_fma": "0"}) and "xs_exp2" not in base
    with xs.options(nv_exp2_fma=share):
        source = render_source(*args)
    consumer = source[source.index("def attention_fwd_consumer("):]
    # P = exp2(S - m): [64, 128] in the accumulator layout; alpha = exp2(m_old - m_new) stays
    assert len(re.findall(rf"p = {helper}\(x[^\n]*, ACC_N128\)", consumer)) == 4
    assert re.search(r"alpha = gl\.exp2\(", consumer)
    assert source.count("def xs_exp2_poly(") == 1 and source.count(f"def {helper}(") == 1
    other = set(exp2.SHARES.values()) - {helper}
    assert not any(f"def {name}(" in source for name in other)


@pytest.mark.parametrize("d,causal,length", [(64, 1, 1024), (64, 0, 4096), (128, 0, 4096)])
def test_mufu_drops_by_the_share_in_registers(d, causal, length):
    """Per share: the SASS's MUFU.EX2 fall by that share of P's exponentials (half takes twice
    what a quarter takes), the splits add no shared-memory traffic or barrier (they stay in
    each thread's registers), and a kernel that does not spill without it does not with it
    (Triton 3.9 spills the three-warpgroup d64 row anyway, 96 B a thread, 136 with half the
    exponentials on the FMA pipe; the ops launch the row's fallback then)."""
    from tests.nvidia.test_compile import _cuobjdump, _stack_bytes

    cx, dtypes = _forward(d, causal, length)
    counts, stack = {}, {}
    for share in ("0", "1/4", "1/2"):
        r = compile_ptx(attention_fwd.lower("nvidia", cx, dtypes), scalar_types={"sm_scale": "fp32"},
                        options={"exp2_fma": share})
        sass = _cuobjdump(r.cubin, "-sass")
        if sass is None:
            pytest.skip("this triton ships no cuobjdump")
        counts[share] = (len(re.findall(r"MUFU\.EX2", sass)), r.ptx.count("st.shared"),
                         len(re.findall(r"\bbar\.sync|barrier\.sync", r.ptx)))
        stack[share] = _stack_bytes(r.cubin) or 0
    if not stack["0"]:      # a kernel that spills anyway is replaced by its row's fallback (ops)
        assert not stack["1/4"] and not stack["1/2"], stack
    (base, st0, bar0), (quarter, st4, bar4), (half, st2, bar2) = counts["0"], counts["1/4"], counts["1/2"]
    assert base > quarter > half and base - half == 2 * (base - quarter), counts
    assert st0 == st4 == st2 and bar0 == bar4 == bar2, counts
