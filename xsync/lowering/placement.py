"""Placement: which agent (thread / warp-specialized partition / core) runs each role, and
the target facts of the hardware that runs them.

Each backend places roles onto its hardware agents (``xsync.backends.<b>.placement``) and
states, in a :class:`Target`, what its sync primitives can count: the verifier asks the
target ("how far may a signaller run ahead of its waiter?") instead of branching on the
backend's name. Roles placed on one agent run in source order inside it; a pipe between two
roles of one agent carries its payload in registers (one value at a time) and needs no
cross-agent synchronization.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from xsync.lowering import ir

BACKENDS = ("cpu", "nvidia", "ascend")


@dataclass(frozen=True)
class Agent:
    name: str
    roles: tuple[str, ...]
    replicas: int
    hardware: str  # what runs it, in the backend's words ("consumer warpgroup", "cube core")
    serial: tuple[str, ...] = ()  # roles whose replicas this single agent runs one by one
    unit: str = ""  # the kind of hardware agent: producer / consumer, cube / vector, thread


@dataclass(frozen=True)
class Limit:
    """How far one counter may lead another before the hardware mixes them up.

    ``lead`` is the largest lead that is still told apart (a lead of ``lead + 1`` is the
    bug); ``kind`` names the bug in messages ("phase aliasing"); ``error`` is the
    xsync.errors class raised; ``why`` says what the hardware does, in one phrase.
    """

    lead: int
    kind: str
    error: type
    why: str
    unit: str = "signals"     # what is pending, in messages ("sets" on an Ascend flag)


@dataclass(frozen=True)
class Target:
    """What the backend's sync primitives are, as the verifier needs to know them.

    event: what an xs.event becomes ("an mbarrier", "a cross-core flag").
    event_limit: pending signals of one event for one waiter (None: an unbounded counter).
    barrier_limit: meetings one barrier member may be ahead of another (named barriers
        count arrivals per meeting; None: the barrier cannot run ahead).
    gather_limit: signals one source of an N -> 1 event may be ahead of another (an
        mbarrier counts arrivals, not who arrived; None: per-source counters).
    barrier_arrive_waits: the hardware has no arrive-only barrier, so ``arrive()`` waits
        like ``sync()`` (Ascend ``sync_block_all``).
    """

    backend: str
    event: str
    barrier: str
    event_limit: Limit | None = None
    barrier_limit: Limit | None = None
    gather_limit: Limit | None = None
    barrier_arrive_waits: bool = False

    @property
    def bounded(self) -> bool:
        """Whether some counter can overflow (leads must then be bounded)."""
        return any(x is not None for x in (self.event_limit, self.barrier_limit, self.gather_limit))


@dataclass(frozen=True)
class Placement:
    backend: str
    agents: tuple[Agent, ...]
    target: Target | None = None

    def agent_of(self, role: str) -> Agent:
        return next(a for a in self.agents if role in a.roles)

    def co_located(self, src_role: str, dst_role: str) -> bool:
        return self.agent_of(src_role) is self.agent_of(dst_role)

    def crosses(self, obj) -> bool:
        """True when a pipe/event links two different agents (needs hardware sync)."""
        return not self.co_located(obj.src, obj.dst)


def place(kernel: ir.KernelIR, backend: str) -> Placement:
    if backend not in BACKENDS:
        from xsync.errors import BackendError
        raise BackendError(f"unknown backend {backend!r}", fix=f"use one of: {', '.join(BACKENDS)}")
    module = importlib.import_module(f"xsync.backends.{backend}.placement")
    return Placement(backend, tuple(module.place(kernel)), module.TARGET)


def merge_by_replicas(roles, agent_name, hardware, unit="") -> list[Agent]:
    """One agent per distinct replica count among ``roles`` (roles merge only if equal)."""
    by_count: dict[int, list[ir.Role]] = {}
    for r in roles:
        by_count.setdefault(r.replicas, []).append(r)
    out = []
    for count, group in by_count.items():
        name = agent_name if len(by_count) == 1 else "_".join(r.name for r in group)
        out.append(Agent(name, tuple(r.name for r in group), count, hardware, unit=unit or agent_name))
    return out
