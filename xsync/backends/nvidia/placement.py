"""Hopper placement.

Copy roles get 1-warp producer partitions (TMA issue needs one thread): all copy roles of one
replica count share an agent, one partition per replica. Matrix and vector roles with the
same replica count share a consumer warpgroup per replica, so the S -> P hand-off of
attention stays in registers behind an MMA wait -- except a vector role placed on its own
(:func:`own_roles`, numbered rules), which gets consumer warpgroups of its own. The agents'
units (producer / consumer), not their names, decide warps and registers
(``xsync.backends.nvidia.alloc``).

Target: an event is an mbarrier waited by parity, so its waiter tells apart one pending
phase, not two; a named barrier counts the arrivals of one meeting, so a member may not
arrive for meeting k + 1 while another has not arrived for meeting k; the mbarrier of an
N -> 1 event counts arrivals, not who arrived, so no source may be two signals ahead of
another. (Pipe slots have their own full/empty mbarriers and back-pressure: a slot's
phase cannot run ahead.) Schedule passes: ``xsync.backends.nvidia.passes``.
"""
from xsync.backends.nvidia import alloc
from xsync.backends.nvidia.passes import PASSES
from xsync.errors import PhaseAliasingError
from xsync.lowering.ir import RoleKind, RolePlacement
from xsync.lowering.placement import Agent, Limit, Placed, PlacementNote, Target, Unit, merge_by_replicas

TARGET = Target(
    "nvidia", event="an mbarrier (parity wait)", barrier="a named barrier (bar.sync / bar.arrive)",
    event_limit=Limit(1, "phase aliasing", PhaseAliasingError,
                      "its mbarrier flips parity twice and the parity wait cannot tell phase k "
                      "from phase k+2", "phases"),
    barrier_limit=Limit(1, "phase aliasing", PhaseAliasingError,
                        "a hardware named barrier counts arrivals per meeting and would mix the "
                        "two meetings"),
    gather_limit=Limit(1, "phase aliasing", PhaseAliasingError,
                       "the event's mbarrier counts arrivals, not who arrived, so two signals of "
                       "one source complete a phase meant for all sources"),
    allocate=alloc.allocate, passes=PASSES,
    # TMA bulk reduce (cp.reduce.async.bulk.tensor .add) or red.global.add; Gluon's atomic_add
    # and the TMA reduce take fp32, fp16 and bf16 (and int32) on sm_90
    reduce_add_dtypes=("float32", "float16", "bfloat16", "int32"),
    reduce_add="TMA bulk reduce-add / red.global.add",
    # Gluon exposes TMA multicast and cluster-scope mbarrier arrives from Triton 3.8 only, and
    # there as one program spread over the cluster's CTAs (CGA layouts), not one per CTA:
    # xsync/backends/nvidia/cluster_ctas.py decides per kernel whether it can spell that
    multicast_missing="each program loads its own copy, which L2 serves",
    own_agent='a warpgroup of its own (`xs.role(..., placement="own")`)')


def place(kernel):
    copy = [r for r in kernel.roles if r.kind is RoleKind.COPY]
    own, notes = own_roles(kernel)
    compute = [r for r in kernel.roles if r.kind is not RoleKind.COPY and r.name not in own]
    agents = (merge_by_replicas(copy, "producer", "producer warp (1 warp, TMA)", Unit.PRODUCER)
              + merge_by_replicas(compute, "consumer", "consumer warpgroup (4 warps, wgmma)", Unit.CONSUMER))
    taken = {a.name for a in agents} | {r.name for r in kernel.roles if r.name not in own}
    for r in kernel.roles:
        if r.name in own:
            name = r.name if r.name not in taken else f"{r.name}_wg"
            agents.append(Agent(name, (r.name,), r.replicas, "consumer warpgroup (4 warps, own)",
                                Unit.CONSUMER))
    return Placed(tuple(agents), notes)


# Rule 4: the automatic rule gives a vector role its own warpgroups only while the consumer
# warpgroups stay at most 3: a CTA's warpgroups share 512 registers per thread slot (64K
# registers / 128 threads), and four consumers would get at most 120 each -- too few for a
# 128-column fp32 accumulator (placement="own" asks regardless).
MAX_AUTO_CONSUMER_WARPGROUPS = 3
OWN = "own consumer warpgroup"
ASK_MERGED = 'placement="merged" keeps it in the matrix warpgroup (hand-offs in registers, no ring)'
ASK_OWN = 'placement="own" gives it a warpgroup of its own'


def own_roles(kernel) -> tuple[set[str], tuple[PlacementNote, ...]]:
    """The vector roles that get consumer warpgroups of their own, and a note per decision.

    A vector role V whose replica count equals a matrix role's (the "partners" it would share a
    warpgroup with) runs on its own when the author asks (``placement="own"``), stays merged
    when asked (``"merged"``), and otherwise is placed on its own when all hold:

    1. a pipe from a partner to V has stages >= 2: the author asked for buffering, which only
       a separate warpgroup gives (inside one warpgroup a pipe is a register hand-off of one
       value, its stages unused); with stages == 1 V stays merged: one slot lets the partner
       run at most one hand-off ahead, and the merged hand-off costs no shared-memory ring,
       no mbarriers and no warpgroup;
    2. no pipe or event runs from V back to a partner: a round trip (attention's S -> P ->
       PV) between warpgroups would cross shared memory twice an iteration with the partner
       waiting on V; merged it stays in registers behind an MMA wait;
    3. the pipes that would then cross warpgroups fit shared memory beside the others;
    4. the consumer warpgroups stay at most MAX_AUTO_CONSUMER_WARPGROUPS.

    Then V runs a hand-off behind its partner: an epilogue overlaps the next tile's main loop.
    """
    own, notes = set(), []
    by_name = {r.name: r for r in kernel.roles}
    for v in kernel.roles:
        if v.kind is not RoleKind.VECTOR:
            continue
        partners = {r.name for r in kernel.roles if r.kind is RoleKind.MATRIX and r.replicas == v.replicas}
        if v.placement is RolePlacement.OWN:
            own.add(v.name)
            notes.append(PlacementNote(v.name, OWN, 'asked: placement="own"',
                                       ASK_MERGED if partners else ""))
            continue
        if v.placement is RolePlacement.MERGED:
            notes.append(PlacementNote(v.name, f"merged with {_names(partners)}",
                                       'asked: placement="merged"', ASK_OWN))
            continue
        if not partners:
            continue       # nothing to merge with: the vector roles of its count share warpgroups
        merged = f"merged with {_names(partners)}"
        fed = [p for p in kernel.pipes if p.src in partners and p.dst == v.name]
        buffered = [p for p in fed if p.stages >= 2]
        if not buffered:
            why = ("rule 1: " + (f"pipe{_plural(fed)} {_names(p.name for p in fed)} from "
                                 f"{_names(p.src for p in fed)} ha{'ve' if len(fed) > 1 else 's'} stages=1"
                                 if fed else f"no pipe from {_names(partners)} feeds it")
                   + ": no buffering asked, the hand-off stays in registers")
            notes.append(PlacementNote(v.name, merged, why, ASK_OWN + " (with a pipe of stages >= 2)"))
            continue
        back = [o for o in (*kernel.pipes, *kernel.events) if o.src == v.name and o.dst in partners]
        if back:
            notes.append(PlacementNote(
                v.name, merged,
                f"rule 2: it hands values back to {_names(o.dst for o in back)} "
                f"({_names(o.name for o in back)}): the round trip stays in registers",
                ASK_OWN))
            continue
        smem = _crossing_smem(kernel, by_name, own | {v.name})
        if smem > alloc.HOPPER_SMEM_BYTES:
            notes.append(PlacementNote(
                v.name, merged,
                f"rule 3: on its own its pipes would need {smem} B of shared memory "
                f"(an SM has {alloc.HOPPER_SMEM_BYTES} B)",
                ASK_OWN + " (lower stages or tile sizes first)"))
            continue
        groups = _consumer_warpgroups(kernel, own | {v.name})
        if groups > MAX_AUTO_CONSUMER_WARPGROUPS:
            notes.append(PlacementNote(
                v.name, merged,
                f"rule 4: on its own the kernel would have {groups} consumer warpgroups "
                f"(at most {MAX_AUTO_CONSUMER_WARPGROUPS} keep >= 160 registers each)", ASK_OWN))
            continue
        own.add(v.name)
        p = buffered[0]
        notes.append(PlacementNote(
            v.name, OWN,
            f"rules 1-4: pipe '{p.name}' from '{p.src}' has stages={p.stages}: it runs a hand-off "
            f"behind '{p.src}' (an epilogue overlaps the next tile's main loop)", ASK_MERGED))
    return own, tuple(notes)


def _names(names) -> str:
    return ", ".join(f"'{n}'" for n in sorted(set(names)))


def _plural(items) -> str:
    return "s" if len(items) > 1 else ""


def _agent_key(role, own: set[str]):
    """Which agent a compute role lands on: its own, or the merged one of its replica count."""
    if role.kind is RoleKind.COPY:
        return ("producer", role.replicas)
    return ("own", role.name) if role.name in own else ("consumer", role.replicas)


def _crossing_smem(kernel, by_name, own: set[str]) -> int:
    """Shared memory of the pipes crossing agents with ``own`` placed on their own (one ring
    per replica of a paired pipe, one for a broadcast)."""
    total = 0
    for p in kernel.pipes:
        src, dst = by_name[p.src], by_name[p.dst]
        if _agent_key(src, own) != _agent_key(dst, own):
            total += p.stages * p.slot_bytes * src.replicas
    return total


def _consumer_warpgroups(kernel, own: set[str]) -> int:
    keys = {(_agent_key(r, own), r.replicas) for r in kernel.roles if r.kind is not RoleKind.COPY}
    return sum(replicas for _, replicas in keys)
