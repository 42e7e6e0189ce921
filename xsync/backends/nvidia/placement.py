"""Hopper placement.

Copy roles share one producer warp (TMA issue needs one thread); matrix and vector
roles with the same replica count share a consumer warpgroup per replica, so the
S -> P hand-off of attention stays in registers behind an MMA wait.
"""
from xsync.lowering.placement import merge_by_replicas


def place(kernel):
    copy = [r for r in kernel.roles if r.kind == "copy"]
    compute = [r for r in kernel.roles if r.kind != "copy"]
    return (merge_by_replicas(copy, "producer", "producer warp (1 warp, TMA)")
            + merge_by_replicas(compute, "consumer", "consumer warpgroup (4 warps, wgmma)"))
