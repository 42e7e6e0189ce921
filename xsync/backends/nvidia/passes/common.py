"""What the Hopper schedule passes share: the agents they rewrite (one program each), the
options that switch them, and where a rewritten program goes."""
from __future__ import annotations

import dataclasses

from xsync.lowering import ir
from xsync.lowering.placement import Placement, Unit
from xsync.lowering.slicing import agent_body


def consumers(placement: Placement):
    """The consumer-warpgroup agents (the schedule passes rewrite their programs)."""
    return [a for a in placement.agents if a.unit == Unit.CONSUMER]


def program(kernel: ir.KernelIR, agent) -> tuple:
    """The statements ``agent`` runs now (a previous pass's program, or its slice)."""
    return agent_body(kernel, agent)


def with_program(kernel: ir.KernelIR, agent, body: tuple) -> ir.KernelIR:
    """``kernel`` where ``agent`` runs ``body``."""
    progs = [p for p in kernel.programs if p.agent != agent.name]
    progs.append(ir.AgentProgram(agent.name, tuple(body)))
    order = {a: i for i, a in enumerate(p.agent for p in kernel.programs)}
    progs.sort(key=lambda p: order.get(p.agent, len(order)))
    return dataclasses.replace(kernel, programs=tuple(progs))


def enabled(options, option: str) -> bool:
    """A boolean pass switch (``LowerOptions.fuse_mma`` ...): on unless set to off."""
    v = getattr(options, option) if options is not None else None
    return True if v is None else bool(v)


def where(kernel: ir.KernelIR, agent, s) -> str:
    line = getattr(getattr(s, "loc", None), "line", kernel.loc.line)
    what = "loop" if isinstance(s, ir.For) else "mma" if isinstance(s, ir.Assign) else "statement"
    return f"{what} at line {line} on agent '{agent.name}'"
