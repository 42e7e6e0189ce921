"""The simulator's stall report says what the verifier did for the kernel it runs (issue 34):
off, or accepted bounded (checked only up to bounds, by whom) -- from the compiled kernel's own
report, never a guess."""
import pytest
import torch

import xsync
import xsync as xs
from xsync.errors import StallError

pytestmark = pytest.mark.usefixtures("triton_ascend")
EX = dict(a=xs.bfloat16, b=xs.bfloat16, out=xs.float32, BM=16, BN=16, BK=16)


def _skip_release_late(a, b, out, n, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr):
    # a counter carried across iterations decides a release: the verifier checks the loop only
    # up to its bound, and the release skipped at c == 200 lies beyond it
    mma = xs.role("mma", kind="matrix")
    vec = xs.role("vec", kind="vector")
    ring = xs.pipe(mma, vec, stages=1, c=xs.tile([BM, BN], xs.float32))
    c = 0
    for i in range(n):
        with mma:
            x = xs.mma(xs.load(a, [0, 0], [BM, BK]), xs.load(b, [0, 0], [BK, BN]))
            s = ring.acquire()
            s.c = x
            ring.commit()
        with vec:
            got = ring.wait()
            xs.store(out, [0, 0], got.c)
            if c != 200:
                ring.release()
        c = c + 1


unverified = xs.kernel(example=EX)(_skip_release_late)
accepted = xs.kernel(example=EX, accept_bounded=True)(_skip_release_late)


def _launch(kernel):
    a, b = torch.randn(16, 16).bfloat16(), torch.randn(16, 16).bfloat16()
    with pytest.raises(StallError) as info:
        kernel[(1,)](a, b, torch.zeros(16, 16), 202, BM=16, BN=16, BK=16, backend="ascend-sim")
    return info.value.fix


def test_stall_with_the_verifier_off_says_so():
    with xsync.options(verify=False):
        fix = _launch(unverified)
    assert fix.endswith("the verifier was off (XSYNC_VERIFY=0)"), fix


def test_stall_of_a_kernel_accepted_bounded_says_it_was_not_proven():
    fix = _launch(accepted)
    assert "XSYNC_VERIFY=0" not in fix and "verifier was off" not in fix, fix
    assert "checked this kernel only up to bounds" in fix and "value carried across iterations" in fix
    assert "@xs.kernel(accept_bounded=True) accepted" in fix
