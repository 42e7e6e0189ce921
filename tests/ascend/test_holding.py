"""Holding two slots and interleaved rings on Ascend (tests/core/holding_kernels.py): the real
triton-ascend frontend and HIVM compiler (to hivmc) take the cube -> vector kernels with
exactly xsync's flags, and the ascend-sim runs them against torch. ``held_scores``: the vector
core waits twice on the FULL flag before its first EMPTY set; ``interleaved_scores``: the two
vector cores' slots alternate in one GM ring."""
import re

import pytest
import torch

from tests.core import holding_kernels as H
from xsync.backends.ascend import hivm

pytestmark = pytest.mark.usefixtures("triton_ascend")


@pytest.fixture(scope="module")
def compiler(triton_ascend):
    if hivm.compiler_path() is None:
        pytest.fail("bishengir-compile is missing: the ascend environment installs ascendnpu-ir")


def _scores(x, j):
    t = x[j * 16:(j + 1) * 16].double()
    return (t @ t).float()


@pytest.mark.parametrize("kernel", [H.held_scores, H.interleaved_scores], ids=lambda k: k.__name__)
def test_reaches_hivmc_with_xsyncs_flags(compiler, kernel):
    lowered = kernel.lower("ascend")
    r = hivm.compile_lowered(lowered, timeout=300)
    assert r.reached_hivmc, r.log[-2000:]
    flags = dict(lowered.allocation.event_ids)
    seen = {int(m) for m in re.findall(r"sync_block_(?:set|wait)\[[^\]]*\] flag = (\d+)", r.after_split)}
    assert seen == {flags["ring:full"], flags["ring:empty"]}, (seen, flags)


def test_held_scores_on_the_simulator():
    torch.manual_seed(0)
    n = 3
    x = torch.randn(2 * n * 16, 16)
    y = torch.zeros_like(x)
    H.held_scores[(2,)](x, y, n, BLOCK=16, STAGES=2, backend="ascend-sim")
    s = [_scores(x, j) for j in range(2 * n)]
    ref = torch.cat([t for i in range(n) for t in (s[2 * i] + s[2 * i + 1], s[2 * i + 1])])
    torch.testing.assert_close(y, ref, atol=1e-4, rtol=1e-4)


def test_interleaved_scores_on_the_simulator():
    torch.manual_seed(1)
    n = 3
    x = torch.randn(2 * n * 16, 16)
    y = torch.zeros_like(x)
    H.interleaved_scores[(1,)](x, y, n, BLOCK=16, STAGES=4, backend="ascend-sim")
    torch.testing.assert_close(y, torch.cat([_scores(x, j) * 0.5 for j in range(2 * n)]), atol=1e-4, rtol=1e-4)


def test_sliding_sums_on_the_simulator():
    """Vector-only: load and work on one vector core, the ring in GM in program order; the held
    slot is carried from one step to the next."""
    torch.manual_seed(2)
    n = 3
    x = torch.randn((2 * n + 1) * 16, 16)
    y = torch.zeros(2 * n * 16, 16)
    H.sliding_sums[(2,)](x, y, n, BLOCK=16, STAGES=2, backend="ascend-sim")
    torch.testing.assert_close(y, H.sliding_sums_ref(x, n, 16))
