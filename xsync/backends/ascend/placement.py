"""Ascend placement: data movement and matrix work on the cube core, vector roles on
the vector cores (replicas=2 -> the two vector cores of an AI core).

An AI core has one cube: cube roles with replicas run their replicas one after another
on it (e.g. the cube computes S for the rows of vector core 0, then of vector core 1).

Target: an event is a cross-core flag, a counter of at most 15 pending sets (each vector
core has its own, so an N -> 1 event counts per source); a barrier is
``sync_block_all``, which has no arrive-only form: ``arrive()`` waits like ``sync()``.
(Pipe flags never hold more than ``stages`` sets; the allocation caps stages at 15.)
Schedule pass: ``cross-agent-pipeline`` (the cube issues the next hand-off before it waits
for the vector cores' answer).
"""
from xsync.backends.ascend import alloc
from xsync.errors import FlagOverflowError
from xsync.lowering.passes import cross_agent_pipeline
from xsync.lowering.ir import RoleKind
from xsync.lowering.placement import Agent, Limit, Target, Unit, merge_by_replicas

FLAG_MAX_PENDING = alloc.ASCEND_FLAG_MAX_PENDING

TARGET = Target(
    "ascend", event="a cross-core flag (at most 15 pending sets)", barrier="sync_block_all",
    event_limit=Limit(FLAG_MAX_PENDING, "flag overflow", FlagOverflowError,
                      f"an Ascend flag counts at most {FLAG_MAX_PENDING} pending sets", "sets"),
    barrier_arrive_waits=True, allocate=alloc.allocate, passes=(cross_agent_pipeline,))


def place(kernel):
    cube = [r for r in kernel.roles if r.kind in (RoleKind.COPY, RoleKind.MATRIX)]
    vector = [r for r in kernel.roles if r.kind is RoleKind.VECTOR]
    agents = []
    if cube:
        serial = tuple(r.name for r in cube if r.replicas > 1)
        agents.append(Agent("cube", tuple(r.name for r in cube), 1, "cube core (AIC)", Unit.CUBE, serial))
    return agents + merge_by_replicas(vector, "vector", "vector core (AIV)", Unit.VECTOR)
