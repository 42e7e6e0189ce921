"""Placement: which agent (thread / warp-specialized partition / core) runs each role.

Each backend places roles onto its hardware agents (``xsync.backends.<b>.placement``).
Roles placed on one agent run in source order inside it; a pipe between two roles of
one agent carries its payload in registers and needs no cross-agent synchronization.
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


@dataclass(frozen=True)
class Placement:
    backend: str
    agents: tuple[Agent, ...]

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
    return Placement(backend, tuple(module.place(kernel)))


def merge_by_replicas(roles, agent_name, hardware) -> list[Agent]:
    """One agent per distinct replica count among ``roles`` (roles merge only if equal)."""
    by_count: dict[int, list[ir.Role]] = {}
    for r in roles:
        by_count.setdefault(r.replicas, []).append(r)
    out = []
    for count, group in by_count.items():
        name = agent_name if len(by_count) == 1 else "_".join(r.name for r in group)
        out.append(Agent(name, tuple(r.name for r in group), count, hardware))
    return out
