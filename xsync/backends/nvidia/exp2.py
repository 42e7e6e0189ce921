"""Part of a tile's ``xs.exp2`` on the FMA pipe instead of the special-function unit (MUFU).

An SM computes 16 ``MUFU.EX2`` a clock against 128 fp32 FMAs (FA3's "989 TFLOPS of matmul but
3.9 of special functions"): a softmax block of 64 x 128 scores is 64 MUFU instructions per warp,
512 clocks of its SM sub-partition's unit, while its other arithmetic (scale, max, sum, cast,
rescale) is about 200 FMA-pipe instructions. With option ``exp2_fma`` (XSYNC_NV_EXP2_FMA=1/4 or
1/2, as FA4 does on Blackwell) a share of the exponentials is computed by a polynomial on the
FMA pipe, so both pipes carry part of the softmax:

    2^x = 2^n * 2^f,   n = round(x) by the magic-number add (x + 1.5 * 2^23: the rounded
                       integer lands in the low mantissa bits), f = x - n in [-0.5, 0.5]
    2^f ~ 1 + f * (C1 + f * (C2 + f * C3))     three FMAs (Horner); relative error <= 1.1e-4
                                                over [-126, 0], below bf16's 3.9e-3 half-ulp
    result bits = bits(2^f) + (bits(x + magic) << 23)   (n added to the exponent field)
    x < -125 (and -inf, a masked score) -> exactly 0, so a row without keys keeps l = 0;
    NaN stays NaN (its bits pass through).

Which elements: the tile is reshaped so that a split is register-local in the wgmma accumulator
layout (each thread holds column pairs 2j, 2j + 1 and rows r, r + 8 of each 16-row slab):
``1/2`` computes the odd columns by the polynomial; ``1/4`` the odd columns of rows r + 8.
Only 2-D fp32 tiles in an accumulator layout (``ACC_N<c>``) with rows a multiple of 16 take
it (the attention's P = exp2(S - m)); every other ``xs.exp2`` stays ``gl.exp2``.

A schedule row may fix the share for its attention forwards (``Schedule.exp2_fma``). Off by
default until the H200 A/B (benchmarks/flash_attn_ab.py candidates ``exp2_quarter``,
``exp2_half``) shows where it pays; tests/nvidia/test_exp2_fma.py checks the method's error in
float32, the spelling, and in SASS that MUFU.EX2 drops by the share with no shared-memory
round trip.
"""
from __future__ import annotations

from xsync.backends.nvidia.layouts import T, ValueKind

MAGIC = 12582912.0            # 1.5 * 2**23: x + MAGIC rounds x to an integer in the low bits
# 2^f ~ 1 + f * (C1 + f * (C2 + f * C3)) on [-0.5, 0.5], relative error 1.01e-4 (a minimax
# fit by iteratively reweighted least squares with p(0) = 1)
C1, C2, C3 = 0.69328293, 0.24221097, 0.05500893
UNDERFLOW = -125.0            # below: 0 (2^-125 is 2.4e-38; the exponent add would wrap)

SHARES = {"1/4": "xs_exp2_quarter_fma", "1/2": "xs_exp2_half_fma"}


def applies(t: T) -> bool:
    """A 2-D fp32 tile in a wgmma accumulator layout whose splits stay in registers."""
    return (t.kind is ValueKind.TILE and len(t.shape) == 2 and t.dtype is not None and t.dtype.name == "float32"
            and bool(t.layout) and t.layout.startswith("ACC_N") and t.shape[0] % 16 == 0 and t.shape[1] % 8 == 0)


def helper_lines(share: str) -> list[str]:
    """The module's helper functions for ``share`` (one of SHARES)."""
    poly = [
        "@gluon.jit",
        "def xs_exp2_poly(x):",
        f'    """2^x on the FMA pipe: n = round(x) (magic add), 2^(x - n) by three FMAs, n into the '
        f'exponent bits; 0 below {UNDERFLOW:g} (-inf: a masked score)."""',
        f"    t = x + {MAGIC!r}",
        f"    f = x - (t - {MAGIC!r})",
        f"    p = gl.fma(gl.fma(gl.fma(f, {C3!r}, {C2!r}), f, {C1!r}), f, 1.0)",
        "    bits = p.to(gl.int32, bitcast=True) + (t.to(gl.int32, bitcast=True) << 23)",
        f"    return gl.where(x < {UNDERFLOW!r}, 0.0, bits.to(gl.float32, bitcast=True))",
        "",
        "",
        "@gluon.jit",
    ]
    if share == "1/2":
        return poly + [
            "def xs_exp2_half_fma(x, LAYOUT: gl.constexpr):",
            '    """2^x of a [M, N] accumulator tile: even columns by MUFU, odd ones by xs_exp2_poly."""',
            "    M: gl.constexpr = x.shape[0]",
            "    N: gl.constexpr = x.shape[1]",
            "    even, odd = gl.split(gl.reshape(x, [M, N // 2, 2]))",
            "    y = gl.join(gl.exp2(even), xs_exp2_poly(odd))",
            "    return gl.convert_layout(gl.reshape(y, [M, N]), LAYOUT)",
        ]
    return poly + [
        "def xs_exp2_quarter_fma(x, LAYOUT: gl.constexpr):",
        '    """2^x of a [M, N] accumulator tile: the odd columns of rows r + 8 of each 16-row slab '
        'by xs_exp2_poly, the rest by MUFU."""',
        "    M: gl.constexpr = x.shape[0]",
        "    N: gl.constexpr = x.shape[1]",
        "    even, odd = gl.split(gl.reshape(x, [M, N // 2, 2]))",
        "    low, high = gl.split(gl.permute(gl.reshape(odd, [M // 16, 2, 8, N // 2]), (0, 2, 3, 1)))",
        "    odd = gl.reshape(gl.permute(gl.join(gl.exp2(low), xs_exp2_poly(high)), (0, 3, 1, 2)), [M, N // 2])",
        "    y = gl.join(gl.exp2(even), gl.convert_layout(odd, even.type.layout))",
        "    return gl.convert_layout(gl.reshape(y, [M, N]), LAYOUT)",
    ]
