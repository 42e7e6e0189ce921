"""Ascend core and replica analysis: what the renderer needs decided before it spells.

:func:`analyze` runs after allocation and before :mod:`xsync.backends.ascend.render`. It decides
which core each role runs on, which agents run their replicas in lockstep (the 3.2.0 fallback
described below), which ``sync_block_all`` mode each barrier is spelled with, and
rejects what the chosen source form cannot express. The renderer receives the result as a
:class:`ReplicaAnalysis` and only spells it.

Rules, checked in this order (each a :class:`~xsync.errors.BackendError` with a fix):

1. Cross-core links. A pipe or event whose ends sit on different agents must link the cube and
   the vector side: Ascend flags only run cube -> vector or vector -> cube (so an N -> 1 pipe
   between vector roles, vector replicas -> one vector role, is refused here).
2. Cube work. A kernel that synchronizes cube and vector cores (a cross-core pipe or event, or a
   barrier spelled ``all`` / ``all_cube``) must call ``xs.mma``: triton-ascend compiles a kernel
   without ``tl.dot`` vector-only (``mix_mode "aiv"``) and the vector side would wait forever.
   (Copy and vector roles without matrix work never get here: the placement puts them all on one
   vector core, ``xsync.backends.ascend.placement.vector_only``; what remains is a role of kind
   'matrix' that calls no ``xs.mma``.)
3. Cube producers (release form only). 3.2.0 places work that does not feed or drain a
   ``tl.dot`` on the vector core, so every slot write of a cube -> vector cross-core pipe must be
   computed by ``xs.mma`` (an mma-taint dataflow over the kernel's assignments).
4. Lockstep. In an agent whose replicas run in lockstep, a loop or branch that holds a sync verb
   must not depend on ``xs.replica_id()`` (directly or through a name computed from it: a
   replica-taint dataflow): every replica must reach each sync point together.
5. Workspace tiles. A field that crosses cores through a GM workspace ring is a 1-D or 2-D tile
   whose dimensions are powers of two (``tl.arange`` spells its addresses).

Replicas without ``sub_vec_id`` (the 3.2.0 fallback)
---------------------------------------------------
Hardware model (docs/design.md §4): an AI core is 1 cube + 2 vector cores; a flag is a counter
(set +1, wait blocks until > 0 then -1); a cube-side set reaches BOTH vector cores; a
cube-side wait on a vector->cube flag completes only when BOTH vector cores have set.
In 3.2.0 both vector cores run the same vector code and cannot tell themselves apart.

Fallback: each vector core runs the statements of EVERY replica, in lockstep. Inside a
role block the statements between two sync points are emitted once per replica with
``xs.replica_id()`` replaced by the constant r and replica-local names suffixed
(``x_r0``, ``x_r1``); each sync point is emitted ONCE per core:

* cube -> vector FULL/event: the cube sets once per commit, each vector core receives
  one count and waits exactly once (not once per replica, which would hang);
* vector -> cube EMPTY/event: each vector core sets once after all its replicas have
  released/signalled; the cube waits once and the hardware completes it when both
  cores have set -- exactly the "all replicas released" condition of the protocol;
* barriers among the replicas are met by program order; the allocated
  ``sync_block_all`` is still emitted once per meeting (it also orders the two cores).

The two vector cores thus compute the same results redundantly and store identical
values (benign). Replicas=1 vector roles run the same way (both cores run them, both
set, the cube's wait needs both). Counting stays exact because every core performs the
same sequence of sets and waits as a single replica would.

The same lockstep renders cube roles with replicas > 1 (``Agent.serial``: the one cube
core computes for every replica, e.g. S and PV for both vector cores in attention):
the cube waits on a vector->cube flag once (that one wait already needs both vector
cores' sets, so a second wait for "replica 1" would consume the NEXT round and hang)
and sets a cube->vector flag once after every replica has written its slot (a set per
replica would give each vector core two counts per round). N -> N pipes keep one ring
per replica (``WorkspaceRing.rings``). Lockstep, not whole-block serial order, is what
makes this safe: deferring replica 0's set to the end of replica 1's block could
deadlock when replica 0 waits later in the same block on work that needs that set.
Limits: a sync verb under a branch or loop
whose condition/bound depends on ``xs.replica_id()`` cannot be put in lockstep and is
rejected (use the scope form). In the scope form, vector replicas=2 map one replica per
vector core (``replica_id = al.sub_vec_id()``) and every replica performs its own sync
ops, which matches the same hardware counting; other replica counts use the lockstep.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from xsync.errors import BackendError
from xsync.lowering import ir
from xsync.lowering.alloc import Allocation
from xsync.lowering.placement import Agent, Placement, Unit
from xsync.lowering.slicing import slice_agent

FORMS = ("release", "scope")


class Core(StrEnum):
    """The kind of core of an Ascend AI core a role runs on."""

    CUBE = "cube"       # AIC: matrix work, fed and drained by the copy roles
    VECTOR = "vector"   # AIV: elementwise work (two per AI core)


def core_of_kind(kind: ir.RoleKind) -> Core:
    """The core a role of ``kind`` runs on in a kernel with matrix work (vector-only kernels
    put every role on a vector core: :func:`core_of_role`)."""
    return Core.CUBE if kind in (ir.RoleKind.COPY, ir.RoleKind.MATRIX) else Core.VECTOR


def core_of_role(placement: Placement, role: str) -> Core:
    """The core ``role`` runs on: the unit of its agent in ``placement``."""
    return Core.CUBE if placement.agent_of(role).unit is Unit.CUBE else Core.VECTOR


@dataclass(frozen=True)
class AgentPlan:
    """How one agent's replicas run on its core.

    ``unroll``: every replica of the agent runs on this core in lockstep (``xs.replica_id()``
    unrolled); ``serial``: roles with replicas > 1 whose replicas the one cube core computes;
    ``sub_vec_id``: two vector replicas, one per vector core (the scope form)."""

    agent: str
    core: Core
    replicas: int
    unroll: bool
    serial: tuple[str, ...]
    sub_vec_id: bool

    def reps(self, role: str, role_replicas: int) -> list:
        """Replicas of ``role`` (which has ``role_replicas``) this core emits in lockstep
        ([None]: one instance, not unrolled)."""
        if role in self.serial and role_replicas > 1:
            return list(range(role_replicas))   # the one cube core computes for every replica
        if self.unroll:
            return list(range(self.replicas))
        return [None]


@dataclass(frozen=True)
class ReplicaAnalysis:
    """The result of :func:`analyze`, handed to the renderer."""

    form: str
    cores: dict[str, Core]               # role -> core
    barrier_modes: dict[str, str]        # barrier -> sync_block_all mode as this form spells it
    agents: dict[str, AgentPlan]         # agent name -> plan
    replica_tainted: frozenset[str]      # names whose value depends on xs.replica_id()

    def core(self, role: str) -> Core:
        return self.cores[role]


def check_form(form: str) -> None:
    if form not in FORMS:
        raise BackendError(f"unknown Ascend source form {form!r}",
                           fix=f"use one of: {', '.join(FORMS)} (or XSYNC_ASCEND_FORM)")


def analyze(kernel: ir.KernelIR, placement: Placement, allocation: Allocation,
            form: str = "release") -> ReplicaAnalysis:
    """Decide cores, lockstep and barrier spellings; check rules 1-5 (module docstring)."""
    check_form(form)
    cores = {r.name: core_of_role(placement, r.name) for r in kernel.roles}
    modes = {b.name: barrier_mode(allocation.block_barrier(b.name).mode, form)
             for b in kernel.barriers}
    agents = {a.name: plan_agent(kernel, a, cores, form) for a in placement.agents}
    result = ReplicaAnalysis(form, cores, modes, agents,
                             frozenset(taint(kernel.body, (ir.TileOp.REPLICA_ID,))))
    check_cross_core_links(kernel, placement, result)
    check_cube_work(kernel, placement, result)
    if form == "release":
        check_cube_producers(kernel, placement, result)
    agent_order = sorted(placement.agents, key=lambda a: result.agents[a.name].core != Core.CUBE)
    for agent in agent_order:
        check_lockstep(kernel, agent, result)
    check_workspace_tiles(kernel, placement)
    return result


def barrier_mode(mode: str, form: str) -> str:
    # A barrier's members are roles of one program: among vector roles that is the two
    # vector cores of one AI core, which the scope form can say; 3.2.0 has only the
    # grid-wide all_vector (hence the residency check at launch).
    return "all_sub_vector" if mode == "all_vector" and form == "scope" else mode


def plan_agent(kernel: ir.KernelIR, agent: Agent, cores: dict[str, Core], form: str) -> AgentPlan:
    core = cores[agent.roles[0]]
    unroll = agent.replicas > 1 and not (form == "scope" and core == Core.VECTOR
                                          and agent.replicas == 2)
    serial = tuple(r for r in getattr(agent, "serial", ()) if kernel.role(r).replicas > 1)
    return AgentPlan(agent.name, core, agent.replicas, unroll, serial, agent.replicas == 2 and not unroll)


# ---------------------------------------------------------------- dataflow
def taint(body, sources: tuple[ir.TileOp, ...]) -> set[str]:
    """Names assigned (transitively) from a call of one of ``sources``: a fixed point over every
    assignment of ``body``."""
    tainted: set[str] = set()
    assigns = [s for s in ir.walk(body) if isinstance(s, ir.Assign)]
    changed = True
    while changed:
        changed = False
        for s in assigns:
            if set(s.targets) <= tainted:
                continue
            if any(c.op in sources for c in ir.expr_calls(s.value)) or \
                    ir.expr_names(s.value) & tainted:
                tainted |= set(s.targets)
                changed = True
    return tainted


def replica_dependence(s, tainted: frozenset[str]) -> set[str]:
    """What makes the header of loop/branch ``s`` depend on the replica (empty: nothing)."""
    exprs = [s.start, s.stop, s.step] if isinstance(s, ir.For) else [s.cond]
    dep = set()
    for e in exprs:
        if any(c.op is ir.TileOp.REPLICA_ID for c in ir.expr_calls(e)):
            dep.add("xs.replica_id()")
        dep |= ir.expr_names(e) & tainted
    return dep


def has_sync(s) -> bool:
    if isinstance(s, ir.SyncOp):
        return True
    return any(isinstance(x, ir.SyncOp) for x in ir.walk([s]))


def all_exprs(stmts):
    for s in ir.walk(stmts):
        if isinstance(s, (ir.Assign, ir.SlotWrite)):
            yield s.value
        elif isinstance(s, ir.Store):
            yield s.value
            yield from s.offsets + (getattr(s, "bounds", None) or ())
        elif isinstance(s, ir.For):
            yield from (s.start, s.stop, s.step)
        elif isinstance(s, ir.If):
            yield s.cond


# ---------------------------------------------------------------- rules
def check_cross_core_links(k: ir.KernelIR, placement: Placement, a: ReplicaAnalysis) -> None:
    """Rule 1."""
    for o in k.pipes + k.events:
        if placement.crosses(o) and a.core(o.src) == a.core(o.dst):
            raise BackendError(
                f"{type(o).__name__.lower()} '{o.name}' links roles '{o.src}' and '{o.dst}', which "
                f"sit on different {a.core(o.src)} agents (different replica counts); Ascend "
                f"flags only run cube -> vector or vector -> cube",
                loc=o.loc, objects=(o.name, o.src, o.dst),
                fix=("on Ascend an N -> 1 pipe runs between the cube and the vector cores: "
                     "gather matrix replicas into one vector role (cube -> vector) or vector "
                     "replicas into one matrix role (vector -> cube)"
                     if isinstance(o, ir.Pipe) and _gathers(k, o) else
                     "give both roles the same replicas so they share one agent (program order)"))


def _gathers(k: ir.KernelIR, pipe: ir.Pipe) -> bool:
    return k.role(pipe.src).replicas > 1 and k.role(pipe.dst).replicas == 1


def check_cube_work(k: ir.KernelIR, placement: Placement, a: ReplicaAnalysis) -> None:
    """Rule 2."""
    crossing = [o for o in k.pipes + k.events if placement.crosses(o)]
    has_mma = any(c.op is ir.TileOp.MMA for e in all_exprs(k.body) for c in ir.expr_calls(e))
    cube_barriers = [b for b in k.barriers if a.barrier_modes[b.name] in ("all", "all_cube")]
    if (crossing or cube_barriers) and not has_mma:
        objs = crossing + cube_barriers
        listing = ", ".join(
            f"{o.name} ({a.core(o.src)} -> {a.core(o.dst)})" if not isinstance(o, ir.Barrier)
            else f"{o.name} (sync_block_all {a.barrier_modes[o.name]})" for o in objs)
        raise BackendError(
            f"kernel '{k.name}' synchronizes cube and vector cores but does no matrix work: "
            f"triton-ascend compiles a kernel without tl.dot as vector-only (mix_mode \"aiv\"), "
            f"so no cube core runs the cube side and the vector side would wait forever",
            loc=objs[0].loc, objects=tuple(o.name for o in objs),
            details=f"cross-core sync: {listing}",
            fix=("do the matrix work (xs.mma) in the role of kind 'matrix', or give that role kind "
                 "'copy' or 'vector': a kernel without matrix roles and without xs.mma runs "
                 "vector-only, every role on one vector core in source order"))


def check_cube_producers(k: ir.KernelIR, placement: Placement, a: ReplicaAnalysis) -> None:
    """Rule 3: 3.2.0 places non-dot work on the vector core: cube->vector payloads must come
    from mma."""
    mma_ops = (ir.TileOp.MMA, ir.TileOp.MMA_WAIT)
    tainted = taint(k.body, mma_ops)
    for s in ir.walk(k.body):
        if not isinstance(s, ir.SlotWrite):
            continue
        p = k.sync_object(s.pipe)
        if not placement.crosses(p) or a.core(p.src) != Core.CUBE:
            continue
        v = s.value
        if any(c.op in mma_ops for c in ir.expr_calls(v)) or ir.expr_names(v) & tainted:
            continue
        raise BackendError(
            f"pipe '{p.name}' carries field '{s.field}' from cube role '{p.src}' to vector role "
            f"'{p.dst}', but the value is not computed by xs.mma: triton-ascend 3.2.0 (no core "
            f"scopes) runs such loads/elementwise work on the vector core while the pipe's flag is "
            f"set by the cube, a race",
            loc=s.loc, objects=(p.name, p.src, p.dst),
            fix=("load the tile in the vector role itself (xs.load there), or make the producer a "
                 "role of kind 'vector'; triton-ascend >= 3.2.1 (al.scope, XSYNC_ASCEND_FORM=scope) "
                 "pins code to a core and lifts this limit"))


def check_lockstep(k: ir.KernelIR, agent: Agent, a: ReplicaAnalysis) -> None:
    """Rule 4, over the agent's statements in the order the renderer emits them."""
    plan = a.agents[agent.name]

    def block(stmts):
        for s in stmts:
            if isinstance(s, ir.RoleBlock):
                if plan.reps(s.role, k.role(s.role).replicas) != [None]:
                    lockstep(s.body)
            elif isinstance(s, ir.For):
                block(s.body)
            elif isinstance(s, ir.If):
                block(s.body)
                block(s.orelse)

    def lockstep(stmts):
        for s in stmts:
            if not has_sync(s) or isinstance(s, ir.SyncOp):
                continue
            dep = replica_dependence(s, a.replica_tainted) if isinstance(s, ir.For) or (
                isinstance(s, ir.If) and ir.constant_test(k, s.cond) is None) else None
            if dep:
                raise BackendError(
                    f"a sync verb sits under a {'loop' if isinstance(s, ir.For) else 'branch'} that "
                    f"depends on xs.replica_id(); without sub_vec_id (triton-ascend 3.2.0) the "
                    f"replicas of one core run in lockstep and must reach every sync point together",
                    loc=s.loc, objects=tuple(sorted(dep)),
                    fix="move the sync verb out of the replica-dependent branch (branch only the "
                        "work), or use triton-ascend >= 3.2.1 (XSYNC_ASCEND_FORM=scope)")
            if isinstance(s, ir.For):
                lockstep(s.body)
            elif isinstance(s, ir.If):
                lockstep(ir.taken_arms(k, s))

    block(slice_agent(k.body, agent.roles))


def check_workspace_tiles(k: ir.KernelIR, placement: Placement) -> None:
    """Rule 5: every field a GM ring carries (written by a slot write or loaded by a wait)."""
    used: list[tuple[ir.Pipe, str]] = []
    for s in ir.walk(k.body):
        if isinstance(s, ir.SlotWrite):
            p = k.sync_object(s.pipe)
            if placement.crosses(p):
                used.append((p, s.field))
        elif isinstance(s, ir.SyncOp) and s.verb is ir.Verb.WAIT:
            p = k.sync_object(s.obj)
            if isinstance(p, ir.Pipe) and placement.crosses(p):
                used += [(p, f.name) for f in p.fields]
    for pipe, field in used:
        spec = pipe.field(field)
        if len(spec.shape) not in (1, 2):
            raise BackendError(f"pipe '{pipe.name}' field '{field}' has shape {list(spec.shape)}; the "
                               f"Ascend workspace ring holds 1-D or 2-D tiles", loc=pipe.loc,
                               objects=(pipe.name,))
        for d in spec.shape:
            if d & (d - 1):
                raise BackendError(f"pipe '{pipe.name}' field '{field}' has shape {list(spec.shape)}; "
                                   f"tile dimensions must be powers of two (tl.arange)",
                                   loc=pipe.loc, objects=(pipe.name,))
