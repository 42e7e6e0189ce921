"""ascend-sim casts round to nearest even, ties to even, as the hardware does (the interpreter
alone truncates fp32 -> bf16): fp32 values whose truncation and rounding differ, through a
simulated kernel, bit for bit against torch's ``.to``."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "core"))
import rounding_cases  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_ascend")


def test_simulated_casts_round_to_nearest_even(monkeypatch):
    monkeypatch.setenv("XSYNC_BACKEND", "ascend-sim")
    rounding_cases.check(*rounding_cases.run())
