"""Hopper placement.

Copy roles get 1-warp producer partitions (TMA issue needs one thread): all copy roles of one
replica count share an agent, one partition per replica. Matrix and vector roles with the
same replica count share a consumer warpgroup per replica, so the S -> P hand-off of
attention stays in registers behind an MMA wait. The agents' units (producer / consumer),
not their names, decide warps and registers (``xsync.backends.nvidia.alloc``).

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
from xsync.lowering.ir import RoleKind
from xsync.lowering.placement import Limit, Target, Unit, merge_by_replicas

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
    reduce_add="TMA bulk reduce-add / red.global.add")


def place(kernel):
    copy = [r for r in kernel.roles if r.kind is RoleKind.COPY]
    compute = [r for r in kernel.roles if r.kind is not RoleKind.COPY]
    return (merge_by_replicas(copy, "producer", "producer warp (1 warp, TMA)", Unit.PRODUCER)
            + merge_by_replicas(compute, "consumer", "consumer warpgroup (4 warps, wgmma)", Unit.CONSUMER))
