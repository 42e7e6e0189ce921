"""Ascend placement: data movement and matrix work on the cube core, vector roles on
the vector cores (replicas=2 -> the two vector cores of an AI core)."""
from xsync.lowering.placement import merge_by_replicas


def place(kernel):
    cube = [r for r in kernel.roles if r.kind in ("copy", "matrix")]
    vector = [r for r in kernel.roles if r.kind == "vector"]
    return (merge_by_replicas(cube, "cube", "cube core (AIC)")
            + merge_by_replicas(vector, "vector", "vector core (AIV)"))
