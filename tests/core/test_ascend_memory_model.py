"""The Ascend on-chip memory model (xsync.backends.ascend.memory) on kernel text, no toolchain:
the sizes it books for an RMSNorm row kernel and that check() raises at the kernel's line."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ascend"))

import memory_cases as mc  # noqa: E402

from xsync.backends.ascend import memory  # noqa: E402
from xsync.errors import AllocationError  # noqa: E402


def lowered(kernel, **cx):
    c, dt = kernel.specialization()
    c.update(cx)
    return kernel.lower("ascend", c, dt)


def test_rmsnorm_need_grows_with_the_row(monkeypatch):
    small = memory.plan(lowered(mc.rmsnorm, BN=1024).kernel, lowered(mc.rmsnorm, BN=1024).placement)
    (ub,) = small.cores
    assert ub.memory == memory.Memory.UB and ub.capacity == 192 * 1024
    # t, t*t, the reduction's half-tile work buffer, the weight row, the row sums (16 x f32
    # each: the row sums and their [:, None] view, which + eps reuses), the compiler's scratch
    assert ub.need == 2 * 65536 + 32768 + 4096 + 2 * 64 + memory.SCRATCH and ub.fits
    assert ub.need >= 168544                         # the HIVM compiler's plan-memory peak
    with pytest.raises(AllocationError):             # lowering refuses it
        lowered(mc.rmsnorm, BM=16, BN=4096)
    monkeypatch.setattr(memory, "ENFORCE", False)
    lw = lowered(mc.rmsnorm, BM=16, BN=4096)
    monkeypatch.setattr(memory, "ENFORCE", True)
    (big,) = memory.plan(lw.kernel, lw.placement).cores
    assert not big.fits and big.need >= 655424       # the HIVM compiler: 655424 B
    with pytest.raises(AllocationError) as err:
        memory.check(lw.kernel, lw.placement)
    text = str(err.value)
    assert "memory_cases.py:" in text and "vector core" in text and "196608 B" in text
    assert "BN" in text and "t 262144 B" in text


def test_allocation_records_the_plan():
    lw = lowered(mc.chain, BN=512)
    assert lw.allocation.memory is not None
    assert lw.allocation.memory.need(memory.Memory.UB) >= 165920     # the compiler's peak
