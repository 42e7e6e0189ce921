"""Placement: which agent (thread / warp-specialized partition / core) runs each role, and
the target facts of the hardware that runs them.

Each backend places roles onto its hardware agents (``xsync.backends.<b>.placement``, which
the backend's :meth:`xsync.backends.base.Backend.place` calls) and states, in a :class:`Target`, what its sync primitives
can count, which schedule passes it runs and how it allocates: the verifier and the
allocator ask the target ("how far may a signaller run ahead of its waiter?") instead of
branching on the backend's name. Roles placed on one agent run in source order inside it;
a pipe between two roles of one agent carries its payload in registers (one value at a
time; in a ring of ``stages`` slots where the agent has ``memory_pipes``) and needs no
cross-agent synchronization.

This module only holds the types; it imports no backend (the backends import it).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Callable

from xsync.lowering import ir


class Unit(StrEnum):
    """The kind of hardware agent an :class:`Agent` is (typed: nothing reads agent names)."""

    PRODUCER = "producer"     # Hopper: a 1-warp TMA issuer partition
    CONSUMER = "consumer"     # Hopper: a 4-warp wgmma warpgroup partition
    CUBE = "cube"             # Ascend: the cube core of an AI core
    VECTOR = "vector"         # Ascend: a vector core
    THREAD = "thread"         # CPU emulator: one thread


@dataclass(frozen=True)
class Agent:
    name: str
    roles: tuple[str, ...]
    replicas: int
    hardware: str  # what runs it, in the backend's words ("consumer warpgroup", "cube core")
    unit: Unit     # the kind of hardware agent
    serial: tuple[str, ...] = ()  # roles whose replicas this single agent runs one by one
    # pipes between its roles keep their stages: a ring in memory, used in program order
    # (Ascend vector-only kernels), instead of a register hand-off of one value
    memory_pipes: bool = False


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
    allocate: the target's allocator (``xsync.backends.<b>.alloc.allocate``).
    passes: the target's schedule passes (``xsync.lowering.passes.run`` runs them in order).
    name: what the kernel is lowered for ("nvidia", "ascend", "cpu"; backends ascend and
        ascend-sim share the target "ascend"); the one place messages read it from.
    """

    name: str
    event: str
    barrier: str
    event_limit: Limit | None = None
    barrier_limit: Limit | None = None
    gather_limit: Limit | None = None
    barrier_arrive_waits: bool = False
    # (kernel, placement, skeleton, lower_options) -> Allocation: the target's allocation module
    allocate: Callable | None = None
    # schedule passes, in order: objects with NAME and
    # run(kernel, placement, log, lower_options) -> kernel
    passes: tuple = ()
    # ``xs.store(..., reduce="add")``: the element types the target adds into (names of
    # xsync.dtypes), how it does it (messages) and whether ``deterministic=True`` is offered
    # (xsync/lowering/reduce_add.py checks them)
    reduce_add_dtypes: tuple[str, ...] = ()
    reduce_add: str = ""
    reduce_add_deterministic: bool = False
    # the units whose agents may reduce-add (None: every unit), and why the others may not
    reduce_add_units: tuple | None = None
    reduce_add_units_why: str = ""
    # a cluster's multicast pipe fields (xs.cluster): how the target delivers one tile to every
    # program of the cluster, or, where it cannot, why each program loads its own copy
    multicast: str = ""
    multicast_missing: str = "the target has no multicast copy"
    # how a role merged onto another's agent asks for an agent of its own, where the target
    # can give one ("" where roles' agents are fixed by their kind, as Ascend's cores)
    own_agent: str = ""

    @property
    def bounded(self) -> bool:
        """Whether some counter can overflow (leads must then be bounded)."""
        return any(x is not None for x in (self.event_limit, self.barrier_limit, self.gather_limit))


@dataclass(frozen=True)
class PlacementNote:
    """Why a role runs where it does, where the backend chose between placements or the
    author asked for one (``xs.role(..., placement=)``): the allocation table prints it."""

    role: str
    placement: str   # what it got ("own consumer warpgroup", "merged into 'consumer'", ...)
    reason: str      # the rule that decided
    ask: str = ""    # how to ask for the other placement

    @property
    def text(self) -> str:
        return self.reason + (f"; {self.ask}" if self.ask else "")


@dataclass(frozen=True)
class Placed:
    """What a backend's ``place(kernel)`` may return instead of a list of agents: the agents
    and the notes on its decisions."""

    agents: tuple[Agent, ...]
    notes: tuple[PlacementNote, ...] = ()


def not_applicable(kernel, target: str, why: str) -> tuple[PlacementNote, ...]:
    """Notes for the roles that ask a placement a backend does not choose (it always gives a
    vector role agents of its own): the request is accepted, the source stays portable."""
    return tuple(PlacementNote(r.name, "not applicable",
                               f"placement=\"{r.placement}\" is a Hopper choice; on {target} {why}")
                 for r in kernel.roles if r.placement is not None)


@dataclass(frozen=True)
class Placement:
    agents: tuple[Agent, ...]
    target: Target
    notes: tuple[PlacementNote, ...] = ()   # why roles run where they do (the report prints them)

    @property
    def backend(self) -> str:
        """The lowering target's name (``target.name``), as messages spell it."""
        return self.target.name

    def agent_of(self, role: str) -> Agent:
        return next(a for a in self.agents if role in a.roles)

    def agent(self, name: str) -> Agent:
        return next(a for a in self.agents if a.name == name)

    def co_located(self, src_role: str, dst_role: str) -> bool:
        return self.agent_of(src_role) is self.agent_of(dst_role)

    def crosses(self, obj) -> bool:
        """True when a pipe/event links two different agents (needs hardware sync)."""
        return not self.co_located(obj.src, obj.dst)


def merge_by_replicas(roles, agent_name: str, hardware: str, unit: Unit) -> list[Agent]:
    """One agent per distinct replica count among ``roles`` (roles merge only if equal), all
    of kind ``unit``. With one count the agent is ``agent_name``; with several, each agent is
    named after its roles (its unit, not its name, says what runs it)."""
    by_count: dict[int, list[ir.Role]] = {}
    for r in roles:
        by_count.setdefault(r.replicas, []).append(r)
    out = []
    for count, group in by_count.items():
        name = agent_name if len(by_count) == 1 else "_".join(r.name for r in group)
        out.append(Agent(name, tuple(r.name for r in group), count, hardware, unit))
    return out
