"""Ascend placement: data movement and matrix work on the cube core, vector roles on
the vector cores (replicas=2 -> the two vector cores of an AI core). A kernel without matrix
work (no ``xs.mma``, no role of kind 'matrix') that has copy roles runs vector-only: every role
on one vector core (:func:`vector_only_agent`).

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
from xsync.backends.ascend.replicas import all_exprs
from xsync.errors import FlagOverflowError
from xsync.lowering.passes import cross_agent_pipeline, subtile_replicas
from xsync.lowering.ir import RoleKind, TileOp, expr_calls
from xsync.lowering.placement import Agent, Limit, Placed, Target, Unit, merge_by_replicas, not_applicable

FLAG_MAX_PENDING = alloc.ASCEND_FLAG_MAX_PENDING

TARGET = Target(
    "ascend", event="a cross-core flag (at most 15 pending sets)", barrier="sync_block_all",
    event_limit=Limit(FLAG_MAX_PENDING, "flag overflow", FlagOverflowError,
                      f"an Ascend flag counts at most {FLAG_MAX_PENDING} pending sets", "sets"),
    barrier_arrive_waits=True, allocate=alloc.allocate, passes=(cross_agent_pipeline, subtile_replicas),
    # tl.atomic_add to GM (HIVM's atomic store); dtypes the HIVM compiler takes (docs/ascend.md)
    reduce_add_dtypes=("float32", "float16", "int32"), reduce_add="tl.atomic_add (GM atomic add)",
    # the HIVM compiler (ascendnpu-ir 1.2.0) puts a GM atomic on a vector core; of a cube-side
    # value it leaves the vector core's UB buffer unwritten (IR after hivm-split-mix-kernel)
    reduce_add_units=(Unit.VECTOR,),
    reduce_add_units_why="the HIVM compiler performs GM atomics on the vector cores and does not "
                         "bring a cube-side tile there",
    # AI cores share only GM and L2: a tile that several programs read twice stays in L2
    multicast_missing="AI cores have no multicast copy into each other's L1; the programs run "
                      "independently and the repeated reads of one tile are served by L2")


# xs.role(..., placement=) on Ascend: accepted (the source stays portable), reported, no effect
PLACEMENT_NOT_APPLICABLE = "a vector role always runs on the vector cores, apart from the cube"


def place(kernel):
    notes = not_applicable(kernel, "ascend", PLACEMENT_NOT_APPLICABLE)
    if vector_only(kernel):
        return Placed((vector_only_agent(kernel),), notes)
    cube = [r for r in kernel.roles if r.kind in (RoleKind.COPY, RoleKind.MATRIX)]
    vector = [r for r in kernel.roles if r.kind is RoleKind.VECTOR]
    agents = []
    if cube:
        serial = tuple(r.name for r in cube if r.replicas > 1)
        agents.append(Agent("cube", tuple(r.name for r in cube), 1, "cube core (AIC)", Unit.CUBE, serial))
    return Placed(tuple(agents + merge_by_replicas(vector, "vector", "vector core (AIV)", Unit.VECTOR)), notes)


def does_matrix_work(kernel) -> bool:
    """Whether the kernel calls ``xs.mma`` or declares a role of kind 'matrix'."""
    if any(r.kind is RoleKind.MATRIX for r in kernel.roles):
        return True
    return any(c.op is TileOp.MMA for e in all_exprs(kernel.body) for c in expr_calls(e))


def vector_only(kernel) -> bool:
    """A kernel of copy and vector roles without matrix work: triton-ascend compiles it
    vector-only (``mix_mode "aiv"``), where no cube core runs, so its copy roles run on the
    vector core too."""
    return any(r.kind is RoleKind.COPY for r in kernel.roles) and not does_matrix_work(kernel)


def vector_only_agent(kernel) -> Agent:
    """Every role on one vector core, in source order: each event becomes program order (no
    flag), each pipe a ring of ``stages`` slots in the GM workspace written and read in
    program order (no flag; ``memory_pipes``, so stages mean what they mean across cores) and
    replicated roles run their replicas in lockstep (``Agent.serial``), as the cube does. In ``aiv`` mode a program is one vector core, so
    replicas never sit on two cores that would exchange data through cross-core flags."""
    serial = tuple(r.name for r in kernel.roles if r.replicas > 1)
    return Agent("vector", tuple(r.name for r in kernel.roles), 1, "vector core (AIV)",
                 Unit.VECTOR, serial, memory_pipes=True)
