"""Role kinds and a hand-off dtype chosen by constexprs run on the simulated Ascend cores
(the generated code never names the string constexprs)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "core"))
import constexpr_kernels as ck  # noqa: E402
import xsync as xs  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_ascend")


@pytest.fixture(autouse=True)
def on_simulator(monkeypatch):
    monkeypatch.setenv("XSYNC_BACKEND", "ascend-sim")


def test_role_kind_by_constexpr():
    x, y = torch.randn(48, 16), torch.zeros(48, 16)
    ck.kind_by_constexpr[(1,)](x, y, 3, BLOCK=16, KIND="vector")
    assert torch.equal(y, x * 2)


@pytest.mark.parametrize("dt", [xs.bfloat16, xs.float16])
def test_kinds_and_dtype_of_a_pipeline(dt):
    torch.manual_seed(0)
    a, b, out = torch.randn(16, 32).bfloat16(), torch.randn(32, 16).bfloat16(), torch.zeros(16, 16)
    ck.kinds_of_a_pipeline[(1,)](a, b, out, 32, BM=16, BN=16, BK=16, LOAD_KIND="copy",
                                 MMA_KIND="matrix", EPI_KIND="vector", DT=dt)
    narrow = torch.bfloat16 if dt is xs.bfloat16 else torch.float16
    ref = (a.float() @ b.float()).to(narrow).float()   # rounded to nearest even, as the cores do
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
