"""Verifier entry points (the verifier itself is ``xsync.lowering.verifier``; its argument is
in the docstring of ``xsync.lowering.verifier.check`` and in docs/verifier.md)."""
from __future__ import annotations

from xsync.lowering.verifier.check import VerifyReport, loop_bounds, verify
from xsync.lowering.verifier.counterexample import Counterexample, CounterexampleStep, StuckLane

__all__ = ["Counterexample", "CounterexampleStep", "StuckLane", "VerifyReport", "loop_bounds", "verify"]
