"""Ascend placement: data movement and matrix work on the cube core, vector roles on
the vector cores (replicas=2 -> the two vector cores of an AI core).

An AI core has one cube: cube roles with replicas run their replicas one after another
on it (e.g. the cube computes S for the rows of vector core 0, then of vector core 1).
"""
from xsync.lowering.placement import Agent, merge_by_replicas


def place(kernel):
    cube = [r for r in kernel.roles if r.kind in ("copy", "matrix")]
    vector = [r for r in kernel.roles if r.kind == "vector"]
    agents = []
    if cube:
        serial = tuple(r.name for r in cube if r.replicas > 1)
        agents.append(Agent("cube", tuple(r.name for r in cube), 1, "cube core (AIC)", serial))
    return agents + merge_by_replicas(vector, "vector", "vector core (AIV)")
