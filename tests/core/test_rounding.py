"""The CPU emulator's casts (a store into a narrower tensor, ``.to``) round to nearest even,
bit for bit as torch's ``.to``: the same cases as the ascend-sim test."""
import rounding_cases


def test_emulated_casts_round_to_nearest_even(monkeypatch):
    monkeypatch.setenv("XSYNC_BACKEND", "cpu")
    rounding_cases.check(*rounding_cases.run())


def test_the_cases_catch_truncation():
    """Truncating fp32 -> bf16 (dropping the low 16 bits) fails the check."""
    import pytest
    import torch
    x = rounding_cases.inputs()
    truncated = (x.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    with pytest.raises(AssertionError, match="values differ"):
        rounding_cases.assert_same_bits(truncated, x.to(torch.bfloat16))
