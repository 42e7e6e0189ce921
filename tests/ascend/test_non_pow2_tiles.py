"""Tiles of any extent on Ascend: triton-ascend's block pointers and ``tl.arange`` take a
[8, 1000] tile, the HIVM compiler places it (reaches hivmc), and ascend-sim computes it; so
lowering does not refuse them (Hopper does: Gluon layouts need powers of two)."""
import pytest
import torch

import xsync as xs


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BM=8, BN=1000))
def masked_row(x, y, M, N, BM: xs.constexpr, BN: xs.constexpr):
    vec = xs.role("vec", kind="vector")
    with vec:
        row = xs.program_id(0) * BM
        t = xs.load(x, [row, 0], [BM, BN])
        cols = xs.arange(0, BN)
        t = xs.where(cols[None, :] < N - 1, t, 0.0)      # the last column dropped
        xs.store(y, [row, 0], t * 2.0)


@pytest.mark.parametrize("bn", [1000, 100, 24])
def test_hivm_compiles_non_power_of_two_tiles(bn, triton_ascend):
    from xsync.backends.ascend import hivm
    if hivm.compiler_path() is None:
        pytest.fail("bishengir-compile is missing: the ascend environment installs ascendnpu-ir")
    cx, dtypes = masked_row.specialization()
    cx.update(BN=bn)
    result = hivm.compile_lowered(masked_row.lower("ascend", cx, dtypes), timeout=300)
    assert result.reached_hivmc, result.describe()


def test_simulated_non_power_of_two_tiles(triton_ascend):
    x = torch.randn(20, 1000)
    y = torch.full((20, 1000), float("nan"))
    masked_row[(3,)](x, y, 20, 1000, BM=8, BN=1000, backend="ascend-sim")
    want = x * 2.0
    want[:, -1] = 0.0
    torch.testing.assert_close(y, want)
