"""Schedule passes: rewrites of the kernel's protocol IR for one placement.

A pass takes the parsed kernel, the placement and the backend's ``LowerOptions`` and returns a rewritten kernel whose
per-agent programs the verifier then checks (``Kernel.lower`` verifies what the passes
emit, not what the user wrote). Each pass states its applicability rules in dataflow terms
in its docstring and reports, for every candidate it looks at, whether it applied and why
(:class:`PassLog`); ``xsync check`` and ``xsync lower`` print the log.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from xsync.lowering import ir
from xsync.lowering.placement import Placement


@dataclass(frozen=True)
class PassNote:
    pass_name: str
    applied: bool
    where: str          # what the pass looked at ("loop at line 105 on agent 'cube'")
    why: str            # the rule that held or failed


@dataclass
class PassLog:
    notes: list[PassNote] = field(default_factory=list)

    def note(self, pass_name: str, applied: bool, where: str, why: str):
        self.notes.append(PassNote(pass_name, applied, where, why))

    def text(self) -> str:
        if not self.notes:
            return "passes: none applicable"
        return "\n".join(f"pass {n.pass_name}: {'applied' if n.applied else 'not applied'} "
                         f"to {n.where}: {n.why}" for n in self.notes)


def run(kernel: ir.KernelIR, placement: Placement, log: PassLog, options=None) -> ir.KernelIR:
    """The passes of ``placement``'s target (``Target.passes``), in order; ``options`` is the
    backend's ``LowerOptions`` (the switches the passes read; None: every pass at its
    default)."""
    for p in placement.target.passes:
        kernel = p.run(kernel, placement, log, options)
    return kernel
