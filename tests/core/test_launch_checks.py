"""Launch arguments checked against the kernel's use of them (issue 35), on every backend
(Kernel.launch checks before the backend runs): a tensor of the wrong rank, a run-time loop step
of 0. (Ascend takes tiles of any extent: not refused.)"""
import pytest
import torch

import xsync as xs
from xsync import config
from xsync.errors import BackendError, LaunchError


@xs.kernel
def copy_tile(T, OUT, BLK: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        x = xs.load(T, [0, 0], [BLK, BLK])      # LOAD_LINE
        xs.store(OUT, [0, 0], x)


@xs.kernel
def stepped(OUT, n, s, BLK: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        acc = xs.zeros([BLK, BLK], xs.float32)
        for i in range(0, n, s):                # STEP_LINE
            acc = acc + 1.0
        xs.store(OUT, [0, 0], acc)


@xs.kernel
def odd_tile(T, OUT, BLK: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        x = xs.load(T, [0, 0], [BLK, 24])       # ODD_LINE
        xs.store(OUT, [0, 0], x)


def _line(tag: str) -> int:
    return next(i for i, text in enumerate(open(__file__).read().splitlines(), 1)
                if text.rstrip().endswith(f"# {tag}"))


def test_tensor_of_the_wrong_rank():
    with pytest.raises(LaunchError) as info:
        copy_tile[(1,)](torch.zeros(16, dtype=torch.int32), torch.zeros(16, 16, dtype=torch.int32),
                        BLK=16, backend="cpu")
    e = info.value
    assert e.loc.line == _line("LOAD_LINE") and "T" in e.objects and e.fix
    assert "1 dimension" in str(e) and "2-D" in str(e)
    out = torch.zeros(16, 16)
    copy_tile[(1,)](torch.ones(16, 16), out, BLK=16, backend="cpu")    # the right rank runs
    assert torch.equal(out, torch.ones(16, 16))


def test_zero_loop_step_at_launch():
    with pytest.raises(LaunchError) as info:
        stepped[(1,)](torch.zeros(16, 16), 4, 0, BLK=16, backend="cpu")
    e = info.value
    assert e.loc.line == _line("STEP_LINE") and "s" in e.objects and e.fix and "step" in str(e)
    out = torch.zeros(16, 16)
    stepped[(1,)](out, 4, 2, BLK=16, backend="cpu")
    assert torch.equal(out, torch.full((16, 16), 2.0))


def test_ascend_takes_non_power_of_two_tiles():
    """triton-ascend's block pointers and tl.arange take any extent (the HIVM compiler places a
    [16, 1000] tile; tests/ascend/test_non_pow2_tiles.py compiles and simulates it): not refused."""
    lowered = odd_tile.lower("ascend", constexprs=dict(BLK=16),
                             tensor_dtypes=dict(T=xs.float32, OUT=xs.float32))
    source = lowered.backend.render_source(lowered.kernel, lowered.placement, lowered.allocation,
                                           config.render_options(lowered.backend))
    assert "block_shape=(BLK, 24)" in str(source) or "(16, 24)" in str(source)
