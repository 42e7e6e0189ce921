"""Frontend, placement and allocation of the example kernels on every backend."""
import re

import pytest

from xsync.kernels.gemm import gemm
from xsync.kernels.gemm_softmax import gemm_softmax
from xsync.lowering import ir
from xsync.lowering.slicing import slice_agent


def test_frontend_builds_ir():
    k = gemm.lower("cpu").kernel
    assert [r.name for r in k.roles] == ["load", "mma"]
    (p,) = k.pipes
    assert (p.src, p.dst, p.stages) == ("load", "mma", 3)
    assert [(f.name, f.shape, f.dtype.name) for f in p.fields] == [
        ("a", (128, 64), "bfloat16"), ("b", (64, 128), "bfloat16")]
    verbs = [s.verb for s in ir.walk(k.body) if isinstance(s, ir.SyncOp)]
    assert verbs == ["acquire", "commit", "wait", "release"]


def test_placements():
    assert [(a.name, a.roles) for a in gemm.lower("nvidia").placement.agents] == [
        ("producer", ("load",)), ("consumer", ("mma",))]
    assert [(a.name, a.roles) for a in gemm.lower("ascend").placement.agents] == [
        ("cube", ("load", "mma"))]
    agents = gemm_softmax.lower("ascend").placement.agents
    assert [(a.name, a.roles, a.replicas) for a in agents] == [
        ("cube", ("load", "mma"), 1), ("vector", ("epilogue",), 2)]


def test_nvidia_allocation_table():
    alloc = gemm_softmax.lower("nvidia").allocation
    table = alloc.table()
    assert "mbarrier[2] count=1, expect 16384 B (TMA)" in table        # tiles: TMA completion
    assert "mbarrier[2] count=2" in table                              # scores: 2 consumers release
    assert "parity (i // stages) & 1" in table
    assert dict(alloc.barrier_ids)["team"] == 15                       # above the compiler's IDs
    assert "256 threads" in table
    assert [p.label for p in alloc.partitions] == ["mma", "epilogue[0]", "epilogue[1]", "producer"]


def test_ascend_allocation_table():
    alloc = gemm_softmax.lower("ascend").allocation
    ids = dict(alloc.event_ids)
    assert ids == {"scores:full": 0, "scores:empty": 1, "team": 2}
    table = alloc.table()
    assert "flag 0 (cube -> vector)" in table and "flag 1 (vector -> cube)" in table
    assert "mode all_vector" in table
    assert alloc.workspace_bytes == 2 * 16 * 1024
    assert re.search(r"tiles\s+same core", table)


def test_slicing_drops_other_roles_and_dead_code():
    k = gemm_softmax.lower("cpu").kernel
    load_body = slice_agent(k.body, ("load",))
    roles = {s.role for s in ir.walk(load_body) if isinstance(s, ir.RoleBlock)}
    assert roles == {"load"}
    assigned = {t for s in ir.walk(load_body) if isinstance(s, ir.Assign) for t in s.targets}
    assert {"off_m", "off_n"} <= assigned
    mma_body = slice_agent(k.body, ("mma",))
    assigned = {t for s in ir.walk(mma_body) if isinstance(s, ir.Assign) for t in s.targets}
    assert "off_m" not in assigned and "off_n" not in assigned   # replicated but unused: dropped


@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
def test_examples_verify_on_every_backend(backend):
    for kernel in (gemm, gemm_softmax):
        report = kernel.lower(backend).report
        assert report.complete and report.states > 0
